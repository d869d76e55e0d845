"""The same run on 1, 2 and 3 real MPI ranks gives the same final model (docs/design.md)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import final_model, final_models

pytestmark = pytest.mark.mpi


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("setup", [
    # vectorized block training of a linear model on synthetic features
    ["data.name=synthetic", "data.synthetic.shape=[16]", "data.synthetic.examples_per_client=20",
     "model.name=logistic", "local.strategy=vmap"],
    # sequential training of the FedSUM paper's MNIST CNN (dropout streams per client) on embedded MNIST
    ["data.name=mnist5k", "model.name=cnn_mnist", "local.strategy=sequential", "local.steps=3"],
], ids=["logistic-vmap", "cnn-sequential"])
def test_one_two_three_ranks_agree(tmp_path, setup):
    overrides = [*setup, "data.num_clients=10", "participation.clients_per_round=7", "run.rounds=4",
                 "eval.every=0", "local.batch_size=8", "data.partition=dirichlet"]
    one = final_models(0, tmp_path, {"trained": overrides, "init": [*overrides, "local.lr=0"]})
    x1 = one["trained"]
    x2 = final_model(2, tmp_path, overrides)
    x3 = final_model(3, tmp_path, overrides)  # 10 clients: blocks of unequal size
    assert x1.dtype == np.float32
    assert _rel(x2, x1) < 1e-6
    assert _rel(x3, x1) < 1e-6
    assert _rel(x1, one["init"]) > 1e-3  # training moved the model: the comparison is not vacuous
