"""SCAFFOLD, original Option II and single-uplink form on the least-squares task (docs/verification.md)."""

from __future__ import annotations

import numpy as np
import pytest
import reference as ref
import torch
from helpers import (
    assert_matches_reference,
    assert_tracks_clients,
    bernoulli_trace,
    config,
    federation,
    resolve,
    run_rounds,
    run_single,
    x_star,
)

from fedrun.errors import ConfigError

FORMS = ["original", "single_uplink"]


def snapshot(fed):
    return {"x": fed.server["x"].clone(), "c": fed.server["c"].clone(),
            "c_i": fed.store.tensors["c_i"].clone()}


def test_single_uplink_equals_original_iterate_by_iterate():
    """V8: same x, c and c_i after every round (partial participation, decaying lr, K = 5)."""
    trace = bernoulli_trace(30, 0.4, seed=4)
    feds = [federation(config("scaffold", "local.lr=0.2", "local.lr_schedule=inv_sqrt", global_lr=0.8, form=form),
                       trace) for form in FORMS]
    for t in range(30):
        for fed in feds:
            fed.round(t)
        a, b = (snapshot(fed) for fed in feds)
        for key in a:
            torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-12)


@pytest.mark.parametrize("form", FORMS)
def test_control_variate_invariant_every_round(form):
    """V9: c = (1/N) sum_i c_i after every round (empty rounds and inactive clients included)."""
    trace = bernoulli_trace(25, 0.3, seed=3)
    assert_tracks_clients(federation(config("scaffold", "local.lr=0.2", form=form), trace), 25, "c", "c_i")


@pytest.mark.parametrize("form", FORMS)
def test_matches_reference_pseudocode(form):
    """Both forms equal a numpy transcription of Option II (partial participation, decaying lr)."""
    cfg = config("scaffold", "local.steps=3", "local.lr=0.3", "local.lr_schedule=inv_sqrt", global_lr=0.9,
                 form=form)
    assert_matches_reference(cfg, bernoulli_trace(12, 0.4, seed=5), ref.scaffold)


@pytest.mark.parametrize("form", FORMS)
def test_k1_full_participation_equals_fedavg(form):
    """V4: with K = 1 and full participation c = c_i cancel: SGD with step eta_g eta_l."""
    common = ("local.steps=1", "local.lr=0.2", "local.lr_schedule=inv_sqrt", "run.rounds=10")
    x_avg = run_single(config("fedavg", *common, global_lr=0.8)).x
    x = run_single(config("scaffold", *common, global_lr=0.8, form=form)).x
    np.testing.assert_allclose(x, x_avg, rtol=0, atol=1e-12)


@pytest.mark.parametrize("pattern", ["full", "bernoulli"])
@pytest.mark.parametrize("form", FORMS)
def test_drift_free_reaches_x_star(form, pattern):
    """V15: K = 5, deterministic gradients, full and Bernoulli(0.4) participation reach x*."""
    rounds = 100 if pattern == "full" else 150
    cfg = config("scaffold", "local.lr=0.2", form=form)
    trace = None if pattern == "full" else bernoulli_trace(rounds, 0.4, seed=1)
    x = run_rounds(federation(cfg, trace), rounds)
    assert np.linalg.norm(x - x_star(cfg)) < 1e-8


@pytest.mark.parametrize("form", FORMS)
def test_empty_round_leaves_server_state(form):
    trace = np.ones((3, 6), dtype=bool)
    trace[1] = False
    fed = federation(config("scaffold", "local.lr=0.2", form=form), trace)
    fed.round(0)
    before = snapshot(fed)
    fed.round(1)
    after = snapshot(fed)
    for key in before:
        torch.testing.assert_close(after[key], before[key], rtol=0, atol=0)


@pytest.mark.parametrize(("form", "up"), [("original", 10), ("single_uplink", 5)])
def test_communication_per_active_client(form, up):
    """Communication (docs/algorithms.md, "Summary"): down 2 (x, c); up 2 (Delta x_i, Delta c_i) or 1 (delta_i)."""
    cfg = config("scaffold", "run.rounds=3", "participation.pattern=uniform", "participation.clients_per_round=2",
                 form=form)
    for entry in run_single(cfg).metrics:
        assert entry["uplink_floats"] == 2 * up and entry["downlink_floats"] == 2 * 10


def test_hparams_are_validated():
    with pytest.raises(ConfigError, match="algorithm.form"):
        resolve(config("scaffold", form="option_i"))
    with pytest.raises(ConfigError, match="algorithm.global_lr"):
        resolve(config("scaffold", global_lr=-1.0))
