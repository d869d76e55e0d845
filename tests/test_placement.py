"""Which rank trains which client (fedrun.federation.blocks, rounds.local_rows): contiguous
blocks, or each round's participants split by work so that the ranks finish together."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import LEAST_SQUARES, REPO, config, federation, final_models, run_ranks

from fedrun.errors import ConfigError
from fedrun.federation.blocks import round_work, split_by_work


def test_round_work_counts_the_examples_a_client_processes():
    n = np.array([3, 10, 25])
    assert round_work(n, batch_size=8, steps=5, epochs=None).tolist() == [15, 40, 40]
    assert round_work(n, batch_size=8, steps=5, epochs=2).tolist() == [6, 20, 50]


def test_split_by_work_is_the_greedy_longest_first_split():
    ids = np.array([2, 5, 7, 11, 13])
    work = np.array([3, 5, 3, 4, 3])
    # id 5 (5) -> r0; id 11 (4) -> r1; id 2 (3) -> r1 (4 < 5); id 7 (3) -> r0 (5 < 7); id 13 (3) -> r1 (7 < 8)
    shares = split_by_work(ids, work, 2)
    loads = [int(work[np.isin(ids, s)].sum()) for s in shares]
    assert [s.tolist() for s in shares] == [[5, 7], [2, 11, 13]] and loads == [8, 10]
    assert sorted(np.concatenate(shares).tolist()) == ids.tolist()  # a partition of the participants


def test_split_by_work_balances_skewed_cohorts_and_deals_equal_work_round_robin():
    rng = np.random.default_rng(0)
    ids = np.sort(rng.choice(1000, 64, replace=False))
    work = rng.lognormal(3, 1, 64).astype(np.int64) + 1
    shares = split_by_work(ids, work, 4)
    loads = np.array([work[np.isin(ids, s)].sum() for s in shares])
    assert loads.max() - loads.min() <= work.max()  # the greedy rule's guarantee
    equal = split_by_work(ids, np.full(64, 7), 3)
    assert [len(s) for s in equal] == [22, 21, 21] and equal[0][:2].tolist() == [ids[0], ids[3]]
    assert all(len(s) == 0 for s in split_by_work(ids[:0], work[:0], 2))


def test_placement_work_is_refused_for_per_client_state_and_the_asynchronous_mode():
    with pytest.raises(ConfigError, match=r"run.placement=work: algorithm scaffold keeps per-client state \(c_i\)"):
        federation(config("scaffold", "run.placement=work"))
    with pytest.raises(ConfigError, match="run.placement=work: the asynchronous mode"):
        federation(config("fedavg", "run.placement=work", "asynchrony.enabled=true", "asynchrony.buffer_size=2",
                          "asynchrony.concurrency=3"))
    assert federation(config("fedavg")).setup.placement.mode == "blocks"  # one rank: nothing to balance


@pytest.mark.mpi
def test_work_placement_trains_the_same_model_as_blocks(tmp_path):
    """Skewed client sizes and one local epoch (work proportional to size): 2 ranks splitting each round's
    participants by work give the 1-rank model (float64, only the order of the sum changes)."""
    base = [*LEAST_SQUARES, "data.partition=size_skew", "data.num_clients=9", "data.least_squares.rows_per_client=20",
            "local.batch_size=4", "local.epochs=1", "local.lr=0.02", "participation.pattern=uniform",
            "participation.clients_per_round=5", "run.rounds=6"]
    one = final_models(0, tmp_path, {"x": base, "init": [*base, "local.lr=0"]})
    two = final_models(2, tmp_path, {"work": [*base, "run.placement=work"], "blocks": [*base, "run.placement=blocks"]})
    assert np.abs(one["x"] - one["init"]).max() > 1e-3
    for name in ("work", "blocks"):
        np.testing.assert_allclose(two[name], one["x"], rtol=1e-12, atol=1e-14, err_msg=name)
    run_dir = tmp_path / "auto"
    run_ranks(2, ["-m", "fedrun", "train", *base, f"run.dir={run_dir}", "--quiet"], cwd=REPO)
    assert json.loads((run_dir / "runtime.json").read_text())["placement"] == "work"  # auto: stateless on CPU
