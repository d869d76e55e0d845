"""FedSUM-B / FedSUM / FedSUM-CR on the least-squares task of docs/verification.md."""

from __future__ import annotations

import numpy as np
import pytest
import reference as ref
import torch
from helpers import (
    N,
    assert_matches_reference,
    bernoulli_trace,
    client_grads,
    config,
    federation,
    per_round,
    resolve,
    run_rounds,
    run_single,
    x_star,
)

from fedrun.algorithms import get_algorithm
from fedrun.algorithms.base import Clients, RoundContext
from fedrun.errors import ConfigError
from fedrun.training.schedule import local_lr

VARIANTS = [("fedsum_b", {}), ("fedsum", {}), ("fedsum_cr", {"cr_form": "cumulative"}),
            ("fedsum_cr", {"cr_form": "constant"})]
IDS = ["fedsum_b", "fedsum", "fedsum_cr-cumulative", "fedsum_cr-constant"]


def test_fedsum_b_full_participation_is_gradient_descent():
    """V2: x+ = x - eta_g eta_l(t) K (1/N) sum_i grad f_i(x), here with a decaying eta_l(t)."""
    cfg = config("fedsum_b", "local.steps=3", "local.lr=0.1", "local.lr_schedule=inv_sqrt", "run.rounds=12",
                 global_lr=0.7)
    got = run_single(cfg).x
    c = resolve(cfg)
    x = np.zeros(5)
    for t in range(12):
        x = x - 0.7 * local_lr(c.local, t) * 3 * client_grads(cfg, x).mean(axis=0)
    np.testing.assert_allclose(got, x, rtol=0, atol=1e-12)


def test_k1_collapse_under_partial_participation():
    """V3: with K = 1 the local correction cannot act: FedSUM = FedSUM-B = FedSUM-CR (both forms)."""
    trace = bernoulli_trace(30, 0.3, seed=3)
    assert not trace.any(axis=1).all(), "the trace should contain an empty round"
    runs = [per_round(federation(config(name, "local.steps=1", "local.lr=0.3", "local.lr_schedule=inv_sqrt",
                                        global_lr=0.9, **hp), trace), 30) for name, hp in VARIANTS]
    for other in runs[1:]:
        np.testing.assert_allclose(np.array(other), np.array(runs[0]), rtol=0, atol=1e-12)


@pytest.mark.parametrize(("name", "hp"), VARIANTS, ids=IDS)
def test_k1_full_participation_equals_fedavg(name, hp):
    """V4: K = 1 and full participation reduce to FedAvg (SGD with step eta_g eta_l)."""
    common = ("local.steps=1", "local.lr=0.2", "local.lr_schedule=inv_sqrt", "run.rounds=10")
    x_avg = run_single(config("fedavg", *common, global_lr=0.8)).x
    x = run_single(config(name, *common, global_lr=0.8, **hp)).x
    np.testing.assert_allclose(x, x_avg, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("name", "hp"), VARIANTS, ids=IDS)
def test_matches_reference_pseudocode(name, hp):
    """The rules equal a direct numpy transcription of the three round rules (partial participation, decaying lr)."""
    cfg = config(name, "local.steps=3", "local.lr=0.3", "local.lr_schedule=inv_sqrt", global_lr=0.9, **hp)
    assert_matches_reference(cfg, bernoulli_trace(12, 0.4, seed=5), ref.fedsum, variant=name,
                             cr_form=hp.get("cr_form", "cumulative"))


@pytest.mark.parametrize(("name", "hp"), VARIANTS, ids=IDS)
def test_memory_sum_invariant_every_round(name, hp):
    """V9: y = sum_i h_i after every round, including empty rounds and inactive clients."""
    trace = bernoulli_trace(25, 0.3, seed=3)
    fed = federation(config(name, "local.steps=3", "local.lr=0.2", **hp), trace)
    for t in range(25):
        fed.round(t)
        h = fed.store.tensors["h"]
        torch.testing.assert_close(fed.server["y"], h.sum(dim=0), rtol=0, atol=1e-12)
        never_seen = ~torch.as_tensor(trace[: t + 1].any(axis=0))
        assert bool((h[never_seen] == 0).all()), "a never-seen client has h_i = 0"


def _clients_and_ctx(fed, t, lr):
    last = torch.as_tensor(fed.delay.last_active.copy())
    clients = Clients(ids=torch.arange(N), num_examples=torch.full((N,), 8.0, dtype=torch.float64),
                      participations=torch.as_tensor(fed.delay.participations.copy()), last_active=last)
    ctx = RoundContext(round=t, lr=lr, num_clients=N, num_active=N, local_steps=fed.cfg.local.steps, dim=5,
                       total_examples=8.0 * N)
    return clients, ctx


@pytest.mark.parametrize("form", ["constant", "cumulative"])
def test_cr_inversion_recovers_average_memory(form):
    """V10 (constant lr): z_i - x^(t) = (eta_g eta_l K / N) sum_{s=a_i}^{t-1} y^(s), and the CR
    correction is the mean of those y^(s) minus h_i. The cumulative form inverts the recursion for a
    decaying lr too: the correction is the c_s-weighted mean over s = a_i..t-1."""
    schedule = "constant" if form == "constant" else "inv_sqrt"
    cfg = config("fedsum_cr", "local.steps=3", "local.lr=0.2", f"local.lr_schedule={schedule}",
                 global_lr=0.9, cr_form=form)
    trace = bernoulli_trace(20, 0.3, seed=7)
    fed = federation(cfg, trace)
    algo = fed.algorithm
    ys, cs = [], []  # y^(s) and c_s = eta_g eta_l(s) K / N
    checked = 0
    for t in range(20):
        lr = local_lr(fed.cfg.local, t)
        x_t = fed.global_model().clone()
        down = fed.downlink()
        state = {k: v.clone() for k, v in fed.store.tensors.items()}
        clients, ctx = _clients_and_ctx(fed, t, lr)
        correction = algo.local_plan(down, state, clients, ctx).correction
        for i in range(N):
            a_i = int(fed.delay.last_active[i])
            first = max(a_i, 0)
            if t == first:
                continue
            window = np.array(ys[first:t])
            weights = np.array(cs[first:t])
            lhs = (state["z"][i] - x_t).numpy()
            np.testing.assert_allclose(lhs, (weights[:, None] * window).sum(axis=0), rtol=0, atol=1e-12)
            if form == "constant":  # a_i = -1 counts the zero "round -1": divide by t - a_i
                ybar = window.sum(axis=0) / (t - a_i)
            else:
                ybar = (weights[:, None] * window).sum(axis=0) / weights.sum()
            want = ybar - state["h"][i].numpy()
            np.testing.assert_allclose(correction[i].numpy(), want, rtol=0, atol=1e-11)
            checked += 1
        fed.round(t)
        ys.append(fed.server["y"].numpy().copy())
        cs.append(0.9 * lr * 3 / N)
    assert checked > 30


@pytest.mark.parametrize("pattern", ["full", "bernoulli"])
@pytest.mark.parametrize(("name", "hp"), VARIANTS[:3], ids=IDS[:3])
def test_drift_free_reaches_x_star(name, hp, pattern):
    """V15: K = 5, deterministic gradients, full and Bernoulli(0.4) participation reach x*."""
    rounds = 100 if pattern == "full" else 150
    cfg = config(name, "local.lr=0.2", **hp)
    trace = None if pattern == "full" else bernoulli_trace(rounds, 0.4, seed=1)
    x = run_rounds(federation(cfg, trace), rounds)
    assert np.linalg.norm(x - x_star(cfg)) < 1e-8


def test_fedavg_drifts_on_the_same_problem():
    """V14 (contrast for V15): FedAvg with K = 5 settles away from x* on this problem."""
    cfg = config("fedavg", "local.lr=0.2")
    assert np.linalg.norm(run_rounds(federation(cfg), 100) - x_star(cfg)) > 1e-2


@pytest.mark.parametrize(("name", "hp"), VARIANTS, ids=IDS)
def test_empty_round_stale_step_or_skip(name, hp):
    """An empty S_t still steps along the stale y (default); skip_empty_rounds leaves x and y."""
    trace = np.ones((4, N), dtype=bool)
    trace[2] = False
    out = {}
    for skip in (False, True):
        fed = federation(config(name, "local.lr=0.2", skip_empty_rounds=skip, **hp), trace)
        run_rounds(fed, 2)
        before = {k: v.clone() for k, v in fed.server.items()}
        fed.round(2)
        out[skip] = (before, {k: v.clone() for k, v in fed.server.items()})
    before, after = out[False]
    step = 1.0 * 0.2 * 5 / N
    torch.testing.assert_close(after["x"], before["x"] - step * before["y"], rtol=0, atol=1e-14)
    torch.testing.assert_close(after["y"], before["y"], rtol=0, atol=0)
    before, after = out[True]
    for key in before:
        torch.testing.assert_close(after[key], before[key], rtol=0, atol=0)


@pytest.mark.parametrize(("name", "hp"), VARIANTS, ids=IDS)
def test_data_size_weighting_with_equal_sizes_is_uniform(name, hp):
    """data_size weighting (fedrun's extension): p_i = 1/N when every client holds as many examples."""
    trace = bernoulli_trace(10, 0.5, seed=2)
    runs = [per_round(federation(config(name, "local.lr=0.2", weighting=w, **hp), trace), 10)
            for w in ("uniform", "data_size")]
    np.testing.assert_allclose(np.array(runs[1]), np.array(runs[0]), rtol=0, atol=1e-12)


def test_data_size_weighting_rules_with_unequal_sizes():
    """Local direction p_i (g - h_i) + Y_i / N and upload N p_i delta_i, with p_i = n_i / sum_j n_j."""
    torch.manual_seed(0)
    cfg = resolve(config("fedsum", weighting="data_size"))
    algo = get_algorithm("fedsum")(cfg.algorithm.hparams)
    n = torch.tensor([2.0, 5.0, 13.0], dtype=torch.float64)
    total, num = 40.0, 4
    clients = Clients(ids=torch.arange(3), num_examples=n, participations=torch.zeros(3),
                      last_active=torch.full((3,), -1))
    ctx = RoundContext(round=0, lr=0.1, num_clients=num, num_active=3, local_steps=2, dim=5,
                       total_examples=total)
    down = {"x": torch.randn(5, dtype=torch.float64), "y": torch.randn(5, dtype=torch.float64)}
    state = {"h": torch.randn(3, 5, dtype=torch.float64)}
    plan = algo.local_plan(down, state, clients, ctx)
    g = torch.randn(3, 5, dtype=torch.float64)
    p = (n / total).unsqueeze(1)
    direction = plan.lr_scale.unsqueeze(1) * (g + plan.correction)
    torch.testing.assert_close(direction, p * (g - state["h"]) + down["y"] / num, rtol=0, atol=1e-14)
    from fedrun.algorithms.base import LocalResult

    local = LocalResult(x_end=plan.start, grad_mean=g, loss=torch.zeros(3))
    up, new = algo.client_finish(down, state, local, clients, ctx)
    torch.testing.assert_close(up["delta"], num * p * (g - state["h"]), rtol=0, atol=1e-14)
    torch.testing.assert_close(new["h"], g)


@pytest.mark.parametrize(("name", "hp", "up", "down"), [
    ("fedsum_b", {}, 5, 5), ("fedsum", {}, 5, 10), ("fedsum_cr", {"cr_form": "constant"}, 5, 5),
    ("fedsum_cr", {"cr_form": "cumulative"}, 5, 6)])
def test_communication_per_active_client(name, hp, up, down):
    """Communication (docs/algorithms.md, "Summary"): up 1 vector; down 1 (FedSUM-B, CR; + the scalar C_t of
    the cumulative form), 2 (FedSUM)."""
    cfg = config(name, "run.rounds=3", "participation.pattern=uniform", "participation.clients_per_round=2",
                 **hp)
    for entry in run_single(cfg).metrics:
        assert entry["uplink_floats"] == 2 * up and entry["downlink_floats"] == 2 * down


def test_hparams_are_validated():
    with pytest.raises(ConfigError, match="algorithm.cr_form"):
        resolve(config("fedsum_cr", cr_form="exact"))
    with pytest.raises(ConfigError, match="algorithm.global_lr"):
        resolve(config("fedsum", global_lr=0.0))
    with pytest.raises(ConfigError, match="algorithm.cr_form"):
        resolve(config("fedsum", cr_form="constant"))
