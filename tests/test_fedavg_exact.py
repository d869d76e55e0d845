"""FedAvg against its equations (docs/algorithms.md; docs/verification.md, V1) on float64 least squares."""

from __future__ import annotations

import numpy as np
from helpers import LEAST_SQUARES, problem

import fedrun


def grad(a, b, x):
    return a.T @ (a @ x - b) / len(b)


def test_k1_full_participation_is_gradient_descent():
    cfg = fedrun.load_config(None, [*LEAST_SQUARES, "local.steps=1", "local.lr=0.3", "algorithm.global_lr=0.7",
                                    "participation.pattern=full", "run.rounds=40"])
    a, b = problem(cfg)
    x = np.zeros(a.shape[-1])
    for _ in range(40):
        x = x - 0.7 * 0.3 * np.mean([grad(ai, bi, x) for ai, bi in zip(a, b, strict=True)], axis=0)
    result = fedrun.run(cfg, write_files=False)
    assert result.x.dtype == np.float64
    np.testing.assert_allclose(result.x, x, rtol=0, atol=1e-12)


def test_k_steps_uniform_sampling_matches_reference_loop():
    """K local steps on the sampled clients, uniform average, global lr (reference written from the equation)."""
    overrides = [*LEAST_SQUARES, "local.steps=4", "local.lr=0.2", "algorithm.global_lr=1.5",
                 "participation.pattern=uniform", "participation.clients_per_round=3", "run.rounds=25"]
    cfg = fedrun.load_config(None, overrides)
    a, b = problem(cfg)
    from fedrun.federation.participation import make_participation

    pattern = make_participation(cfg.participation, 6, cfg.run.seed, 25)
    x = np.zeros(a.shape[-1])
    for t in range(25):
        deltas = []
        for i in np.flatnonzero(pattern.active(t)):
            xi = x.copy()
            for _ in range(4):
                xi -= 0.2 * grad(a[i], b[i], xi)
            deltas.append(xi - x)
        x = x + 1.5 * np.mean(deltas, axis=0)
    np.testing.assert_allclose(fedrun.run(cfg, write_files=False).x, x, rtol=0, atol=1e-12)


def test_data_size_weighting():
    """w_i = n_i / sum n_j on a Dirichlet split of synthetic data (unequal sizes), softmax regression."""
    cfg = fedrun.load_config(None, ["data.name=synthetic", "data.synthetic.shape=[6]", "data.num_clients=5",
                                    "data.synthetic.examples_per_client=12", "data.partition=dirichlet",
                                    "model.name=logistic", "run.dtype=float64", "local.batch_size=1000",
                                    "local.steps=2", "local.lr=0.3", "algorithm.weighting=data_size",
                                    "participation.pattern=full", "run.rounds=3", "eval.every=0"])
    from fedrun.data import load_task
    from fedrun.data.partition import partition

    task = load_task(cfg.data, cfg.run.seed)
    parts = partition(task, cfg.data, cfg.run.seed)
    assert len({len(p) for p in parts}) > 1  # unequal sizes, so the weighting matters
    result = fedrun.run(cfg, write_files=False)
    classes, features = task.num_classes, task.x_train.shape[1]
    x = fedrun.run(cfg, overrides=["local.lr=0"], write_files=False).x  # the seeded initial model

    def softmax_grad(x, xs, ys):
        w, bias = x[: classes * features].reshape(classes, features), x[classes * features:]
        z = xs @ w.T + bias
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(ys)), ys] -= 1
        return np.concatenate([(p.T @ xs).ravel(), p.sum(axis=0)]) / len(ys)

    for _ in range(3):
        num, den = 0, 0
        for p in parts:
            xi = x.copy()
            for _ in range(2):
                xi -= 0.3 * softmax_grad(xi, task.x_train[p].astype(np.float64), task.y_train[p])
            num, den = num + len(p) * (xi - x), den + len(p)
        x = x + num / den
    np.testing.assert_allclose(result.x, x, rtol=0, atol=1e-12)
