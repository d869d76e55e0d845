"""Partitioners: which training examples each client holds. Seeded, identical on every rank.

* ``iid``: a seeded shuffle split into N near-equal parts.
* ``dirichlet``: for every class, proportions q ~ Dir(alpha * 1_N) split that class's examples among
  the clients (the scheme of the FedAU/FedAWE codes; the FedSUM paper uses alpha = 0.1, FedAdamom 0.3).
  Draws are repeated until every client holds at least one example.
* ``natural``: the dataset's own groups (LEAF writers, least-squares clients).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedrun.config import DataConfig
from fedrun.data.dataset import TaskData
from fedrun.data.errors import DataError

Partitioner = Callable[[TaskData, DataConfig, int], list[np.ndarray]]


def partition_iid(task: TaskData, cfg: DataConfig, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng([seed, 0x11D])
    order = rng.permutation(len(task.y_train))
    return [np.sort(part) for part in np.array_split(order, cfg.num_clients)]


def partition_dirichlet(task: TaskData, cfg: DataConfig, seed: int, attempts: int = 100) -> list[np.ndarray]:
    if task.task != "classification":
        raise DataError("data.partition=dirichlet: needs class labels; use iid or natural for regression")
    rng = np.random.default_rng([seed, 0xD1C])
    labels = task.y_train
    n = cfg.num_clients
    for _ in range(attempts):
        parts: list[list[np.ndarray]] = [[] for _ in range(n)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            q = rng.dirichlet(np.full(n, cfg.alpha))
            cuts = (np.cumsum(q)[:-1] * len(idx)).astype(int)
            for i, chunk in enumerate(np.split(idx, cuts)):
                parts[i].append(chunk)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in out) >= 1:
            return out
    raise DataError(f"data.alpha={cfg.alpha}: a Dirichlet split of {len(labels)} examples over "
                    f"{n} clients left a client empty in {attempts} draws; raise alpha or lower num_clients")


def partition_natural(task: TaskData, cfg: DataConfig, seed: int) -> list[np.ndarray]:
    if task.groups is None:
        raise DataError(f"data.partition=natural: dataset {task.name} has no natural clients")
    groups = np.unique(task.groups)
    if len(groups) != cfg.num_clients:
        raise DataError(f"data.num_clients={cfg.num_clients}: dataset {task.name} has {len(groups)} "
                        "natural clients")
    order = np.argsort(task.groups, kind="stable")
    cuts = np.searchsorted(task.groups[order], groups[1:])
    return list(np.split(order, cuts))


PARTITIONERS: dict[str, Partitioner] = {
    "iid": partition_iid,
    "dirichlet": partition_dirichlet,
    "natural": partition_natural,
}


def partition(task: TaskData, cfg: DataConfig, seed: int) -> list[np.ndarray]:
    """Index arrays into ``task.x_train``, one per client; every client holds >= 1 example."""
    if cfg.partition not in PARTITIONERS:
        raise DataError(f"data.partition: expected one of {', '.join(sorted(PARTITIONERS))}, "
                        f"got {cfg.partition!r}")
    if cfg.num_clients > len(task.y_train):
        raise DataError(f"data.num_clients={cfg.num_clients}: more clients than the "
                        f"{len(task.y_train)} training examples")
    parts = PARTITIONERS[cfg.partition](task, cfg, seed)
    if min(len(p) for p in parts) == 0:
        raise DataError(f"data.partition={cfg.partition}: a client received no examples")
    return parts
