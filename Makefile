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

.PHONY: demo test lint venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[mpich,test,tensorboard,mlflow]"
	touch $@

# run it again: it says the run is finished (or resumes a stopped one); DEMO_ARGS adds overrides, e.g. run.dir=...
DEMO_ARGS ?=
demo: venv
	PATH="$(BIN):$$PATH" OMP_NUM_THREADS=1 UCX_NET_DEVICES=lo mpiexec.gforker -n $(RANKS) $(PY) -m fedrun train --config configs/quickstart.yaml \
		--resume auto $(DEMO_ARGS)

test: venv
	PATH="$(BIN):$$PATH" OMP_NUM_THREADS=1 $(PY) -m pytest -q $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs .pytest_cache
