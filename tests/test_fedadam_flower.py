"""``bias_correction: flower``: fedrun's FedAdam against a transcription of Flower's FedAdam update.

Source transcribed: flwr 1.42.0 (PyPI wheel), ``FedAdam.aggregate_fit`` in
flwr/server/strategy/fedadam.py (the same rule is ``FedAdam.aggregate_train`` in
flwr/serverapp/strategy/fedadam.py). Per round, with Flower's ``server_round`` counted from 1:

    delta_t  = weighted mean of the client models (weights num_examples) - current_weights
    m_t      = beta_1 m_t + (1 - beta_1) delta_t            (m_t, v_t start at zeros)
    v_t      = beta_2 v_t + (1 - beta_2) delta_t^2
    eta_norm = eta * sqrt(1 - beta_2^(server_round + 1)) / (1 - beta_1^(server_round + 1))
    current  = current + eta_norm * m_t / (sqrt(v_t) + tau)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedrun.algorithms import get_algorithm
from fedrun.algorithms.base import RoundContext
from fedrun.config import config_from_dict
from fedrun.errors import ConfigError
from fedrun.state.store import init_server

D, ROUNDS, CLIENTS = 9, 20, 3
HP = {"global_lr": 0.1, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}


def flower_fedadam(x0: np.ndarray, offsets: list[np.ndarray], weights: list[np.ndarray],
                   eta: float, beta_1: float, beta_2: float, tau: float) -> list[np.ndarray]:
    """Flower 1.42's FedAdam, one entry per round. In round r each client returns the model
    current + offsets[r][i] (a client that trained from the current model) with num_examples weights[r][i]."""
    current, m_t, v_t, out = x0.copy(), None, None, []
    for server_round, (off, w) in enumerate(zip(offsets, weights, strict=True), start=1):
        client_models = current + off
        aggregate = (w[:, None] * client_models).sum(0) / w.sum()  # Flower's num_examples-weighted mean
        delta_t = aggregate - current
        if not m_t:
            m_t = [np.zeros_like(delta_t)]
        m_t = [np.multiply(beta_1, m_t[0]) + (1 - beta_1) * delta_t]
        if not v_t:
            v_t = [np.zeros_like(delta_t)]
        v_t = [beta_2 * v_t[0] + (1 - beta_2) * np.multiply(delta_t, delta_t)]
        eta_norm = eta * np.sqrt(1 - np.power(beta_2, server_round + 1.0)) / (1 - np.power(beta_1, server_round + 1.0))
        current = current + eta_norm * m_t[0] / (np.sqrt(v_t[0]) + tau)
        out.append(current)
    return out


def fedrun_fedadam(x0: np.ndarray, offsets: list[np.ndarray], weights: list[np.ndarray],
                   **hp) -> list[np.ndarray]:
    """fedrun's FedAdam server rule on the same rounds: each client uploads n_i Delta_i and n_i
    (``weighting: data_size``); the runtime sums the uploads over the round's participants."""
    cls = get_algorithm("fedadam")
    algo = cls(cls.Hparams(**hp, weighting="data_size"))
    algo.hp.check()
    server = init_server(algo.declare().server, torch.as_tensor(x0))
    out = []
    for t, (off, w) in enumerate(zip(offsets, weights, strict=True)):
        up = {"delta": torch.as_tensor((w[:, None] * off).sum(0)), "weight": torch.tensor(w.sum())}
        ctx = RoundContext(round=t, lr=0.1, num_clients=CLIENTS, num_active=CLIENTS, local_steps=1, dim=D)
        server = algo.server_update(server, up, ctx)
        out.append(server["x"].numpy().copy())
    return out


def rounds_of_clients(seed: int = 0) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """x0 and, per round, the clients' model changes and example counts."""
    rng = np.random.default_rng(seed)
    x0 = rng.normal(size=D)
    offsets = [rng.normal(scale=0.1 * (1 + r % 4), size=(CLIENTS, D)) for r in range(ROUNDS)]
    weights = [rng.integers(10, 200, size=CLIENTS).astype(np.float64) for _ in range(ROUNDS)]
    return x0, offsets, weights


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("seed", [0, 1])
def test_flower_bias_correction_reproduces_flower_fedadam(seed):
    x0, offsets, weights = rounds_of_clients(seed)
    ref = flower_fedadam(x0, offsets, weights, HP["global_lr"], HP["beta1"], HP["beta2"], HP["tau"])
    got = fedrun_fedadam(x0, offsets, weights, **HP, v_init="zero", bias_correction="flower")
    assert max_diff(ref, got) < 1e-13


def test_identical_deltas_twenty_rounds_only_flower_matches():
    """20 rounds in which every client returns the same change: ``flower`` matches Flower to rounding;
    the uncorrected form and Adam's 1/(1 - beta^n) on m and v do not."""
    x0, offsets, weights = rounds_of_clients(0)
    same = [offsets[0]] * ROUNDS
    ref = flower_fedadam(x0, same, weights, HP["global_lr"], HP["beta1"], HP["beta2"], HP["tau"])
    assert max_diff(ref, fedrun_fedadam(x0, same, weights, **HP, v_init="zero", bias_correction="flower")) < 1e-13
    for other in (False, True):
        assert max_diff(ref, fedrun_fedadam(x0, same, weights, **HP, v_init="zero", bias_correction=other)) > 1e-2


def test_default_is_unchanged_and_flower_is_fedadam_only():
    assert get_algorithm("fedadam").Hparams().bias_correction is False
    base = {"data": {"name": "synthetic"}, "model": {"name": "logistic"}}
    cfg = config_from_dict({**base, "algorithm": {"name": "fedadam", "bias_correction": "flower"}})
    assert cfg.algorithm.hparams.bias_correction == "flower"
    with pytest.raises(ConfigError, match="bias_correction"):
        config_from_dict({**base, "algorithm": {"name": "fedyogi", "bias_correction": "flower"}})
    with pytest.raises(ConfigError, match="bias_correction"):
        config_from_dict({**base, "algorithm": {"name": "fedadam", "bias_correction": "adam"}})
