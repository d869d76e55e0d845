"""MIFA, FedVARP, FedAU and FedAWE on float64 least squares.

Properties of docs/verification.md: V4-V7 (reductions to FedAvg), V9 (FedVARP invariant), V14/V16 (the biased
fixed point x_FA), V18 (FedAU's expected update), plus the per-round bookkeeping of each algorithm.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from helpers import (
    N,
    assert_tracks_clients,
    bernoulli_trace,
    client_grads,
    config,
    federation,
    run_rounds,
    run_single,
    x_fedavg,
    x_star,
)

from fedrun.algorithms import get_algorithm
from fedrun.algorithms.base import Clients, LocalResult, RoundContext
from fedrun.algorithms.fedau import interval_weight

MEMORY_LIKE = [
    {"name": "mifa"},
    {"name": "mifa", "form": "paper"},
    {"name": "fedvarp"},
    {"name": "fedvarp", "form": "paper"},
    {"name": "fedau"},
    {"name": "fedawe", "clip": None},
]


B = ("run.seed=3", "local.lr=0.2")  # the least-squares instance and local lr these tests were written on


def ids(algos):
    return ["-".join(str(v) for v in a.values()) for a in algos]


# ----------------------------------------------------------------------------- reductions to FedAvg


@pytest.mark.parametrize(("steps", "rounds"), [(5, 15), (1, 10)], ids=["K5", "K1"])
@pytest.mark.parametrize("algo", MEMORY_LIKE, ids=ids(MEMORY_LIKE))
def test_full_participation_equals_fedavg(algo, steps, rounds):
    """V5, V6, V7: every memory is refreshed each round, omega = 1, c_i = 1 and x~_i = x; with K = 1
    this is V4 for these algorithms."""
    common = (*B, f"run.rounds={rounds}", f"local.steps={steps}", "local.lr=0.3")
    assert np.abs(run_single(config(algo, *common)).x - run_single(config("fedavg", *common)).x).max() < 1e-12


# ------------------------------------------------------------------------- fixed point x_FA (14/16)


CONVERGENCE = [("fedavg", "full"), ("mifa", "full"), ("mifa", "bernoulli"), ("fedvarp", "full"),
               ("fedvarp", "bernoulli")]


@pytest.mark.parametrize(("name", "pattern"), CONVERGENCE)
def test_converges_to_the_biased_fedavg_point(name, pattern):
    """FedAvg (full), MIFA and FedVARP (full and Bernoulli(0.5)) reach x_FA = (I - Mbar)^{-1} cbar != x*."""
    rounds = 100
    cfg = config(name, *B, f"run.rounds={rounds}", "local.steps=5", "local.lr=0.3")
    mask = bernoulli_trace(rounds, 0.5, seed=11) if pattern == "bernoulli" else None
    x = run_rounds(federation(cfg, mask), rounds)
    x_fa, x_opt = x_fedavg(cfg), x_star(cfg)
    print(f"{name}/{pattern}: ||x - x_FA|| = {np.linalg.norm(x - x_fa):.1e}, "
          f"||x_FA - x*|| = {np.linalg.norm(x_fa - x_opt):.3f}")
    assert np.linalg.norm(x_fa - x_opt) > 0.1  # drift bias: K = 5 and heterogeneous H_i
    assert np.linalg.norm(x - x_fa) < 1e-12


# ------------------------------------------------------------------------------------------- MIFA


def test_mifa_code_form_steps_on_empty_rounds_and_others_do_not():
    mask = bernoulli_trace(6, 0.6, seed=11)
    mask[3] = False
    for algo, moves in [("mifa", True), ("fedvarp", False), ("fedau", False), ("fedawe", False)]:
        fed = federation(config(algo, *B, "run.rounds=6"), mask)
        run_rounds(fed, 3)
        before = fed.server["x"].clone()
        fed.round(3)
        assert (not torch.equal(fed.server["x"], before)) == moves, algo
        if algo == "mifa":  # the stale memory average: x += eta_g (1/N) sum_i G_i
            g_mean = fed.store.tensors["g"].mean(dim=0)
            assert torch.allclose(fed.server["x"] - before, g_mean, rtol=0, atol=1e-14)


def test_mifa_memory_sum_matches_client_memories():
    mask = bernoulli_trace(12, 0.4, seed=11)
    fed = federation(config("mifa", *B, "run.rounds=12"), mask)
    assert_tracks_clients(fed, 12, "g_sum", "g", "sum", atol=1e-13)


def test_mifa_paper_form_equals_code_form_for_constant_lr():
    mask = bernoulli_trace(20, 0.4, seed=5)
    xs = [run_rounds(federation(config("mifa", *B, "run.rounds=20", form=form), mask), 20)
          for form in ("code", "paper")]
    assert np.abs(xs[0] - xs[1]).max() < 1e-12
    decayed = [run_rounds(federation(config("mifa", *B, "run.rounds=20", "local.lr_schedule=inv_sqrt", form=form),
                                     mask), 20) for form in ("code", "paper")]
    assert np.abs(decayed[0] - decayed[1]).max() > 1e-6  # normalized memories differ once eta_l(t) varies


def test_mifa_paper_form_waits_until_every_client_reported():
    mask = np.ones((8, N), dtype=bool)
    mask[:4, -1] = False  # the last client first reports in round 4
    fed = federation(config("mifa", *B, "run.rounds=8", form="paper", wait_all=True), mask)
    x0 = fed.server["x"].clone()
    for t in range(4):
        fed.round(t)
        assert torch.equal(fed.server["x"], x0)
        assert float(fed.server["reported"]) == N - 1
    fed.round(4)
    assert float(fed.server["reported"]) == N and not torch.equal(fed.server["x"], x0)
    decl = fed.decl
    assert decl.floats(decl.up, 5) == 6  # one vector and one first-report flag


# ----------------------------------------------------------------------------------------- FedVARP


def test_fedvarp_mean_memory_invariant_every_round():
    """V9: Ybar = (1/N) sum_i Y_i after every round, with empty rounds in the pattern."""
    mask = bernoulli_trace(25, 0.3, seed=2)
    assert not mask.any(axis=1).all()  # at least one empty round
    fed = federation(config("fedvarp", *B, "run.rounds=25"), mask)
    assert_tracks_clients(fed, 25, "y_mean", "y", "mean", atol=1e-14)


def test_fedvarp_uses_old_memories():
    """v = Ybar + mean_{S_t}(Delta_i - Y_i^old), checked against a direct replay of the round."""
    mask = bernoulli_trace(6, 0.5, seed=4)
    mask[5] = [True, True, False, False, True, False]
    fed = federation(config("fedvarp", *B, "run.rounds=6"), mask)
    run_rounds(fed, 5)
    x, y_old, y_mean = fed.server["x"].clone(), fed.store.tensors["y"].clone(), fed.server["y_mean"].clone()
    fed.round(5)
    active = torch.as_tensor(mask[5])
    delta = fed.store.tensors["y"][active]  # Y_i <- Delta_i for the participants
    v = y_mean + (delta - y_old[active]).mean(dim=0)
    assert torch.allclose(fed.server["x"], x + v, rtol=0, atol=1e-14)
    assert torch.equal(fed.store.tensors["y"][~active], y_old[~active])


# --------------------------------------------------------------------------------------------- FedAU


def test_fedau_weights_are_the_mean_intervals_of_a_periodic_pattern():
    periods = np.array([1, 2, 3, 1, 2, 4])
    rounds = 13
    mask = np.array([[t % p == p - 1 for p in periods] for t in range(rounds)])
    fed = federation(config("fedau", *B, f"run.rounds={rounds}"), mask)
    run_rounds(fed, rounds)
    omega = interval_weight(fed.store.tensors).numpy()
    assert np.array_equal(omega, periods.astype(float))


def test_fedau_reads_the_weight_before_recording_the_current_interval():
    algo = get_algorithm("fedau")(get_algorithm("fedau").Hparams(cutoff=3))
    state = {k: torch.zeros(2, dtype=torch.float64) for k in ("gap", "interval_sum", "interval_count")}
    ctx = RoundContext(round=0, lr=0.1, num_clients=2, num_active=1, local_steps=1, dim=1)
    history = [[False, False], [False, False], [True, False], [True, False], [False, False]]
    weights = []
    for row in history:
        weights.append(float(interval_weight(state)[0]))  # what client 0 would upload with
        state = algo.after_round({}, state, torch.tensor(row), ctx)
    assert weights == [1.0, 1.0, 1.0, 3.0, 2.0]  # intervals 3, then 1: mean 2
    # client 1 never participates: the cutoff records an interval of 3 at t = 2
    assert state["interval_sum"][1] == 3 and state["interval_count"][1] == 1 and state["gap"][1] == 2


def test_fedau_interval_estimates_approach_inverse_probabilities():
    """With no cutoff, omega_i -> E[interval] = 1/p_i under independent Bernoulli participation."""
    p = np.array([0.9, 0.5, 0.4, 0.3, 0.2, 0.15])
    algo = get_algorithm("fedau")(get_algorithm("fedau").Hparams(cutoff=None))
    state = {k: torch.zeros(N, dtype=torch.float64) for k in ("gap", "interval_sum", "interval_count")}
    ctx = RoundContext(round=0, lr=0.1, num_clients=N, num_active=0, local_steps=1, dim=1)
    for row in bernoulli_trace(6000, p, seed=9):
        state = algo.after_round({}, state, torch.as_tensor(row), ctx)
    omega = interval_weight(state).numpy()
    assert np.all(np.abs(omega * p - 1) < 0.06), omega * p


def test_fedau_expected_update_is_unbiased_with_inverse_probability_weights():
    """V18, exactly: enumerate all 2^N participation sets (K = 1, independent Bernoulli p_i).

    With omega_i = 1/p_i (FedAU's limit) the expected server step is -eta_g eta_l grad f(x); FedAvg's
    average_all step is -eta_g eta_l (1/N) sum_i p_i grad f_i(x), biased toward frequent clients.
    """
    cfg = config("fedau", *B, "local.steps=1")
    periods = np.array([1.0, 2.0, 3.0, 4.0, 2.0, 5.0])
    p = 1 / periods
    lr, eta_g = 0.1, 0.5
    x = torch.linspace(-1, 1, 5, dtype=torch.float64)
    grads = torch.as_tensor(client_grads(cfg, x.numpy()))
    local = LocalResult(x_end=x - lr * grads, grad_mean=grads, loss=torch.zeros(N, dtype=torch.float64))
    state = {"gap": torch.zeros(N, dtype=torch.float64), "interval_sum": torch.as_tensor(periods),
             "interval_count": torch.ones(N, dtype=torch.float64)}
    fedau = get_algorithm("fedau")(get_algorithm("fedau").Hparams(global_lr=eta_g))
    avg_cls = get_algorithm("fedavg")
    fedavg = avg_cls(avg_cls.Hparams(global_lr=eta_g, weighting="average_all"))
    expected = {"fedau": torch.zeros(5, dtype=torch.float64), "fedavg": torch.zeros(5, dtype=torch.float64)}
    for members in itertools.product([False, True], repeat=N):
        s = torch.tensor(members)
        prob = float(np.prod(np.where(members, p, 1 - p)))
        rows = s.nonzero().flatten()
        sub = LocalResult(x_end=local.x_end[rows], grad_mean=grads[rows], loss=local.loss[rows])
        clients = Clients(ids=rows, num_examples=torch.full((len(rows),), 8.0, dtype=torch.float64),
                          participations=torch.zeros(len(rows)), last_active=-torch.ones(len(rows)))
        ctx = RoundContext(round=0, lr=lr, num_clients=N, num_active=len(rows), local_steps=1, dim=5)
        for name, algo in (("fedau", fedau), ("fedavg", fedavg)):
            up, _ = algo.client_finish({"x": x}, {k: v[rows] for k, v in state.items()}, sub, clients, ctx)
            sums = {k: v.sum(dim=0) for k, v in up.items()}
            expected[name] += prob * (algo.server_update({"x": x}, sums, ctx)["x"] - x)
    full_gradient_step = -eta_g * lr * grads.mean(dim=0)
    biased_step = -eta_g * lr * (torch.as_tensor(p).unsqueeze(1) * grads).mean(dim=0)
    assert torch.allclose(expected["fedau"], full_gradient_step, rtol=0, atol=1e-14)
    assert torch.allclose(expected["fedavg"], biased_step, rtol=0, atol=1e-14)
    assert torch.linalg.vector_norm(biased_step - full_gradient_step) > 1e-2


# -------------------------------------------------------------------------------------------- FedAWE


def test_fedawe_echo_counter_and_own_model_bookkeeping():
    rounds = 9
    mask = bernoulli_trace(rounds, 0.35, seed=6)
    mask[:, 0] = False  # a client that is never seen
    fed = federation(config("fedawe", *B, f"run.rounds={rounds}", clip=0.5), mask)
    x0 = fed.server["x"].clone()
    last = np.full(N, -1)
    history = []

    def check(fed, t):
        history.append(fed.server["x"].clone())
        last[mask[t]] = t
        assert np.array_equal(fed.store.tensors["echo"].numpy(), (t + 1 - last).astype(float))
        for i in range(N):
            expected = x0 if last[i] < 0 else history[last[i]]
            assert torch.equal(fed.store.tensors["x_own"][i], expected)

    run_rounds(fed, rounds, check)
    assert fed.up_floats == 2 * 5 and fed.down_floats == 5


def test_fedawe_round_rule_with_echo_and_clip():
    """x <- mean_{S_t} x~_i + eta_g CLIP_r(mean_{S_t} c_i (x_end - x~_i)), training from x~_i."""
    mask = np.zeros((4, N), dtype=bool)
    mask[0, :3] = True
    mask[3, 1:5] = True
    for clip in (0.05, None):
        cfg = config("fedawe", *B, "run.rounds=4", clip=clip, global_lr=0.9)
        fed = federation(cfg, mask)
        run_rounds(fed, 3)
        x_own = fed.store.tensors["x_own"].clone()
        echo = fed.store.tensors["echo"].clone()
        assert echo.tolist() == [3.0, 3.0, 3.0, 4.0, 4.0, 4.0]
        active = torch.as_tensor(mask[3])
        # replay the local training of round 3 from each participant's own model
        ends = []
        for i in np.flatnonzero(mask[3]):
            y = x_own[i].numpy().copy()
            for _ in range(5):
                y = y - 0.2 * client_grads(cfg, y)[i]
            ends.append(torch.as_tensor(y))
        u = (echo[active].unsqueeze(1) * (torch.stack(ends) - x_own[active])).mean(dim=0)
        if clip is not None:
            assert float(u.norm()) > clip
            u = u * clip / u.norm()
        fed.round(3)
        assert torch.allclose(fed.server["x"], x_own[active].mean(dim=0) + 0.9 * u, rtol=0, atol=1e-13)
        assert fed.up_floats == (5 if clip is None else 10)
