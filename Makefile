# Two commands do all the set-up on a fresh machine:  make demo  and  make test
# The virtual environment is created on first use. TORCH pins the CPU build that these machines
# install from local disk; GPU users install their CUDA build of torch into .venv first (make keeps it).
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
BIN := $(abspath $(VENV)/bin)
RANKS ?= 2
PYTEST_ARGS ?=
# pytest-xdist workers; the tests of the one local Slurm cluster share a worker (tests/conftest.py)
TEST_WORKERS ?= 2

.PHONY: demo test lint venv clean

venv: $(VENV)/.installed

# one line per step and pip's own progress: the first install takes minutes
$(VENV)/.installed: setup.cfg pyproject.toml
	@echo "make: step 1/4: the virtual environment $(VENV)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "make: step 2/4: pip itself"
	$(PY) -m pip install --progress-bar on --upgrade pip
	@echo "make: step 3/4: torch ($(TORCH), kept when one is installed)"
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --progress-bar on "$(TORCH)"
	@echo "make: step 4/4: fedrun and its extras (mpich, test, tensorboard, mlflow)"
	$(PY) -m pip install --progress-bar on -e ".[mpich,test,tensorboard,mlflow]"
	touch $@

# run it again: it says the run is finished (or resumes a stopped one); DEMO_ARGS adds overrides, e.g. run.dir=...
# the launcher ignores SIGHUP (a closed terminal), so that the ranks, which get it too, stop after the round
# with a checkpoint (docs/reliability.md); without the trap mpiexec.gforker dies of it and leaves them running
DEMO_ARGS ?=
demo: venv
	trap '' HUP; PATH="$(BIN):$$PATH" OMP_NUM_THREADS=1 UCX_NET_DEVICES=lo mpiexec.gforker -n $(RANKS) $(PY) -m fedrun train \
		--config configs/quickstart.yaml --resume auto $(DEMO_ARGS)

test: venv
	PATH="$(BIN):$$PATH" OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs .pytest_cache
