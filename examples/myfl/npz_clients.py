"""A dataset format read per client on demand: ``NpzClients(cfg, seed)`` is a ``ClientSource``.

``data.root`` holds ``sizes.npy`` (every client's number of training examples, int), ``clients/<i>.npz``
(client i's ``x`` and ``y``) and ``test.npz`` (the pooled test set ``x``, ``y`` and ``num_classes``). A
rank reads the files of the clients that train on it in a round, never the whole dataset, so the run's
memory follows the cohort, not the number of clients; ``data.num_clients`` must equal the files'.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedrun.config import DataConfig
from fedrun.data.client_source import ClientSource
from fedrun.data.dataset import TaskData


class NpzClients(ClientSource):
    resident = False  # read the round's clients each round (True: every rank loads its clients once)
    test_examples = None  # no per-client test sets: the global evaluation uses task.x_test

    def __init__(self, cfg: DataConfig, seed: int) -> None:
        self.root = Path(cfg.root)
        self.num_examples = np.load(self.root / "sizes.npy").astype(np.int64)
        x0, y0 = self.client(0)  # the model is checked on client 0's examples
        with np.load(self.root / "test.npz") as test:
            self.task = TaskData(name="npz_clients", x_train=x0, y_train=y0, x_test=test["x"], y_test=test["y"],
                                 num_classes=int(test["num_classes"]))

    def client(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        with np.load(self.root / "clients" / f"{i}.npz") as z:
            return z["x"], z["y"]

    def load(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The training examples of clients ``ids``, concatenated in the order of ``ids``."""
        parts = [self.client(int(i)) for i in ids]
        if not parts:
            return self.task.x_train[:0], self.task.y_train[:0]
        return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])

    def load_test(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError("npz_clients has no per-client test sets")
