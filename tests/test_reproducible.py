"""Reproducible by construction (docs/design.md): every sum over clients is exact, so a run gives the same
bits on 1, 2 and 3 real ranks, with either placement, for every algorithm; a run resumed on fewer ranks
continues the uninterrupted run bit for bit; ``fedrun compare`` says so, or where two runs part."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import final_models, metrics, run_ranks

from fedrun.algorithms import ALGORITHMS

pytestmark = pytest.mark.mpi

# the quickstart (its FedAvg replaced by each algorithm): the MNIST CNN in float32 with 10 clients a
# round, trimmed to 2 rounds of 1 local step on 20 clients, evaluated on 100 test digits
QUICKSTART = ["data.num_clients=20", "participation.clients_per_round=10", "run.rounds=2", "local.steps=1",
              "local.batch_size=8", "eval.every=0", "data.test_fraction=0.02"]


def _config(*overrides: str) -> list[str]:
    return ["data.name=mnist5k", "data.partition=dirichlet", "data.alpha=0.3", "model.name=cnn_mnist",
            "participation.pattern=uniform", "local.lr=0.05", *QUICKSTART, *overrides]


def test_every_algorithm_gives_the_same_bits_on_one_two_and_three_ranks(tmp_path):
    configs = {name: _config(f"algorithm.name={name}") for name in sorted(ALGORITHMS)}
    configs["fedavg_blocks"] = _config("algorithm.name=fedavg", "run.placement=blocks")  # auto: work on 2+ ranks
    configs["initial"] = _config("local.lr=0", "run.rounds=1")
    runs = {ranks: final_models(ranks, tmp_path, configs, timeout=600) for ranks in (0, 2, 3)}
    one = runs[0]
    initial = one.pop("initial")
    assert len(one) == len(ALGORITHMS) + 1 > 18
    for ranks in (2, 3):
        differ = [name for name in one if one[name].tobytes() != runs[ranks][name].tobytes()]
        assert not differ, f"{ranks} ranks differ from 1 in the last bits for: {', '.join(differ)}"
    for name, x in one.items():
        assert x.dtype == np.float32 and np.abs(x - initial).max() > 1e-5, f"{name} did not move the model"


def _train(ranks: int, run_dir: Path, rounds: int, *extra: str, resume: bool = False) -> None:
    args = ["-m", "fedrun", "train", "--quiet", "--config", "configs/quickstart.yaml", f"run.dir={run_dir}",
            *QUICKSTART, "algorithm.name=scaffold", f"run.rounds={rounds}", *extra]
    run_ranks(ranks, [*args, "--resume", "auto"] if resume else args)


def test_resumed_on_fewer_ranks_is_the_uninterrupted_run_and_compare_says_where_runs_part(tmp_path):
    """SCAFFOLD (its c_i re-blocked from 2 ranks to 1) on the quickstart CNN in float32; fedrun compare
    through the real command line."""
    whole, elastic, other = tmp_path / "whole", tmp_path / "elastic", tmp_path / "other"
    _train(2, whole, 3)
    _train(2, elastic, 2)
    _train(1, elastic, 3, resume=True)
    _train(0, other, 3, "local.lr=0.04")
    cut = metrics(elastic)
    assert cut[1].pop("test_loss") and cut[1].pop("test_accuracy")  # the 2-round run evaluated at its end
    assert metrics(whole) == cut  # fingerprints, losses and the final test figures alike
    same = run_ranks(0, ["-m", "fedrun", "compare", str(whole), str(elastic)], check=False)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "checkpoint after round 3: every dataset identical" in same.stdout and "run.rounds" not in same.stdout
    assert same.stdout.strip().endswith("identical")
    differ = run_ranks(0, ["-m", "fedrun", "compare", str(whole), str(other)], check=False)
    assert differ.returncode == 1, differ.stdout + differ.stderr
    assert "config: local.lr: 0.05 -> 0.04" in differ.stdout
    assert "first difference: round 1: server/c, server/x" in differ.stdout
    assert "server/x: max |diff|" in differ.stdout and "clients/c_i: max |diff|" in differ.stdout
    bad = run_ranks(0, ["-m", "fedrun", "compare", str(whole), str(tmp_path / "missing")], check=False)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "missing: not a run directory (expected metrics.jsonl in it)" in bad.stderr
