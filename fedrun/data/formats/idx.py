"""MNIST / Fashion-MNIST: IDX files (optionally gzipped) -> native-endian numpy arrays."""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path

import numpy as np

from fedrun.errors import DataError

# IDX type codes (third byte of the magic number) -> big-endian numpy dtype.
_IDX_TYPES: dict[int, str] = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _read_maybe_gzip(path: Path) -> bytes:
    """The bytes of ``path``, gunzipped when the file starts with the gzip magic number."""
    try:
        with path.open("rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
        if gzipped:
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"missing file: expected {path}") from None
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path}: corrupt or truncated gzip stream ({e})") from e


def read_idx(path: str | Path, ndim: int | None = None) -> np.ndarray:
    """Read one IDX file (``.gz`` or not) into a native-endian array of the shape its header gives.

    ``ndim``, when given, is the number of dimensions the file must have (3 for images, 1 for labels).
    """
    path = Path(path)
    data = _read_maybe_gzip(path)
    if len(data) < 4:
        raise DataError(f"{path}: truncated IDX file ({len(data)} bytes), expected a 4-byte magic number")
    if data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise DataError(f"{path}: bad IDX magic number 0x{data[:4].hex()}, expected 0x0000TTNN "
                        "(TT a type code 08/09/0b/0c/0d/0e, NN the number of dimensions)")
    nd = data[3]
    if ndim is not None and nd != ndim:
        raise DataError(f"{path}: IDX file has {nd} dimensions (magic 0x{data[:4].hex()}), expected {ndim}")
    header = 4 + 4 * nd
    if len(data) < header:
        raise DataError(f"{path}: truncated IDX header, expected {header} bytes, found {len(data)}")
    dims = struct.unpack(f">{nd}I", data[4:header])
    dtype = np.dtype(_IDX_TYPES[data[2]])
    count = math.prod(dims)
    need, have = count * dtype.itemsize, len(data) - header
    if have < need:
        raise DataError(f"{path}: truncated IDX file, expected {need} data bytes for shape {list(dims)}, "
                        f"found {have}")
    if have > need:
        raise DataError(f"{path}: {have - need} unexpected trailing bytes after the {need} data bytes of "
                        f"shape {list(dims)}")
    arr = np.frombuffer(data, dtype=dtype, count=count, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def idx_path(directory: str | Path, stem: str) -> Path:
    """``directory/stem`` or ``directory/stem.gz``, whichever exists."""
    directory = Path(directory)
    candidates = [directory / stem, directory / f"{stem}.gz"]
    for c in candidates:
        if c.is_file():
            return c
    raise DataError(f"missing file: expected {candidates[0]} or {candidates[1]}")


def read_mnist_idx(directory: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MNIST-layout IDX files in ``directory`` -> ``(x_train, y_train, x_test, y_test)``.

    Images are uint8 ``[n, rows, cols]``, labels int64 ``[n]``. Works for MNIST and Fashion-MNIST
    (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``,
    ``t10k-labels-idx1-ubyte``, each optionally ``.gz``).
    """
    out: list[np.ndarray] = []
    for split in ("train", "t10k"):
        ipath = idx_path(directory, f"{split}-images-idx3-ubyte")
        lpath = idx_path(directory, f"{split}-labels-idx1-ubyte")
        images, labels = read_idx(ipath, ndim=3), read_idx(lpath, ndim=1)
        if images.dtype != np.uint8:
            raise DataError(f"{ipath}: expected unsigned-byte images (type code 0x08), got {images.dtype}")
        if labels.dtype != np.uint8:
            raise DataError(f"{lpath}: expected unsigned-byte labels (type code 0x08), got {labels.dtype}")
        if len(labels) != len(images):
            raise DataError(f"{lpath}: {len(labels)} labels, expected {len(images)} (the number of images "
                            f"in {ipath.name})")
        out += [images, labels.astype(np.int64)]
    return out[0], out[1], out[2], out[3]
