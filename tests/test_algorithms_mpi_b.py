"""Every algorithm of this branch gives the same model on 1 and 2 ranks (ARCHITECTURE.md seam 3).

One ``mpiexec -n 2`` launch runs all configs (tests/_mpi_model_b.py); each is compared with the
same config run in this process. Partial participation (3 of 6 clients) puts participants on both
ranks and leaves owner-rank memories idle in some rounds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _ls_b import config

import fedrun

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")

ALGORITHMS = {
    "fedavgm": {"name": "fedavgm"},
    "fedadam": {"name": "fedadam", "global_lr": 0.05},
    "fedyogi": {"name": "fedyogi", "global_lr": 0.05, "bias_correction": True},
    "fedadagrad": {"name": "fedadagrad", "global_lr": 0.05},
    "fedadamom": {"name": "fedadamom"},
    "mifa_code": {"name": "mifa"},
    "mifa_paper_wait": {"name": "mifa", "form": "paper", "wait_all": True},
    "fedvarp": {"name": "fedvarp"},
    "fedau": {"name": "fedau", "cutoff": 2},
    "fedawe": {"name": "fedawe"},
    "fedawe_noclip": {"name": "fedawe", "clip": None},
}


@pytest.mark.mpi
@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")
def test_one_and_two_ranks_agree(tmp_path):
    configs = {key: config(algo, rounds=8, steps=3, lr=0.2, pattern="uniform")
               for key, algo in ALGORITHMS.items()}
    (tmp_path / "configs.json").write_text(json.dumps(configs))
    out = tmp_path / "x.npz"
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(ROOT / "tests" / "_mpi_model_b.py"),
                           str(tmp_path / "configs.json"), str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = np.load(out)
    for key, cfg in configs.items():
        one = fedrun.run(cfg, write_files=False).x
        assert np.abs(two[key] - one).max() < 1e-10, key
        assert np.abs(one).max() > 1e-3, key  # the run moved away from x0 = 0
