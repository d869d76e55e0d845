"""``data.name=federated_h5``: TensorFlow Federated's simulation HDF5 layout, read per client on demand.

A train and a test file (``data.federated_h5.train``, ``.test``), each holding one group per client:

    examples/<client_id>/<feature>   [n, ...]  the inputs (``data.federated_h5.feature``, e.g. ``pixels``)
    examples/<client_id>/<label>     [n]       integer class labels (``data.federated_h5.label``)

Clients are the train file's groups in sorted order of their ids (Python's string order: ``"10"`` before
``"9"``); client i's test examples are the test file's group of the same id (per-client evaluation).
The start-up reads only metadata (every group's dataset shapes, checked) and the labels (for the number
of classes); examples are read when a client trains or is evaluated. Inputs become float32, ``[n, H, W]``
images ``[n, 1, H, W]``. The pooled test set of the global evaluation is the test examples of a seeded
sample of ``test_clients`` clients, in client order.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from fedrun.config import DataConfig
from fedrun.data.client_source import ClientSource, sample_clients
from fedrun.data.dataset import TaskData
from fedrun.errors import DataError

POOL_STREAM = 0x46483554  # "FH5T": the clients whose test examples form the pooled test set


def _open(path: str | None, key: str) -> h5py.File:
    if path is None:
        raise DataError(f"data.federated_h5.{key}: data.name=federated_h5 needs the {key} file, "
                        f"data.federated_h5.{key}=path/to/{key}.h5")
    try:
        f = h5py.File(Path(path).expanduser(), "r")
    except (OSError, ValueError) as exc:
        raise DataError(f"data.federated_h5.{key}={path}: not a readable HDF5 file ({exc})") from None
    if not isinstance(f.get("examples"), h5py.Group):
        f.close()
        raise DataError(f"{path}: no group 'examples'; expected TensorFlow Federated's layout "
                        "examples/<client_id>/<feature>")
    return f


class FederatedH5(ClientSource):
    """The clients of a TFF train/test file pair."""

    resident = False

    def __init__(self, cfg: DataConfig, seed: int) -> None:
        self.cfg = cfg.federated_h5
        self.train, self.test = _open(self.cfg.train, "train"), _open(self.cfg.test, "test")
        self.ids = sorted(self.train["examples"].keys())
        if len(self.ids) != cfg.num_clients:
            raise DataError(f"data.num_clients={cfg.num_clients}: {self.cfg.train} has {len(self.ids)} clients; "
                            f"expected data.num_clients={len(self.ids)}")
        self.num_examples, top = self._check(self.train, self.cfg.train)
        self.test_examples, top_test = self._check(self.test, self.cfg.test)
        x_probe, y_probe = self.load(np.zeros(1, dtype=np.int64))
        x_test, y_test = self.load_test(sample_clients(len(self.ids), self.cfg.test_clients, seed, POOL_STREAM))
        self.task = TaskData("federated_h5", x_probe, y_probe, x_test, y_test, max(top, top_test) + 1)

    def _check(self, f: h5py.File, path: str) -> tuple[np.ndarray, int]:
        """Every client's examples in file ``f``: (their counts, the largest label); one line naming the file,
        client and field for a missing group or feature, an empty client or mismatched lengths."""
        feature, label = self.cfg.feature, self.cfg.label
        counts, top = np.zeros(len(self.ids), dtype=np.int64), 0
        examples = f["examples"]
        for i, cid in enumerate(self.ids):
            group = examples.get(cid)
            if not isinstance(group, h5py.Group):
                raise DataError(f"{path}: client {cid!r}: no group examples/{cid} (the train file has it); "
                                "expected every train client in the test file")
            for key, name in (("feature", feature), ("label", label)):
                if not isinstance(group.get(name), h5py.Dataset):
                    raise DataError(f"{path}: client {cid!r}: no dataset examples/{cid}/{name}; expected "
                                    f"data.federated_h5.{key}={name!r} in every client group")
            n, m = len(group[feature]), len(group[label])
            if n != m:
                raise DataError(f"{path}: client {cid!r}: examples/{cid}/{feature} has {n} rows but "
                                f"examples/{cid}/{label} has {m}; expected one label per example")
            if n == 0:
                raise DataError(f"{path}: client {cid!r}: examples/{cid}/{feature} has no examples; expected "
                                "at least one")
            labels = group[label][()]
            if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
                raise DataError(f"{path}: client {cid!r}: examples/{cid}/{label} holds {labels.dtype} values "
                                f"from {labels.min()}; expected integer class labels >= 0")
            counts[i], top = n, max(top, int(labels.max()))
        return counts, top

    def _read(self, f: h5py.File, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        for i in ids:
            group = f["examples"][self.ids[int(i)]]
            xs.append(np.asarray(group[self.cfg.feature][()], dtype=np.float32))
            ys.append(np.asarray(group[self.cfg.label][()], dtype=np.int64).reshape(-1))
        if not xs:
            shape = self.train["examples"][self.ids[0]][self.cfg.feature].shape[1:]
            xs, ys = [np.zeros((0, *shape), dtype=np.float32)], [np.zeros(0, dtype=np.int64)]
        x = np.concatenate(xs)
        return (x[:, None] if x.ndim == 3 else x), np.concatenate(ys)

    def load(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._read(self.train, ids)

    def load_test(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._read(self.test, ids)
