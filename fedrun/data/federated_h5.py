"""``data.name=federated_h5``: TensorFlow Federated's simulation HDF5 layout, read per client on demand.

A train and a test file (``data.federated_h5.train``, ``.test``), each holding one group per client:

    examples/<client_id>/<feature>   [n, ...]  the inputs (``data.federated_h5.feature``, e.g. ``pixels``)
    examples/<client_id>/<label>     [n]       integer class labels (``data.federated_h5.label``)

Clients are the train file's groups in sorted order of their ids (Python's string order: ``"10"`` before
``"9"``); client i's test examples are the test file's group of the same id (per-client evaluation).
The start-up reads only metadata (every group's datasets, checked and bounded, in one pass per file, from the
file's bytes where it can: fedrun/data/federated_h5_index.py) and the labels (checked, for the number of
classes); examples are read, and checked finite, when a client trains or is evaluated. Inputs become
float32, ``[n, H, W]`` images ``[n, 1, H, W]``. The pooled test set of the global evaluation is the test
examples of a seeded sample of ``test_clients`` clients, in client order.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from fedrun.config import DataConfig
from fedrun.data.client_source import ClientSource, sample_clients
from fedrun.data.dataset import TaskData
from fedrun.data.federated_h5_cache import cached_index
from fedrun.data.federated_h5_index import (
    HDF5_ERRORS,
    Members,
    check_examples,
    client_ids,
    hdf5_errors,
    read_bound,
)
from fedrun.errors import DataError

POOL_STREAM = 0x46483554  # "FH5T": the clients whose test examples form the pooled test set


def _open(path: str | None, key: str) -> h5py.File:
    if path is None:
        raise DataError(f"data.federated_h5.{key}: data.name=federated_h5 needs the {key} file, "
                        f"data.federated_h5.{key}=path/to/{key}.h5")
    try:
        f = h5py.File(Path(path).expanduser(), "r")
    except HDF5_ERRORS as exc:
        raise DataError(f"data.federated_h5.{key}={path}: not a readable HDF5 file ({exc})") from None
    try:
        with hdf5_errors(f"{path}: the group 'examples': "):
            examples = f.get("examples")
    except DataError:
        f.close()
        raise
    if not isinstance(examples, h5py.Group):
        f.close()
        raise DataError(f"{path}: no group 'examples'; expected TensorFlow Federated's layout "
                        "examples/<client_id>/<feature>")
    return f


class FederatedH5(ClientSource):
    """The clients of a TFF train/test file pair."""

    resident = False

    def __init__(self, cfg: DataConfig, seed: int) -> None:
        self.cfg = cfg.federated_h5
        self.train, self.test = _open(self.cfg.train, "train"), None
        try:
            self.test = _open(self.cfg.test, "test")
            self._start(cfg.num_clients, seed)
        except DataError:
            self.close()
            raise

    def _start(self, num_clients: int, seed: int) -> None:
        """The client ids, every client indexed and checked once per file, kept in fedrun's cache
        (fedrun.data.federated_h5_index), and the pooled test set."""
        self.ids, links = client_ids(self.train)
        try:
            if len(self.ids) != num_clients:
                raise DataError(f"data.num_clients={num_clients}: {self.cfg.train} has {len(self.ids)} clients; "
                                f"expected data.num_clients={len(self.ids)}")
            cfg = self.cfg
            members = Members(cfg.feature, cfg.label)
            train = cached_index(self.train, cfg.train, self.ids, members, links=links)
        finally:
            if links is not None:
                links.close()
        test = cached_index(self.test, cfg.test, self.ids, members, train.shape)
        self.num_examples, self.test_examples, self.shape = train.counts, test.counts, train.shape
        self.classes = max(train.top, test.top) + 1
        x_probe, y_probe = self.load(np.zeros(1, dtype=np.int64))
        pool = sample_clients(len(self.ids), cfg.test_clients, seed, POOL_STREAM)
        read_bound(self.test_examples[pool], self.shape, cfg.test, "the pooled test set (data.federated_h5."
                   f"test_clients={cfg.test_clients} clients)")
        x_test, y_test = self.load_test(pool)
        self.task = TaskData("federated_h5", x_probe, y_probe, x_test, y_test, self.classes)

    def close(self) -> None:
        """Close the files (a bad file's run closes them before it stops)."""
        for f in (self.train, self.test):
            if f is not None:
                f.close()

    def _read(self, f: h5py.File, path: str, ids: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The examples of clients ``ids`` (indexed and bounded at start-up), inputs checked finite, and what HDF5
        reads checked against the index (``counts``: examples per client; the example shape; the classes): an
        index that does not hold for the file as read now (changed since, or read otherwise) is one line, never
        data of another shape or a label past the classes."""
        xs, ys = [np.zeros((0, *self.shape), dtype=np.float32)], [np.zeros(0, dtype=np.int64)]
        for i in ids:
            cid = self.ids[int(i)]
            with hdf5_errors(f"{path}: client {cid!r}: its examples: "):
                group = f["examples"][cid]
                with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf, refused below
                    x = np.asarray(group[self.cfg.feature][()], dtype=np.float32)
                y = np.asarray(group[self.cfg.label][()], dtype=np.int64)
            n = int(counts[int(i)])
            in_range = ((y >= 0) & (y < self.classes)).all()
            if x.shape != (n, *self.shape) or y.shape not in ((n,), (n, 1)) or not in_range:
                raise DataError(f"{path}: client {cid!r}: read {list(x.shape)} examples and {list(y.shape)} labels "
                                f"in [{y.min(initial=0)}, {y.max(initial=0)}]; the file's index says [{n}, "
                                f"{', '.join(map(str, self.shape))}] and labels in [0, {self.classes}); expected the "
                                "file unchanged since it was indexed")
            check_examples(x, path, cid, self.cfg.feature)
            xs.append(x)
            ys.append(y.reshape(-1))
        x = np.concatenate(xs)
        return (x[:, None] if x.ndim == 3 else x), np.concatenate(ys)

    def load(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._read(self.train, self.cfg.train, ids, self.num_examples)

    def load_test(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._read(self.test, self.cfg.test, ids, self.test_examples)
