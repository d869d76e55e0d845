"""FAdamGC on the least-squares task of docs/verification.md."""

from __future__ import annotations

import numpy as np
import pytest
import reference as ref
import torch
from helpers import (
    assert_matches_reference,
    assert_tracks_clients,
    bernoulli_trace,
    client_grads,
    config,
    federation,
    resolve,
    run_rounds,
    run_single,
    set_server,
    x_star,
)

from fedrun.errors import ConfigError


@pytest.mark.parametrize("persist", [False, True])
def test_matches_reference_pseudocode(persist):
    """The rules equal a numpy transcription of the round rule (partial participation, decaying lr)."""
    cfg = config("fadamgc", "local.steps=3", "local.lr=0.05", "local.lr_schedule=inv_sqrt", global_lr=0.9,
                 persist_moments=persist)
    assert_matches_reference(cfg, bernoulli_trace(12, 0.5, seed=5), ref.fadamgc, persist=persist)


@pytest.mark.parametrize("persist", [False, True])
def test_without_correction_matches_local_amsgrad(persist):
    """correction: false is local AMSGrad on the raw gradient, averaged by the server: the transcription
    with ghat = g. Nothing is tracked: the client store holds only the persisted moments, one vector
    travels each way."""
    cfg = config("fadamgc", "local.steps=3", "local.lr=0.05", "local.lr_schedule=inv_sqrt", global_lr=0.9,
                 persist_moments=persist, correction=False)
    assert_matches_reference(cfg, bernoulli_trace(12, 0.5, seed=5), ref.fadamgc, persist=persist, correct=False)
    fed = federation(cfg, bernoulli_trace(2, 0.5, seed=5))
    assert set(fed.store.tensors) == ({"m", "v", "vhat"} if persist else set())
    assert set(fed.server) == {"x"}
    uniform = config("fadamgc", "run.rounds=2", "participation.pattern=uniform", "participation.clients_per_round=2",
                     correction=False)
    for entry in run_single(uniform).metrics:
        assert entry["uplink_floats"] == 2 * 5 and entry["downlink_floats"] == 2 * 5


@pytest.mark.parametrize("persist", [False, True])
def test_tracking_invariant_every_round(persist):
    """V9: y = (1/N) sum_i y_i after every round (SCAFFOLD-style tracking, the default)."""
    trace = bernoulli_trace(20, 0.3, seed=3)
    assert_tracks_clients(federation(config("fadamgc", "local.lr=0.05", persist_moments=persist), trace), 20,
                          "y", "y_i")


def test_moments_persist_per_client_only_when_asked():
    trace = np.zeros((2, 6), dtype=bool)
    trace[0, :3] = True
    trace[1, 3:] = True
    assert set(federation(config("fadamgc"), trace).store.tensors) == {"y_i"}
    fed = federation(config("fadamgc", "local.lr=0.05", persist_moments=True), trace)
    fed.round(0)
    after0 = {k: fed.store.tensors[k].clone() for k in ("m", "v", "vhat")}
    assert bool((after0["vhat"][:3] > 0).all()) and bool((after0["m"][3:] == 0).all())
    fed.round(1)
    for k, v in after0.items():  # clients 0-2 were inactive in round 1: their moments are kept
        torch.testing.assert_close(fed.store.tensors[k][:3], v[:3], rtol=0, atol=0)
    assert bool((fed.store.tensors["vhat"][3:] > 0).all())


def test_x_star_is_a_fixed_point():
    """V17: at x* with y_i = grad f_i(x*) and y = 0 the corrected gradient vanishes; without the
    correction (y_i = 0, y = 0) local Adam leaves x*.

    eps = 0.1 keeps the fixed point stable in floating point: once |ghat| << eps the local step is
    eta_l ghat / eps-like, and with a small eps (1e-3 here already) the rounding noise of ghat (1e-14)
    is amplified by that huge effective step and the iterate walks away from x* (0.016 after 5 rounds)."""
    cfg = config("fadamgc", "local.lr=0.05", eps=0.1)
    xs = x_star(cfg)
    out = []
    for corrected in (True, False):
        fed = federation(cfg)
        if corrected:
            fed.store.tensors["y_i"][:] = torch.as_tensor(client_grads(cfg, xs))
        set_server(fed, x=xs, y=np.zeros(5))
        out.append(np.linalg.norm(run_rounds(fed, 5) - xs))
    assert out[0] < 1e-12
    assert out[1] > 1e-3


@pytest.mark.parametrize("pattern", ["full", "bernoulli"])
def test_persistent_moments_reach_x_star(pattern):
    """V17: with persist_moments the iterates reach x* (K = 5, deterministic gradients)."""
    rounds, lr = (150, 0.05) if pattern == "full" else (250, 0.01)
    cfg = config("fadamgc", f"local.lr={lr}", persist_moments=True)
    trace = None if pattern == "full" else bernoulli_trace(rounds, 0.4, seed=1)
    x = run_rounds(federation(cfg, trace), rounds)
    assert np.linalg.norm(x - x_star(cfg)) < 1e-8


def test_reset_moments_with_large_eps_reach_x_star():
    """V17: moments reset every round with eps = 0.1 also reach x*."""
    cfg = config("fadamgc", "local.lr=0.1", eps=0.1)
    assert np.linalg.norm(run_rounds(federation(cfg), 80) - x_star(cfg)) < 1e-8


def test_mean_active_tracking():
    """Under full participation both aggregations of y coincide; under partial participation
    mean_active sets y to the mean of the participants' new y_i."""
    full = [run_single(config("fadamgc", "run.rounds=8", "local.lr=0.05", tracking=tr)).x
            for tr in ("scaffold", "mean_active")]
    np.testing.assert_allclose(full[1], full[0], rtol=0, atol=1e-12)
    trace = bernoulli_trace(10, 0.5, seed=2)
    fed = federation(config("fadamgc", "local.lr=0.05", tracking="mean_active"), trace)
    for t in range(10):
        fed.round(t)
        if trace[t].any():
            want = fed.store.tensors["y_i"][torch.as_tensor(trace[t])].mean(dim=0)
            torch.testing.assert_close(fed.server["y"], want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("tracking", ["scaffold", "mean_active"])
def test_communication_per_active_client(tracking):
    """Communication (docs/algorithms.md, "Summary"): down 2 (x, y), up 2 (Delta x_i and Delta y_i, or y_i)."""
    cfg = config("fadamgc", "run.rounds=3", "participation.pattern=uniform", "participation.clients_per_round=2",
                 tracking=tracking)
    for entry in run_single(cfg).metrics:
        assert entry["uplink_floats"] == 2 * 10 and entry["downlink_floats"] == 2 * 10


def test_hparams_are_validated():
    for bad, field in (({"beta1": 1.0}, "beta1"), ({"beta2": -0.1}, "beta2"), ({"eps": 0.0}, "eps"),
                       ({"tracking": "selective"}, "tracking"), ({"global_lr": 0.0}, "global_lr")):
        with pytest.raises(ConfigError, match=f"algorithm.{field}"):
            resolve(config("fadamgc", **bad))
