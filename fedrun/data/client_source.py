"""Where the examples of each client come from: the seam between a dataset and a rank's client block.

A :class:`ClientSource` knows N, every client's number of training and test examples (int arrays of
N, the only per-client facts held), and loads the examples of given clients on request. Two kinds:

* resident (:class:`ArraySource`, every in-memory dataset after its partition): a rank's block copies
  its clients' examples onto the device once, at start-up, as it always has;
* on demand (``federated_h5``, ``synthetic_fedprox``): nothing per example is held; each round the block
  loads the examples of the clients that train in it, so memory follows the cohort, not N.

Client i's examples come back in the same order whichever other clients are loaded with it, so the
minibatches (a function of seed, round and client id) are the same on any number of ranks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from fedrun.data.dataset import TaskData
from fedrun.data.hashing import hash_keys
from fedrun.data.partition import ClientTests


class ClientSource(ABC):
    """The per-client examples of a dataset. ``task`` gives the facts the model is built from (name, input
    shape, classes, task kind) and the pooled test set ``x_test``, ``y_test`` of the global evaluation; for
    an on-demand source its ``x_train``, ``y_train`` hold client 0's training examples only, for the model
    check."""

    resident: bool  # True: a block loads its clients once and keeps them
    task: TaskData
    num_examples: np.ndarray  # [N] int64 training examples of each client
    test_examples: np.ndarray | None  # [N] int64 test examples of each client; None: no per-client tests

    @property
    def num_clients(self) -> int:
        return len(self.num_examples)

    @abstractmethod
    def load(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The training examples (x, y) of clients ``ids``, concatenated in the order of ``ids``."""

    @abstractmethod
    def load_test(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The test examples (x, y) of clients ``ids``, concatenated in the order of ``ids``."""


def _rows(parts: list[np.ndarray], ids: np.ndarray) -> np.ndarray:
    return np.concatenate([parts[i] for i in ids]) if len(ids) else np.zeros(0, dtype=np.int64)


def take_rows(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``array[rows]``; a contiguous run of rows is a view, so a memory-mapped dataset is not copied."""
    if len(rows) and rows[-1] - rows[0] + 1 == len(rows) and bool((np.diff(rows) == 1).all()):
        return array[rows[0]:rows[-1] + 1]
    return array[rows]


class ArraySource(ClientSource):
    """An in-memory dataset cut into clients: client i's training examples are rows ``parts[i]`` of
    ``task.x_train``; its test examples rows ``tests.parts[i]`` of ``tests.x`` (per-client evaluation)."""

    resident = True

    def __init__(self, task: TaskData, parts: list[np.ndarray], tests: ClientTests | None) -> None:
        self.task, self.parts, self.tests = task, parts, tests
        self.num_examples = np.array([len(p) for p in parts], dtype=np.int64)
        self.test_examples = None if tests is None else np.array([len(p) for p in tests.parts], dtype=np.int64)

    def load(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = _rows(self.parts, ids)
        return take_rows(self.task.x_train, rows), self.task.y_train[rows]

    def load_test(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = _rows(self.tests.parts, ids)
        return self.tests.x[rows], self.tests.y[rows]


def sample_clients(num_clients: int, count: int | None, seed: int, stream: int) -> np.ndarray:
    """A seeded sample of ``count`` of the clients 0..N-1 (all for None or count >= N), sorted: the clients of
    smallest hash key h(seed, stream, i), so the sample is a function of (seed, stream) alone."""
    if count is None or count >= num_clients:
        return np.arange(num_clients, dtype=np.int64)
    keys = hash_keys(seed, stream, np.arange(num_clients))
    return np.sort(np.argpartition(keys, count)[:count]).astype(np.int64)

