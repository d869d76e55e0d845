"""Buffered asynchronous rounds (fedrun.federation.async_rounds; ALGORITHMS-BASELINES.md 1.4) and the
rank independence of the new algorithms."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import LEAST_SQUARES, final_model, run_ranks
from lsq import config, resolve, run_single, single_world
from test_resume import final_state, metrics, train_args

from fedrun.federation.async_rounds import AsyncFederation

ASYNC = ["asynchrony.enabled=true", "asynchrony.buffer_size=2", "asynchrony.concurrency=4"]


@pytest.mark.parametrize("algo", ["fedavg", "fedadam", "fadas", "fedcada", "scaffold"])
def test_equal_durations_and_m_equal_cohort_is_the_synchronous_run(algo):
    sync = run_single(config(algo, "participation.pattern=uniform", "participation.clients_per_round=3",
                                 "local.lr=0.02"))
    asyn = run_single(config(algo, "participation.pattern=uniform", "participation.clients_per_round=3",
                                 "local.lr=0.02", "asynchrony.enabled=true", "asynchrony.buffer_size=3",
                                 "asynchrony.concurrency=3", "asynchrony.durations=constant"))
    np.testing.assert_array_equal(asyn.x, sync.x)
    assert all(r["staleness"] == [0, 0, 0] for r in asyn.metrics)


def test_staleness_is_logged_and_reaches_the_server_rule():
    fed = AsyncFederation(resolve(config("fadas", *ASYNC)), single_world(), None)
    seen = []
    rule = fed.algorithm.server_update

    def spy(server, up, ctx):
        seen.append((ctx.num_active, ctx.max_staleness, ctx.staleness.tolist()))
        return rule(server, up, ctx)

    fed.algorithm.server_update = spy
    entries = [fed.round(t) for t in range(15)]
    assert [(2, max(e["staleness"]), e["staleness"]) for e in entries] == seen
    assert max(e["staleness_max"] for e in entries) > 1  # slow clients come back stale
    assert all(e["uplink_floats"] == 2 * 5 for e in entries)
    clocks = [e["clock"] for e in entries]
    assert clocks == sorted(clocks)


def test_deterministic_in_seed():
    a = run_single(config("fadas", *ASYNC, "run.rounds=10"))
    b = run_single(config("fadas", *ASYNC, "run.rounds=10"))
    np.testing.assert_array_equal(a.x, b.x)
    c = run_single(config("fadas", *ASYNC, "run.rounds=10", "run.seed=3"))
    assert not np.array_equal(a.x, c.x)


@pytest.mark.mpi
@pytest.mark.parametrize("algo", [["algorithm.name=fadas", "algorithm.global_lr=0.01"],
                                  ["algorithm.name=fafed", "algorithm.persist_client_state=true"],
                                  ["algorithm.name=scaffold"]])
def test_resume_in_the_middle_of_an_async_run_is_bit_identical(tmp_path, algo):
    extra = [*ASYNC, "checkpoint.every=1", *algo]
    run_ranks(2, train_args(tmp_path / "whole", 16, extra))
    run_ranks(2, train_args(tmp_path / "cut", 7, extra))
    run_ranks(2, train_args(tmp_path / "cut", 16, extra, resume=True))
    whole, cut = final_state(tmp_path / "whole"), final_state(tmp_path / "cut")
    assert whole.keys() == cut.keys() and any(k.startswith("clients/_pending_") for k in whole)
    for key in whole:
        assert np.array_equal(whole[key], cut[key]), key

    def strip(rows):  # the interrupted run also evaluated at its last round (7)
        return [{k: v for k, v in r.items() if not k.startswith("test_")} for r in rows]

    assert strip(metrics(tmp_path / "whole")) == strip(metrics(tmp_path / "cut"))
    assert any(max(r["staleness"]) > 0 for r in metrics(tmp_path / "cut"))


@pytest.mark.mpi
@pytest.mark.parametrize("mode", [[], ASYNC])
@pytest.mark.parametrize("algo", [["algorithm.name=fadas", "algorithm.global_lr=0.01"], ["algorithm.name=fedcada"],
                                  ["algorithm.name=fafed", "algorithm.persist_client_state=true"]])
def test_one_and_two_ranks_agree(tmp_path, algo, mode):
    args = [*LEAST_SQUARES, "run.rounds=8", "local.steps=3", "local.lr=0.02", "participation.pattern=uniform",
            "participation.clients_per_round=3", *algo, *mode]
    np.testing.assert_allclose(final_model(2, tmp_path, args), final_model(1, tmp_path, args), rtol=1e-10, atol=1e-12)
