"""The same run on 1, 2 and 3 real MPI ranks gives the same final model (docs/design.md); the collectives'
backend follows where the ranks run (docs/clusters.md, "Several ranks per GPU")."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import REPO, child_env, final_model, final_models, mpiexec

from fedrun.runtime.world import collective_backend


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.mpi
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


@pytest.mark.parametrize("devices, backend, why", [
    (["a cpu", "a cpu"], "gloo", "the ranks run on CPUs"),
    (["a cuda-1", "a cuda-2", "b cuda-1"], "nccl", "every rank has a GPU of its own"),  # the same index, two hosts
    (["a cuda-1", "a cuda-2", "a cuda-1"], "gloo", "ranks 0 and 2 share one GPU (a cuda-1)"),  # 3 ranks, 2 GPUs
    (["a cuda:0", "a cuda:0"], "gloo", "ranks 0 and 1 share one GPU"),  # 2 ranks on one GPU (no UUID)
    (["a cuda-1", "b cpu"], "gloo", "rank 1 runs on a CPU"),  # NCCL needs a GPU on every rank
])
def test_backend_follows_the_ranks_devices(devices, backend, why):
    """NCCL only when every rank has a GPU of its own; gloo on host buffers otherwise (two NCCL ranks on one
    GPU fail with "invalid usage")."""
    chosen, reason = collective_backend(devices)
    assert chosen == backend and why in reason and reason.startswith(backend)


@pytest.mark.mpi
def test_two_ranks_on_host_buffers_equal_one_rank_bit_for_bit(tmp_path):
    """The path several ranks on one GPU take (gloo, every collective on a host buffer) gives one rank's model
    bit for bit, for the GPU's default block (batched) and for one client at a time (sequential, dropout)."""
    base = ["data.name=synthetic", "data.num_clients=7", "participation.clients_per_round=5", "run.rounds=3",
            "eval.every=0", "local.batch_size=4", "local.steps=2", "data.synthetic.examples_per_client=8"]
    configs = {
        "batched": [*base, "data.synthetic.shape=[16]", "model.name=logistic", "local.strategy=batched"],
        "sequential": [*base, "data.synthetic.shape=[1,28,28]", "model.name=cnn_mnist", "local.strategy=sequential"],
    }
    one, two = final_models(0, tmp_path, configs), final_models(2, tmp_path, configs)
    for name in configs:
        np.testing.assert_array_equal(two[name], one[name])


@pytest.mark.mpi
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_a_rank_without_its_device_stops_every_rank_with_one_line(tmp_path):
    """run.device=cuda where no GPU is visible: every rank stops at once with the one line (exit 2, no
    traceback, no run directory) instead of waiting for its peers until run.timeout_s. With no GPU at all the
    refusal comes before the rendezvous, on every rank alike (fedrun.preflight); a rank that alone cannot get
    its device is refused after the ranks meet, naming the rank (fedrun.runtime.world), which needs a machine
    with GPUs to show."""
    proc = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "fedrun", "train", "--quiet", "run.rounds=1",
                           "run.device=cuda", "run.timeout_s=60", f"run.dir={tmp_path / 'run'}"], env=child_env(),
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("fedrun: error: run.device=cuda: no CUDA device is visible"), lines
    assert not (tmp_path / "run").exists()
