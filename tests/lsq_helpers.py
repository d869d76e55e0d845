"""Shared helpers for algorithm tests on the least-squares task of ALGORITHMS.md section 7.

f_i(x) = 1/(2m) ||A_i x - b_i||^2 with N = 6 clients, d = 5, m = 8 rows each, float64, full-batch
deterministic gradients (local.batch_size >= m). Reusable by every algorithm's tests:

* ``lsq_config(algorithm, **overrides)``: a config dict for ``fedrun.run`` (dotted keys override);
* ``problem(cfg)``: (A [N, m, d], b [N, m]) exactly as the runtime loads them;
* ``x_star(cfg)``: (sum_i A_i^T A_i)^{-1} sum_i A_i^T b_i;
* ``federation(cfg, active=None)``: a single-process ``Federation`` whose rounds can be stepped one by
  one (``fed.round(t)``; server state in ``fed.server``, client state in ``fed.store.tensors``), with
  the participation replaced by a replayed boolean ``[T, N]`` trace when ``active`` is given;
* ``bernoulli_trace(rounds, p, seed)``: an i.i.d. Bernoulli(p) trace (empty rounds allowed).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from fedrun.config import Config, apply_override, config_from_dict
from fedrun.data.builtin import load_least_squares
from fedrun.federation.loop import Federation
from fedrun.runtime.world import World

N, D, M = 6, 5, 8

BASE: dict[str, Any] = {
    "run": {"rounds": 20, "dtype": "float64", "seed": 0, "device": "cpu"},
    "data": {"name": "least_squares", "num_clients": N, "partition": "natural",
             "least_squares": {"rows_per_client": M, "dim": D}},
    "model": {"name": "linear"},
    "local": {"steps": 5, "batch_size": M, "lr": 0.05, "strategy": "sequential"},
    "participation": {"pattern": "full"},
    "eval": {"every": 0},
}


def lsq_config(algorithm: str, *overrides: str, **hparams: Any) -> dict[str, Any]:
    """Config dict for ``algorithm`` with ``section.key=value`` overrides and algorithm hparams."""
    cfg = copy.deepcopy(BASE)
    cfg["algorithm"] = {"name": algorithm, **hparams}
    for item in overrides:
        apply_override(cfg, item)
    return cfg


def resolve(cfg: dict[str, Any] | Config) -> Config:
    return cfg if isinstance(cfg, Config) else config_from_dict(copy.deepcopy(cfg))


def problem(cfg: dict[str, Any] | Config) -> tuple[np.ndarray, np.ndarray]:
    c = resolve(cfg)
    task = load_least_squares(c.data, c.run.seed)
    n, m = c.data.num_clients, c.data.least_squares.rows_per_client
    return task.x_train.reshape(n, m, -1), task.y_train.reshape(n, m)


def x_star(cfg: dict[str, Any] | Config) -> np.ndarray:
    a, b = problem(cfg)
    return np.linalg.solve(np.einsum("nmd,nme->de", a, a), np.einsum("nmd,nm->d", a, b))


def client_grads(cfg: dict[str, Any] | Config, x: np.ndarray) -> np.ndarray:
    """[N, d]: grad f_i(x) = A_i^T (A_i x - b_i) / m."""
    a, b = problem(cfg)
    return np.einsum("nmd,nm->nd", a, np.einsum("nmd,d->nm", a, x) - b) / a.shape[1]


class Replay:
    """Participation from a boolean [T, N] array (same interface as the runtime's patterns)."""

    def __init__(self, active: np.ndarray) -> None:
        self.trace = np.asarray(active, dtype=bool)

    def active(self, t: int) -> np.ndarray:
        return self.trace[t].copy()

    def probabilities(self, t: int) -> None:
        return None


def bernoulli_trace(rounds: int, p: float, seed: int = 1, num_clients: int = N) -> np.ndarray:
    return np.random.default_rng(seed).random((rounds, num_clients)) < p


def single_world() -> World:
    import torch

    return World(rank=0, size=1, local_rank=0, device=torch.device("cpu"), backend="none")


def federation(cfg: dict[str, Any] | Config, active: np.ndarray | None = None) -> Federation:
    fed = Federation(resolve(cfg), single_world(), None)
    if active is not None:
        fed.participation = Replay(active)
    return fed


def run_rounds(fed: Federation, rounds: int, each=None) -> np.ndarray:
    """Step ``rounds`` rounds (calling ``each(fed, t)`` after each one); return the final model."""
    for t in range(rounds):
        fed.round(t)
        if each is not None:
            each(fed, t)
    return fed.global_model().numpy().copy()


def set_server(fed: Federation, **values: Any) -> None:
    """Overwrite server entries and re-pack the downlink the clients read next round."""
    import torch

    for name, value in values.items():
        fed.server[name] = torch.as_tensor(value, dtype=fed.dtype).clone()
    fed.down_layout.pack({**fed.server, "_stop": torch.zeros(1)}, fed.down_buf)


def per_round(fed: Federation, rounds: int, read) -> list[Any]:
    """``read(fed)`` after each of ``rounds`` rounds."""
    out = []
    for t in range(rounds):
        fed.round(t)
        out.append(read(fed))
    return out


def run_single(cfg: dict[str, Any]):
    """``fedrun.run`` on one process without MPI or files; the RunResult."""
    import fedrun

    return fedrun.run(cfg, world=single_world(), write_files=False)
