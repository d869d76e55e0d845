"""FedSUM family, SCAFFOLD and FAdamGC give the same model on 1 and 2 real MPI ranks (to 1e-10)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import config, final_models, run_single

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


def case_config(name: str) -> dict:
    algorithm, hp = CASES[name]
    lr = "local.lr=0.05" if algorithm == "fadamgc" else "local.lr=0.2"
    return config(algorithm, *COMMON, lr, global_lr=0.9, **hp)


@pytest.mark.mpi
def test_one_and_two_ranks_agree(tmp_path):
    two = final_models(2, tmp_path, {name: case_config(name) for name in CASES}, timeout=300)
    for name in CASES:
        one = run_single(case_config(name)).x
        np.testing.assert_allclose(two[name], one, rtol=0, atol=1e-10, err_msg=name)
        assert np.abs(one).max() > 0.1  # the run moved
