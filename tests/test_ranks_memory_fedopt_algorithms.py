"""Every algorithm of this branch gives the same model on 1 and 2 ranks (docs/design.md).

One ``mpiexec -n 2`` launch runs all configs (helpers.final_models); each is compared with the
same config run in this process. Partial participation (3 of 6 clients) puts participants on both
ranks and leaves owner-rank memories idle in some rounds.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import config, final_models, run_single

B = ("run.seed=3", "local.lr=0.2")  # the least-squares instance and local lr of the algos-b tests

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
def test_one_and_two_ranks_agree(tmp_path):
    configs = {key: config(algo, *B, "run.rounds=8", "local.steps=3", "participation.pattern=uniform")
               for key, algo in ALGORITHMS.items()}
    two = final_models(2, tmp_path, configs)
    for key, cfg in configs.items():
        one = run_single(cfg).x
        assert np.abs(two[key] - one).max() < 1e-10, key
        assert np.abs(one).max() > 1e-3, key  # the run moved away from x0 = 0
