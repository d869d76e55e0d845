"""FedProx (fedrun/algorithms/fedprox.py) on the float64 least-squares task (docs/verification.md): every
round equals the closed form of K proximal gradient steps averaged by the server; ``mu = 0`` is FedAvg
bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import config, federation, per_round, problem, resolve, run_rounds


def prox_round_map(cfg: dict, mu: float) -> tuple[np.ndarray, np.ndarray]:
    """(Mbar, cbar) with x^(t+1) = Mbar x^(t) + cbar under full participation and global_lr 1.

    K full-batch steps on f_i(x) + mu/2 ||x - x_t||^2 from x_t: x <- B_i x + lr (r_i + mu x_t) with
    B_i = I - lr (H_i + mu I), H_i = A_i^T A_i / m, r_i = A_i^T b_i / m, so
    x_K = (B_i^K + sum_{j<K} B_i^j lr mu) x_t + sum_{j<K} B_i^j lr r_i."""
    c = resolve(cfg)
    a, b = problem(c)
    lr, k, d = c.local.lr, c.local.steps, a.shape[2]
    eye = np.eye(d)
    maps, offsets = [], []
    for ai, bi in zip(a, b, strict=True):
        step = eye - lr * (ai.T @ ai / len(bi) + mu * eye)
        powers = sum(np.linalg.matrix_power(step, j) for j in range(k))
        maps.append(np.linalg.matrix_power(step, k) + powers * lr * mu)
        offsets.append(powers @ (lr * ai.T @ bi / len(bi)))
    return np.mean(maps, axis=0), np.mean(offsets, axis=0)


@pytest.mark.parametrize("mu", [0.1, 2.0])
def test_every_round_equals_the_closed_form(mu):
    cfg = config("fedprox", mu=mu)
    fed = federation(cfg)
    x = fed.global_model().numpy().copy()
    got = per_round(fed, 20)
    mbar, cbar = prox_round_map(cfg, mu)
    for t, x_next in enumerate(got):
        x = mbar @ x + cbar
        np.testing.assert_allclose(x_next, x, rtol=0, atol=1e-12, err_msg=f"round {t + 1}")


@pytest.mark.parametrize("overrides", [(), ("participation.pattern=uniform", "local.momentum=0.5")])
def test_mu_zero_is_fedavg_bit_for_bit(overrides):
    fedavg = run_rounds(federation(config("fedavg", *overrides)), 15)
    fedprox = run_rounds(federation(config("fedprox", *overrides, mu=0.0)), 15)
    assert np.array_equal(fedavg, fedprox)
    assert not np.array_equal(fedavg, run_rounds(federation(config("fedprox", *overrides, mu=0.1)), 15))
