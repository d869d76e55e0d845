"""FedCAda (fedrun's update rule): properties P-C1 .. P-C5 of docs/verification.md."""

from __future__ import annotations

import numpy as np
import torch
from helpers import D, N, bernoulli_trace, client_grads, config, federation, identical_clients, per_round, set_server

from fedrun.algorithms.base import Vector
from fedrun.algorithms.fedcada import ClientAdam, FedCAdaHparams, adjustment


def test_p_c1_k1_full_identical_clients_is_centralized_adam(tmp_path):
    path = identical_clients(tmp_path)
    cfg = config("fedcada", "local.steps=1", "local.lr=0.02", f"data.least_squares.file={path}")
    fed = federation(cfg)
    x = fed.global_model().numpy().copy()
    got = per_round(fed, 15, lambda f: f.global_model().numpy().copy())
    m = np.zeros(D)
    v = np.zeros(D)
    for t in range(15):
        g = client_grads(cfg, x)[0]
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        x = x - 0.02 * (m / (1 - 0.9 ** (t + 1))) / (np.sqrt(v / (1 - 0.999 ** (t + 1))) + 1e-8)
        np.testing.assert_allclose(got[t], x, rtol=0, atol=1e-12)


def test_p_c2_moment_average_identity():
    cfg = config("fedcada", "local.steps=1", "local.lr=0.02")
    trace = bernoulli_trace(10, 0.5, seed=2)
    fed = federation(cfg, trace)
    for t in range(10):
        x, m, v = (fed.server[k].numpy().copy() for k in ("x", "m", "v"))
        fed.round(t)
        if not trace[t].any():
            continue
        g = client_grads(cfg, x)[trace[t]]
        np.testing.assert_allclose(fed.server["m"].numpy(), 0.9 * m + 0.1 * g.mean(0), rtol=0, atol=1e-14)
        np.testing.assert_allclose(fed.server["v"].numpy(), 0.999 * v + 0.001 * (g * g).mean(0), rtol=0, atol=1e-14)


def test_p_c3_adjustment_monotonicity():
    g = torch.Generator().manual_seed(0)
    m, v, u = torch.randn(3, D, generator=g, dtype=torch.float64), torch.rand(3, D, generator=g, dtype=torch.float64), \
        torch.randn(3, D, generator=g, dtype=torch.float64)

    def size(a_m: float, a_v: float) -> torch.Tensor:
        rule = ClientAdam(0.9, 0.999, 1e-8, 4, a_m, a_v)
        return rule.step(0, u, u, {"m": m, "v": v}, None)[0].abs()

    for lo, hi in [(0.0, 0.1), (0.1, 1.0)]:
        assert bool((size(hi, 0.0) <= size(lo, 0.0)).all())
        assert bool((size(0.0, hi) >= size(0.0, lo)).all())
    for kind in ("inv_t", "inv_sqrt_t", "exp"):
        hp = FedCAdaHparams(adjustment=kind)
        a = [adjustment(hp, n, 100) for n in range(2000)]
        assert all(x >= y >= 0 for x, y in zip(a, a[1:], strict=False)) and a[-1] < 0.03
    assert adjustment(FedCAdaHparams(), 5, 100) == 0.0


def test_p_c4_three_vectors_each_way():
    fed = federation(config("fedcada"))
    decl = fed.decl
    assert sum(isinstance(e, Vector) for e in decl.up) == 3
    assert sum(isinstance(e, Vector) for e in decl.down_entries()) == 3
    entry = fed.round(0)
    assert entry["uplink_floats"] == N * 3 * D
    assert entry["downlink_floats"] == N * (3 * D + 1)  # + the applied-round counter


def test_p_c5_clients_are_stateless():
    cfg = config("fedcada", "local.lr=0.02")
    a = federation(cfg, bernoulli_trace(4, 0.5, seed=1))
    b = federation(cfg, bernoulli_trace(4, 0.5, seed=9))
    assert a.decl.client == ()
    for t in range(3):
        a.round(t)
        b.round(t)
    set_server(b, **{k: v.numpy() for k, v in a.server.items()})
    b.state.schedule = a.state.schedule
    a.round(3)
    b.round(3)
    for k in a.server:
        assert torch.equal(a.server[k], b.server[k])
