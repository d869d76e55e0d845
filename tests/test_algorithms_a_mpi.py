"""FedSUM family, SCAFFOLD and FAdamGC give the same model on 1 and 2 real MPI ranks (to 1e-10)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from lsq_helpers import lsq_config, run_single

REPO = Path(__file__).resolve().parents[1]

CASES = {
    "fedsum_b": ("fedsum_b", {}),
    "fedsum": ("fedsum", {}),
    "fedsum_cr_cumulative": ("fedsum_cr", {"cr_form": "cumulative"}),
    "fedsum_cr_constant": ("fedsum_cr", {"cr_form": "constant"}),
    "scaffold": ("scaffold", {}),
    "scaffold_single_uplink": ("scaffold", {"form": "single_uplink"}),
    "fadamgc": ("fadamgc", {}),
    "fadamgc_persist": ("fadamgc", {"persist_moments": True}),
}
COMMON = ("run.rounds=12", "local.steps=3", "local.lr_schedule=inv_sqrt", "participation.pattern=uniform",
          "participation.clients_per_round=3")


def config(name: str) -> dict:
    algorithm, hp = CASES[name]
    lr = "local.lr=0.05" if algorithm == "fadamgc" else "local.lr=0.2"
    return lsq_config(algorithm, *COMMON, lr, global_lr=0.9, **hp)


def mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.skip("mpiexec not found")
    return found


@pytest.mark.mpi
def test_one_and_two_ranks_agree(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({name: config(name) for name in CASES}))
    out = tmp_path / "x.npz"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([mpiexec(), "-n", "2", sys.executable, str(REPO / "tests" / "mpi_run_model.py"),
                           str(out), str(spec)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    two = np.load(out)
    for name in CASES:
        one = run_single(config(name)).x
        np.testing.assert_allclose(two[name], one, rtol=0, atol=1e-10, err_msg=name)
        assert np.abs(one).max() > 0.1  # the run moved
