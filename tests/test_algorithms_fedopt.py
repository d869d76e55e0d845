"""Server optimizers: FedAvgM, FedAdam, FedYogi, FedAdagrad and FedAdamom.

Properties V11, V12 (a-d) and V13 of docs/verification.md, on the server rules directly (hand-made
deltas) and through the runtime on the float64 least-squares problem.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import config, federation, run_single

from fedrun.algorithms import get_algorithm
from fedrun.algorithms.base import RoundContext
from fedrun.algorithms.fedadamom import adaptive_beta1
from fedrun.errors import ConfigError
from fedrun.state.store import init_server

D = 7
B = ("run.seed=3", "local.lr=0.2")  # the least-squares instance and local lr of the runtime tests below


def make(name: str, **hp):
    cls = get_algorithm(name)
    algo = cls(cls.Hparams(**hp))
    algo.hp.check()
    return algo


def ctx(num_active: int = 1) -> RoundContext:
    return RoundContext(round=0, lr=0.1, num_clients=4, num_active=num_active, local_steps=1, dim=D)


def start(algo, x0: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    x0 = torch.zeros(D, dtype=torch.float64) if x0 is None else x0
    return init_server(algo.declare().server, x0)


def step(algo, server, delta, num_active=1):
    """One server rule call for a round whose mean update is ``delta`` (sum = delta * num_active)."""
    return algo.server_update(server, {"delta": delta * num_active}, ctx(num_active))


def deltas(count: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(D, generator=g, dtype=torch.float64) * (1 + k % 3) for k in range(count)]


# ------------------------------------------------------------------------------------ declarations


def test_defaults_follow_the_spec():
    adam, yogi, adagrad = (get_algorithm(n).Hparams() for n in ("fedadam", "fedyogi", "fedadagrad"))
    for hp in (adam, yogi):
        assert (hp.beta1, hp.beta2, hp.tau, hp.v_init, hp.bias_correction) == (0.9, 0.99, 1e-3, "tau_squared",
                                                                                False)
    assert adagrad.beta1 == 0.0 and not hasattr(adagrad, "beta2") and adagrad.v_init == "tau_squared"
    avgm = get_algorithm("fedavgm").Hparams()
    assert (avgm.beta, avgm.global_lr) == (0.9, 1.0)
    mom = get_algorithm("fedadamom").Hparams()
    assert (mom.beta2, mom.eps, mom.global_lr) == (0.05, 1e-3, 1.0)
    v = start(make("fedadam"))["v"]
    assert torch.equal(v, torch.full((D,), 1e-6, dtype=torch.float64))
    assert torch.equal(start(make("fedyogi", v_init="zero"))["v"], torch.zeros(D, dtype=torch.float64))


@pytest.mark.parametrize("name", ["fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedadamom"])
def test_one_vector_each_way(name):
    decl = make(name).declare()
    assert decl.floats(decl.up, 100) == 100 and decl.floats(decl.down_entries(), 100) == 100
    assert decl.client == ()


def test_bad_hyperparameters_name_the_field():
    with pytest.raises(ConfigError, match="algorithm.beta2"):
        run_single(config("fedyogi", *B, beta2=1.0))
    with pytest.raises(ConfigError, match="algorithm.v_init"):
        run_single(config("fedadam", *B, v_init="ones"))
    with pytest.raises(ConfigError, match="algorithm.eps"):
        run_single(config("fedadamom", *B, eps=0.0))


@pytest.mark.parametrize("name", ["fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedadamom"])
def test_empty_round_changes_nothing(name):
    algo = make(name)
    server = start(algo)
    for d in deltas(3):
        server = step(algo, server, d)
    after = algo.server_update(server, {"delta": torch.zeros(D, dtype=torch.float64)}, ctx(0))
    assert all(torch.equal(after[k], server[k]) for k in server)  # no step, no moment decay


# ---------------------------------------------------------------------------------------- V11


def test_fedavgm_beta0_is_fedavg_with_server_lr():
    common = (*B, "run.rounds=12", "participation.pattern=uniform")
    x_m = run_single(config("fedavgm", *common, beta=0.0, global_lr=0.7)).x
    x_a = run_single(config("fedavg", *common, global_lr=0.7)).x
    assert np.abs(x_m - x_a).max() < 1e-12


def test_fedavgm_is_undamped_heavy_ball():
    algo = make("fedavgm", beta=0.5, global_lr=2.0)
    server, m = start(algo), torch.zeros(D, dtype=torch.float64)
    for d in deltas(4):
        x_before = server["x"]
        server = step(algo, server, d, num_active=3)
        m = 0.5 * m + d
        assert torch.allclose(server["x"] - x_before, 2.0 * m, rtol=0, atol=1e-14)


# ---------------------------------------------------------------------------------------- V13


def test_fedadam_beta0_is_sign_step():
    algo = make("fedadam", beta1=0.0, beta2=0.0, tau=0.0, v_init="zero", global_lr=0.3)
    server = start(algo)
    for d in deltas(5):
        x_before = server["x"]
        server = step(algo, server, d, num_active=2)
        assert torch.allclose(server["x"] - x_before, 0.3 * torch.sign(d), rtol=0, atol=1e-15)


def test_fedadam_sign_step_through_the_runtime():
    fed = federation(config("fedadam", *B, "run.rounds=4", beta1=0.0, beta2=0.0, tau=0.0, v_init="zero",
                            global_lr=0.05))
    for t in range(4):
        x_before = fed.server["x"].clone()
        fed.round(t)
        assert torch.allclose((fed.server["x"] - x_before).abs(), torch.full_like(x_before, 0.05), atol=1e-15)


def test_fedyogi_v_stays_nonnegative_with_steps_of_zero_or_one_minus_beta2_delta_squared():
    algo = make("fedyogi", beta2=0.75, v_init="zero")
    server = start(algo)
    ones = torch.ones(D, dtype=torch.float64)
    # 2 -> v = 0.25 * 4 = 1 exactly; then Delta^2 = v: sign(0) = 0, v unchanged
    seq = [2.0 * ones, ones, *deltas(30, seed=1)]
    zero_steps = 0
    for d in seq:
        v_before = server["v"]
        server = step(algo, server, d)
        change = (server["v"] - v_before).abs()
        assert bool((server["v"] >= 0).all())
        scale = 1e-15 * float(torch.maximum(v_before, server["v"]).max())  # rounding of the subtraction
        assert bool(((change == 0) | torch.isclose(change, 0.25 * d * d, rtol=1e-12, atol=scale)).all())
        zero_steps += int((change == 0).sum())
    assert zero_steps >= D


def test_fedadagrad_v_is_nondecreasing():
    algo = make("fedadagrad")
    server = start(algo)
    for d in deltas(20, seed=2):
        v_before = server["v"]
        server = step(algo, server, d)
        assert bool((server["v"] >= v_before).all())
        assert torch.allclose(server["v"], v_before + d * d, rtol=1e-15, atol=0)


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad"])
def test_adaptive_rules_are_scale_invariant(name):
    algo = make(name, tau=0.0, v_init="zero", beta1=0.5)
    c = 37.0
    a, b = start(algo), start(algo)
    for d in deltas(12, seed=3):
        xa, xb = a["x"], b["x"]
        a, b = step(algo, a, d), step(algo, b, c * d)
        assert torch.allclose(b["x"] - xb, a["x"] - xa, rtol=1e-12, atol=1e-15)
        assert torch.allclose(b["m"], c * a["m"], rtol=1e-12, atol=0)
        assert torch.allclose(b["v"], c * c * a["v"], rtol=1e-12, atol=0)


def test_bias_correction_makes_the_first_adam_step_a_unit_step():
    algo = make("fedadam", bias_correction=True, v_init="zero", tau=1e-3, global_lr=0.5)
    d = deltas(1)[0]
    out = step(algo, start(algo), d)
    assert torch.allclose(out["x"], 0.5 * d / (d.abs() + 1e-3), rtol=1e-13, atol=0)
    assert float(out["steps"]) == 1.0
    plain = step(make("fedadam", v_init="zero", tau=1e-3, global_lr=0.5), start(algo), d)
    assert torch.allclose(plain["x"], 0.5 * 0.1 * d / (0.1 * d.abs() + 1e-3), rtol=1e-13, atol=0)


# ---------------------------------------------------------------------------------------- V12


def test_fedadamom_equal_magnitudes_give_fedavg_steps():
    """(a) |Delta_s| equal across coordinates for all s: v constant, beta1_t = 0, x += eta Delta_t."""
    algo = make("fedadamom", global_lr=0.8)
    server = start(algo)
    signs = torch.sign(deltas(1, seed=4)[0])
    for scale in (1.0, -2.0, 0.5, 3.0):
        d = scale * signs
        x_before = server["x"]
        server = step(algo, server, d, num_active=3)
        # exactly 0 in exact arithmetic; mean() of equal floats may round by one ulp
        assert float(adaptive_beta1(server["v"], 1e-3).abs().max()) <= 1e-15
        assert torch.allclose(server["x"] - x_before, 0.8 * d, rtol=0, atol=1e-14)


def test_fedadamom_in_one_dimension_is_fedavg_with_server_lr():
    """(a) through the runtime: d = 1 makes v constant across coordinates."""
    common = (*B, "run.rounds=10", "participation.pattern=uniform", "data.least_squares.dim=1")
    x_m = run_single(config("fedadamom", *common, global_lr=0.6)).x
    x_a = run_single(config("fedavg", *common, global_lr=0.6)).x
    assert x_m.shape == (1,) and abs(x_m[0] - x_a[0]) < 1e-12


def test_fedadamom_beta1_range_argmax_and_zero_mean():
    """(b) beta1_t in [0, 1 - eps]; the max-v coordinate gets 0; unclipped 1 - v/vbar has mean 0."""
    g = torch.Generator().manual_seed(5)
    for _ in range(20):
        v = torch.rand(D, generator=g, dtype=torch.float64) ** 4
        beta1 = adaptive_beta1(v, 1e-3)
        assert bool((beta1 >= 0).all()) and bool((beta1 <= 1 - 1e-3).all())
        assert float(beta1[v.argmax()]) == 0.0
        assert bool((beta1[v >= v.mean()] == 0).all())
        assert abs(float((1 - v / v.mean()).mean())) < 1e-15
    assert torch.equal(adaptive_beta1(torch.tensor([0.0, 0.0, 1e-12], dtype=torch.float64), 0.25)[:2],
                       torch.full((2,), 0.75, dtype=torch.float64))


def test_fedadamom_momentum_is_bounded_by_past_deltas():
    """(c) ||m_t||_inf <= max_{s<=t} ||Delta_s||_inf."""
    algo = make("fedadamom")
    server, bound = start(algo), 0.0
    for d in deltas(25, seed=6):
        server = step(algo, server, d)
        bound = max(bound, float(d.abs().max()))
        assert float(server["m"].abs().max()) <= bound * (1 + 1e-15)


def test_fedadamom_is_scale_equivariant():
    """(d) Delta -> c Delta: the beta1_t sequence is unchanged; m and every x-increment scale by c."""
    algo = make("fedadamom", global_lr=1.3)
    c = 0.125
    a, b = start(algo), start(algo)
    for d in deltas(15, seed=7):
        xa, xb = a["x"], b["x"]
        a, b = step(algo, a, d), step(algo, b, c * d)
        beta_a, beta_b = adaptive_beta1(a["v"], 1e-3), adaptive_beta1(b["v"], 1e-3)
        assert torch.allclose(beta_b, beta_a, rtol=1e-12, atol=1e-15)
        assert torch.allclose(b["m"], c * a["m"], rtol=1e-12, atol=1e-16)
        assert torch.allclose(b["x"] - xb, c * (a["x"] - xa), rtol=1e-12, atol=1e-16)


def test_fedadamom_updates_v_before_beta1_and_guards_zero_vbar():
    algo = make("fedadamom", beta2=0.05)
    server = start(algo)
    zero = torch.zeros(D, dtype=torch.float64)
    out = step(algo, server, zero)  # vbar = 0: beta1 = 0 instead of 0/0
    assert all(bool(torch.isfinite(out[k]).all()) for k in out) and torch.equal(out["x"], zero)
    d = deltas(1, seed=8)[0]
    out = step(algo, out, d)
    v = 0.05 * 0 + 0.95 * d * d  # v <- beta2 v + (1 - beta2) Delta^2, before beta1_t is formed
    beta1 = (1 - v / v.mean()).clamp(0, 1 - 1e-3)
    assert torch.allclose(out["v"], v, rtol=1e-15, atol=0)
    assert torch.allclose(out["m"], (1 - beta1) * d, rtol=1e-13, atol=0)
    assert torch.allclose(out["x"], out["m"], rtol=0, atol=0)


def test_data_size_weighting_averages_by_examples():
    from fedrun.algorithms.base import Clients, LocalResult

    algo = make("fedavgm", beta=0.0, weighting="data_size")
    assert [e.name for e in algo.declare().up] == ["delta", "weight"]
    x = torch.zeros(D, dtype=torch.float64)
    d = torch.stack(deltas(3, seed=9))
    n = torch.tensor([1.0, 2.0, 5.0], dtype=torch.float64)
    clients = Clients(ids=torch.arange(3), num_examples=n, participations=torch.zeros(3),
                      last_active=-torch.ones(3))
    local = LocalResult(x_end=x + d, grad_mean=d, loss=torch.zeros(3, dtype=torch.float64))
    up, _ = algo.client_finish({"x": x}, {}, local, clients, ctx(3))
    out = algo.server_update(start(algo), {k: v.sum(dim=0) for k, v in up.items()}, ctx(3))
    assert torch.allclose(out["x"], (n.unsqueeze(1) * d).sum(dim=0) / 8.0, rtol=1e-14, atol=0)
