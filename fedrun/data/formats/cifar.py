"""CIFAR-10 / CIFAR-100: the "python version" batches (pickles, read by :mod:`fedrun.data.formats.safe_pickle`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedrun.data.formats.safe_pickle import safe_unpickle
from fedrun.errors import DataError


def read_cifar_batch(path: str | Path, label_key: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR "python version" batch -> ``(x uint8 [n, 3, 32, 32], y int64 [n])``.

    The file is a pickled dict with ``b"data"`` (uint8 ``[n, 3072]``, rows of R, G, B planes of 32x32)
    and ``b"labels"`` (CIFAR-10) or ``b"fine_labels"`` (CIFAR-100). str keys are accepted too.
    """
    path = Path(path)
    obj = safe_unpickle(path)
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a pickled dict, got {type(obj).__name__}")
    d = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}
    if "data" not in d or label_key not in d:
        raise DataError(f"{path}: expected keys b'data' and b'{label_key}', found {sorted(map(str, d))}")
    data = d["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        shape = list(data.shape) if isinstance(data, np.ndarray) else type(data).__name__
        dtype = data.dtype if isinstance(data, np.ndarray) else ""
        raise DataError(f"{path}: expected data of shape [n, 3072] uint8, got {shape} {dtype}".rstrip())
    try:
        labels = np.asarray(d[label_key], dtype=np.int64).reshape(-1)
    except (TypeError, ValueError) as e:
        raise DataError(f"{path}: expected {label_key} to be a list of integers ({e})") from e
    if len(labels) != len(data):
        raise DataError(f"{path}: {len(labels)} {label_key}, expected {len(data)} (one per row of data)")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"{path}: expected {label_key} in 0..{num_classes - 1}, "
                        f"found {labels.min()}..{labels.max()}")
    return data.reshape(-1, 3, 32, 32).copy(), labels


def read_cifar10(directory: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``cifar-10-batches-py`` (``data_batch_1`` .. ``data_batch_5``, ``test_batch``) -> train/test arrays."""
    directory = Path(directory)
    parts = [read_cifar_batch(directory / f"data_batch_{i}", "labels", 10) for i in range(1, 6)]
    x_test, y_test = read_cifar_batch(directory / "test_batch", "labels", 10)
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), x_test, y_test)


def read_cifar100(directory: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``cifar-100-python`` (``train``, ``test``) -> train/test arrays with the 100 fine labels."""
    directory = Path(directory)
    x_train, y_train = read_cifar_batch(directory / "train", "fine_labels", 100)
    x_test, y_test = read_cifar_batch(directory / "test", "fine_labels", 100)
    return x_train, y_train, x_test, y_test
