"""Every registered algorithm trains on the embedded MNIST digits on 2 real ranks (one mpiexec launch)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import final_models

from fedrun.algorithms import ALGORITHMS

pytestmark = pytest.mark.mpi

BASE = ["data.name=mnist5k", "data.num_clients=20", "model.name=logistic", "run.rounds=3", "eval.every=0",
        "participation.clients_per_round=6", "local.steps=2", "local.batch_size=16", "local.strategy=vmap"]


def test_every_algorithm_runs_on_two_ranks(tmp_path):
    configs = {name: [*BASE, f"algorithm.name={name}"] for name in sorted(ALGORITHMS)}
    configs["initial"] = [*BASE, "local.lr=0", "run.rounds=1"]
    models = final_models(2, tmp_path, configs, timeout=480)
    initial = models.pop("initial")
    assert len(models) == len(ALGORITHMS) >= 18
    for name, x in models.items():
        assert np.isfinite(x).all(), name
        assert np.abs(x - initial).max() > 1e-6, f"{name} did not move the model"
