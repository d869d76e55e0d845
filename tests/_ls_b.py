"""Shared helpers of the algos-b tests: the float64 least-squares problem of ALGORITHMS.md section 7.

f_i(x) = 1/(2m) ||A_i x - b_i||^2, N = 6 clients, d = 5, m = 8 rows each, full-batch gradients.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from fedrun.config import config_from_dict
from fedrun.data import load_task
from fedrun.data.partition import partition
from fedrun.federation.loop import Federation
from fedrun.runtime.world import init_world

N, D, ROWS = 6, 5, 8


def config(algorithm: str | dict[str, Any], rounds: int = 20, steps: int = 5, lr: float = 0.2,
           pattern: str = "full", dim: int = D, **local: Any) -> dict[str, Any]:
    algo = {"name": algorithm} if isinstance(algorithm, str) else dict(algorithm)
    return {
        "run": {"rounds": rounds, "dtype": "float64", "device": "cpu", "seed": 3},
        "data": {"name": "least_squares", "num_clients": N, "partition": "natural",
                 "least_squares": {"rows_per_client": ROWS, "dim": dim}},
        "model": {"name": "linear"},
        "local": {"steps": steps, "batch_size": ROWS, "lr": lr, "strategy": "sequential", **local},
        "participation": {"pattern": pattern, "clients_per_round": 3},
        "eval": {"every": 0},
        "algorithm": algo,
    }


def with_algorithm(cfg: dict[str, Any], algorithm: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(cfg)
    out["algorithm"] = dict(algorithm)
    return out


class MaskPattern:
    """A participation pattern replayed from a boolean [T, N] array (same interface as the module's)."""

    def __init__(self, mask: np.ndarray, probabilities: np.ndarray | None = None) -> None:
        self.mask = np.asarray(mask, dtype=bool)
        self.p = probabilities

    def active(self, t: int) -> np.ndarray:
        return self.mask[t].copy()

    def probabilities(self, t: int) -> np.ndarray | None:
        return None if self.p is None else self.p.copy()


def bernoulli_mask(rounds: int, p: float | np.ndarray, seed: int = 11) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(size=(rounds, N)) < np.broadcast_to(p, (N,))


def federation(cfg: dict[str, Any], mask: np.ndarray | None = None) -> Federation:
    fed = Federation(config_from_dict(cfg), init_world("cpu"), None)
    if mask is not None:
        fed.participation = MaskPattern(mask)
    return fed


def run_rounds(fed: Federation, rounds: int, each=None) -> np.ndarray:
    for t in range(rounds):
        fed.round(t)
        if each is not None:
            each(fed, t)
    return fed.global_model().numpy().copy()


def problem(cfg: dict[str, Any]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-client H_i = A_i^T A_i / m and r_i = A_i^T b_i / m, exactly as the runtime partitions them."""
    c = config_from_dict(cfg)
    task = load_task(c.data, c.run.seed)
    hs, rs = [], []
    for idx in partition(task, c.data, c.run.seed):
        a = np.asarray(task.x_train[idx], dtype=np.float64)
        b = np.asarray(task.y_train[idx], dtype=np.float64)
        hs.append(a.T @ a / len(idx))
        rs.append(a.T @ b / len(idx))
    return hs, rs


def x_star(cfg: dict[str, Any]) -> np.ndarray:
    hs, rs = problem(cfg)
    return np.linalg.solve(sum(hs), sum(rs))


def x_fedavg(cfg: dict[str, Any]) -> np.ndarray:
    """x_FA = (I - Mbar)^{-1} cbar with M_i = (I - lr H_i)^K, c_i = sum_k (I - lr H_i)^k lr r_i (item 14)."""
    hs, rs = problem(cfg)
    lr, k = cfg["local"]["lr"], cfg["local"]["steps"]
    eye = np.eye(len(rs[0]))
    ms, cs = [], []
    for h, r in zip(hs, rs, strict=True):
        step = eye - lr * h
        ms.append(np.linalg.matrix_power(step, k))
        cs.append(sum(np.linalg.matrix_power(step, j) for j in range(k)) @ (lr * r))
    return np.linalg.solve(eye - sum(ms) / len(ms), sum(cs) / len(cs))
