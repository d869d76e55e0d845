"""FADAS: properties P-F1 .. P-F6 of docs/verification.md on the server rule."""

from __future__ import annotations

import numpy as np
import torch

from fedrun.algorithms import get_algorithm
from fedrun.algorithms.base import RoundContext
from fedrun.state.store import init_server

D = 4


def rule(name: str, **hp):
    cls = get_algorithm(name)
    alg = cls(cls.Hparams(**hp))
    return alg, init_server(alg.declare().server, torch.zeros(D, dtype=torch.float64))


def ctx(t: int, tau: int = 0) -> RoundContext:
    return RoundContext(round=t, lr=0.1, num_clients=1, num_active=1, local_steps=1, dim=D, max_staleness=tau)


def run(name: str, deltas, taus=None, **hp) -> list[dict[str, torch.Tensor]]:
    alg, server = rule(name, **hp)
    out = []
    for t, d in enumerate(deltas):
        server = alg.server_update(server, {"delta": d}, ctx(t, 0 if taus is None else taus[t]))
        out.append({k: v.clone() for k, v in server.items()})
    return out


def deltas(n: int = 8, seed: int = 0, growing: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(D, generator=g, dtype=torch.float64)
    if growing:
        return [(t + 1) * base for t in range(n)]
    return [torch.randn(D, generator=g, dtype=torch.float64) for _ in range(n)]


def test_p_f1_sync_reduction_to_fedadam():
    ds = deltas(growing=True)
    a = run("fadas", ds, global_lr=0.05, bias_correction=False, eps=1e-3)
    b = run("fedadam", ds, global_lr=0.05, beta2=0.99, tau=1e-3, v_init="zero")
    for sa, sb in zip(a, b, strict=True):
        torch.testing.assert_close(sa["x"], sb["x"], rtol=0, atol=1e-15)


def test_p_f2_delay_factor():
    ds = deltas(1)
    x0 = run("fadas", ds, taus=[0])[0]["x"]
    torch.testing.assert_close(run("fadas", ds, taus=[1])[0]["x"], x0, rtol=0, atol=0)  # tau <= tau_c
    x4, x8 = run("fadas", ds, taus=[4])[0]["x"], run("fadas", ds, taus=[8])[0]["x"]
    torch.testing.assert_close(x8, x4 / 2, rtol=1e-14, atol=0)  # code rule: lambda = 1/tau
    # paper rule with eta = 1e-3: 1/tau >= eta, so the increment is unchanged
    torch.testing.assert_close(run("fadas", ds, taus=[8], delay_rule="min")[0]["x"], x0, rtol=1e-15, atol=0)


def test_p_f3_amsgrad_monotone():
    states = run("fadas", deltas(20, seed=3))
    prev = torch.zeros(D, dtype=torch.float64)
    for s in states:
        assert bool((s["vhat"] >= prev).all()) and bool((s["vhat"] >= s["v"]).all())
        prev = s["vhat"]


def test_p_f4_first_step_is_a_sign_step():
    d = torch.tensor([0.3, -2.0, 0.0, 1e-3], dtype=torch.float64)
    x = run("fadas", [d], global_lr=0.01, eps=1e-30)[0]["x"]
    torch.testing.assert_close(x, 0.01 * torch.sign(d), rtol=1e-12, atol=0)


def test_p_f5_state_independent_of_staleness():
    ds = deltas(10, seed=5)
    a = run("fadas", ds, taus=[0] * 10)
    b = run("fadas", ds, taus=[0, 3, 7, 1, 2, 9, 4, 4, 0, 6])
    for sa, sb in zip(a, b, strict=True):
        for k in ("m", "v", "vhat", "steps"):
            assert torch.equal(sa[k], sb[k])
    assert not torch.equal(a[-1]["x"], b[-1]["x"])


def test_p_f6_scale_invariance():
    ds = deltas(6, seed=7)
    a = run("fadas", ds, eps=0.0)
    b = run("fadas", [3.0 * d for d in ds], eps=0.0)
    for sa, sb in zip(a, b, strict=True):
        torch.testing.assert_close(sb["x"], sa["x"], rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(sb["m"], 3 * sa["m"], rtol=1e-12, atol=0)
        torch.testing.assert_close(sb["vhat"], 9 * sa["vhat"], rtol=1e-12, atol=0)


def test_without_delay_adaptation_lambda_is_one():
    ds = deltas(1)
    np.testing.assert_array_equal(run("fadas", ds, taus=[9], delay_adaptive=False)[0]["x"].numpy(),
                                  run("fadas", ds, taus=[0])[0]["x"].numpy())
