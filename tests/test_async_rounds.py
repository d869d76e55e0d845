"""Buffered asynchronous rounds (fedrun.federation.schedule.Buffered) and the rank independence of the
asynchronous algorithms."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import (
    LEAST_SQUARES,
    client_grads,
    config,
    federation,
    final_model,
    final_state,
    metrics,
    resolve,
    run_ranks,
    run_single,
    single_world,
    train_args,
)

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
    fed = federation(config("fadas", *ASYNC))
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


def test_dispatch_quirk_starts_from_the_previous_model_and_takes_the_change_against_the_current():
    """The official FADAS code's dispatch quirk (docs/algorithms/fadas_fedcada_fafed_async.md), with FedAvg
    (eta_g = 1) and K = 1 full-batch step: a client dispatched with version t >= 1, other than the last one
    drawn, uploads x_{t-1} - eta grad f_i(x_{t-1}) - x_t; x_{t+1} = x_t + the buffer's mean upload. Who trains and who
    arrives, and the recorded staleness, are those of the clean run."""
    lr, steps = 0.1, 14
    common = ("fedavg", *ASYNC, "local.steps=1", f"local.lr={lr}")
    fed = federation(config(*common, "asynchrony.replicate_dispatch_quirk=true"))
    clean = federation(config(*common))
    xs, pending, stale_starts = [fed.server["x"].numpy().copy()], {}, 0
    for t in range(steps):
        x_t = xs[-1]
        for i in np.flatnonzero(fed.schedule.start_version == t):
            start = xs[-2] if t >= 1 and i != fed.schedule.last_drawn else x_t
            stale_starts += start is not x_t
            pending[i] = start - lr * client_grads(config(*common), start)[i] - x_t
        buf = fed.schedule.buffer()
        entry, clean_entry = fed.round(t), clean.round(t)
        assert entry["clients"] == buf.tolist() == clean_entry["clients"]
        assert entry["staleness"] == clean_entry["staleness"]
        xs.append(x_t + np.mean([pending.pop(i) for i in buf], axis=0))
        np.testing.assert_allclose(fed.server["x"].numpy(), xs[-1], rtol=0, atol=1e-12, err_msg=f"step {t}")
    assert stale_starts >= steps - 1  # M - 1 = 1 stale start at every step t >= 1
    assert not np.allclose(fed.server["x"].numpy(), clean.server["x"].numpy())


def test_deterministic_in_seed():
    a = run_single(config("fadas", *ASYNC, "run.rounds=10"))
    b = run_single(config("fadas", *ASYNC, "run.rounds=10"))
    np.testing.assert_array_equal(a.x, b.x)
    c = run_single(config("fadas", *ASYNC, "run.rounds=10", "run.seed=3"))
    assert not np.array_equal(a.x, c.x)


@pytest.mark.mpi
@pytest.mark.parametrize("algo", [["algorithm.name=fadas", "algorithm.global_lr=0.01"],
                                  ["algorithm.name=fafed", "algorithm.persist_client_state=true"],
                                  ["algorithm.name=scaffold"],
                                  ["algorithm.name=fedavg", "asynchrony.replicate_dispatch_quirk=true"]])
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


def test_resuming_with_the_other_dispatch_quirk_setting_is_refused(tmp_path):
    """The quirk's scheduler state (x_{t-1}, the last drawn client) is not in a checkpoint written without
    it: resuming with the switch on is a one-line checkpoint error, and the checkpoint stays as it was."""
    import fedrun
    from fedrun.errors import CheckpointError, ConfigError

    cfg = config("fedavg", *ASYNC, "run.rounds=4", "checkpoint.every=2", f"run.dir={tmp_path}")
    fedrun.run(cfg, world=single_world())
    ckpts = sorted(tmp_path.glob("ckpt_*.h5"))
    before = {p: p.read_bytes() for p in ckpts}
    quirk = config("fedavg", *ASYNC, "run.rounds=6", "checkpoint.every=2", f"run.dir={tmp_path}",
                   "asynchrony.replicate_dispatch_quirk=true")
    with pytest.raises(ConfigError, match=r"asynchrony\.replicate_dispatch_quirk"):  # the resume policy
        fedrun.run(quirk, world=single_world(), resume="auto")
    with pytest.raises(CheckpointError, match=r"ckpt_\d+\.h5: checkpoint written without asynchrony\.replicate"):
        fedrun.run(quirk, world=single_world(), resume="auto",
                   accept_changes=("asynchrony.replicate_dispatch_quirk",))
    assert {p: p.read_bytes() for p in ckpts} == before


def test_skip_nonfinite_clients_is_refused_in_the_asynchronous_mode(tmp_path):
    """An asynchronous upload is consumed steps after its client's new state was stored, so it cannot be
    dropped: the pair is refused at config time, through the CLI, with one line and status 2, nothing written;
    either setting alone is accepted."""
    run_dir = tmp_path / "run"
    proc = run_ranks(0, train_args(run_dir, 2, [*ASYNC, "run.skip_nonfinite_clients=true"]), check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("fedrun: error: run.skip_nonfinite_clients: expected false with "
                                  "asynchrony.enabled") and proc.stderr.count("\n") == 1, proc.stderr
    assert not run_dir.exists()
    assert resolve(config("fedavg", *ASYNC)).asynchrony.enabled
    assert resolve(config("fedavg", "run.skip_nonfinite_clients=true")).run.skip_nonfinite_clients
