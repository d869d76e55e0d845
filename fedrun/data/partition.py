"""Partitioners: which training examples each client holds. Seeded, identical on every rank.

* ``iid``: a seeded shuffle split into N near-equal parts.
* ``dirichlet``: for every class, proportions q ~ Dir(alpha * 1_N) split that class's examples among
  the clients (the scheme of the FedAU/FedAWE codes; the FedSUM paper uses alpha = 0.1, FedAdamom 0.3).
  Draws are repeated until every client holds at least one example.
* ``natural``: the dataset's own groups (LEAF writers, least-squares clients).
* ``shards``: pathological label skew (McMahan et al. 2017): the examples, sorted by label (seeded
  order within a label), are cut into ``N * data.shards_per_client`` contiguous shards of near-equal
  size, and every client receives ``data.shards_per_client`` shards drawn at random without
  replacement. With 2 shards per client most clients see 1 or 2 classes.
* ``size_skew``: quantity skew with i.i.d. labels: client sizes are proportional to lognormal draws
  ``exp(sigma * z_i)``, ``z_i ~ N(0, 1)``, ``sigma = data.size_sigma`` (0 gives equal sizes), rounded by
  largest remainder so that they sum to n with every client holding >= 1 example; each client then
  takes that many examples of a seeded shuffle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedrun.config import DataConfig
from fedrun.data.dataset import ON_DEMAND_HINT, TaskData
from fedrun.data.hashing import hash_keys
from fedrun.errors import ConfigError, DataError, brief

Partitioner = Callable[[TaskData, DataConfig, int], list[np.ndarray]]
_CLIENT_TEST_STREAM = 0xC7E5  # hash_keys(seed, stream, client, row) of the per-client test split


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


def partition_shards(task: TaskData, cfg: DataConfig, seed: int) -> list[np.ndarray]:
    if task.task != "classification":
        raise DataError("data.partition=shards: needs class labels; use iid or natural for regression")
    labels = task.y_train
    num_shards = cfg.num_clients * cfg.shards_per_client
    if num_shards > len(labels):
        raise DataError(f"data.shards_per_client={cfg.shards_per_client}: {cfg.num_clients} clients x "
                        f"{cfg.shards_per_client} shards exceeds the {len(labels)} training examples")
    rng = np.random.default_rng([seed, 0x5A4D])
    shuffled = rng.permutation(len(labels))
    order = shuffled[np.argsort(labels[shuffled], kind="stable")]  # by label, random within a label
    shards = np.array_split(order, num_shards)
    assignment = rng.permutation(num_shards).reshape(cfg.num_clients, cfg.shards_per_client)
    return [np.sort(np.concatenate([shards[s] for s in row])) for row in assignment]


def lognormal_sizes(total: int, num_clients: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Client sizes >= 1 summing to ``total``, proportional to ``exp(sigma * z)`` (largest remainder)."""
    weights = np.exp(sigma * rng.standard_normal(num_clients))
    spare = total - num_clients  # every client first gets one example
    share = weights / weights.sum() * spare
    sizes = np.floor(share).astype(np.int64)
    remainder = spare - int(sizes.sum())
    if remainder:
        sizes[np.argsort(-(share - sizes), kind="stable")[:remainder]] += 1
    return sizes + 1


def partition_size_skew(task: TaskData, cfg: DataConfig, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng([seed, 0x512E])
    sizes = lognormal_sizes(len(task.y_train), cfg.num_clients, cfg.size_sigma, rng)
    order = rng.permutation(len(task.y_train))
    return [np.sort(part) for part in np.split(order, np.cumsum(sizes)[:-1])]


PARTITIONERS: dict[str, Partitioner] = {
    "iid": partition_iid,
    "dirichlet": partition_dirichlet,
    "natural": partition_natural,
    "shards": partition_shards,
    "size_skew": partition_size_skew,
}


def partition(task: TaskData, cfg: DataConfig, seed: int) -> list[np.ndarray]:
    """Index arrays into ``task.x_train``, one per client; every client holds >= 1 example."""
    if cfg.partition not in PARTITIONERS:
        raise ConfigError(f"data.partition: expected one of {', '.join(PARTITIONERS)}, got {brief(cfg.partition)}")
    if cfg.num_clients > len(task.y_train):
        raise DataError(f"data.num_clients={cfg.num_clients}: more clients than the {len(task.y_train)} training "
                        f"examples of data.name={task.name}; {ON_DEMAND_HINT}")
    parts = PARTITIONERS[cfg.partition](task, cfg, seed)
    if min(len(p) for p in parts) == 0:
        raise DataError(f"data.partition={cfg.partition}: a client received no examples")
    return parts


@dataclass
class ClientTests:
    """Per-client test data: client i's test examples are rows ``parts[i]`` of ``x``, ``y`` (its
    held-out training rows, or the test split's rows of its user for LEAF data)."""

    x: np.ndarray
    y: np.ndarray
    parts: list[np.ndarray]


def split_client_tests(task: TaskData, parts: list[np.ndarray], cfg: DataConfig, seed: int,
                       ) -> tuple[list[np.ndarray], ClientTests]:
    """Training rows and test data of every client for per-client evaluation (docs/evaluation.md).

    LEAF data with its own per-user test split (``task.groups_test``, natural partition): client i keeps
    all its training rows and is tested on its user's test rows. Otherwise client i, holding n_i examples,
    holds out m_i = min(n_i - 1, max(1, round(f n_i))) of them (f = ``data.client_test_fraction``; none
    when n_i = 1): the m_i of smallest key h(seed, i, j) over its rows j, a counter-based hash, so the
    split depends on (seed, client) only, never on the number of ranks or the other clients.
    """
    if task.groups_test is not None and cfg.partition == "natural":
        order = np.argsort(task.groups_test, kind="stable")
        cuts = np.searchsorted(task.groups_test[order], np.arange(len(parts) + 1))
        tests = [order[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
        return parts, ClientTests(task.x_test, task.y_test, tests)
    train, test = [], []
    for i, rows in enumerate(parts):
        n = len(rows)
        m = min(n - 1, max(1, int(round(cfg.client_test_fraction * n))))
        held = np.zeros(n, dtype=bool)
        held[np.argsort(hash_keys(seed, _CLIENT_TEST_STREAM, i, np.arange(n)), kind="stable")[:m]] = True
        train.append(rows[~held])
        test.append(rows[held])
    return train, ClientTests(task.x_train, task.y_train, test)
