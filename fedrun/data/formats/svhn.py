"""SVHN cropped digits: the MATLAB v5 ``.mat`` files of the release -> ``[n, 3, 32, 32]`` uint8 images."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedrun.errors import DataError


def read_svhn_mat(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """One SVHN cropped-digits file (``train_32x32.mat``, ``test_32x32.mat``) -> ``(x, y)``.

    ``x`` is uint8 ``[n, 3, 32, 32]`` (from the file's ``X [32, 32, 3, n]``); ``y`` is int64 ``[n]``
    with SVHN's label 10 mapped to digit 0.
    """
    import scipy.io

    path = Path(path)
    if not path.is_file():
        raise DataError(f"missing file: expected {path}")
    try:
        mat = scipy.io.loadmat(path, variable_names=["X", "y"])
    except NotImplementedError as e:  # scipy's answer to HDF5-based v7.3 files
        raise DataError(f"{path}: MATLAB v7.3 file, expected the MATLAB v5 .mat of the SVHN release") from e
    except Exception as e:  # scipy raises many types for corrupt files
        raise DataError(f"{path}: unreadable .mat file, expected MATLAB v5 with X and y ({e})") from e
    if "X" not in mat or "y" not in mat:
        raise DataError(f"{path}: expected variables X and y, found {sorted(k for k in mat if k[0] != '_')}")
    x, y = mat["X"], mat["y"]
    if x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.dtype != np.uint8:
        raise DataError(f"{path}: expected X of shape [32, 32, 3, n] uint8, got {list(x.shape)} {x.dtype}")
    n = x.shape[3]
    if y.size != n or (y.ndim == 2 and y.shape[1] != 1) or y.ndim > 2:
        raise DataError(f"{path}: expected y of shape [{n}, 1], got {list(y.shape)}")
    y = y.reshape(-1).astype(np.int64)
    if n and (y.min() < 0 or y.max() > 10):
        raise DataError(f"{path}: expected labels in 1..10 (10 meaning digit 0), found {y.min()}..{y.max()}")
    y[y == 10] = 0
    return np.ascontiguousarray(x.transpose(3, 2, 0, 1)), y
