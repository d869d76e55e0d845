"""Readers for the standard on-disk dataset formats.

Every reader returns plain numpy arrays (images as uint8 ``[n, C, H, W]`` or float32 already in
[0, 1], labels as int64) and raises :class:`~fedrun.errors.DataError` with a one-line message
naming the file and what was expected. Scaling, normalization and the choice of directories under
``data.root`` are left to :mod:`fedrun.data.sources`.

Formats: MNIST / Fashion-MNIST IDX (optionally gzipped), SVHN cropped digits ``.mat``, CIFAR-10 /
CIFAR-100 "python version" batches (pickles, read with a restricted unpickler), the Tiny-ImageNet
folder layout, and LEAF JSON (FEMNIST, Shakespeare).
"""

from __future__ import annotations

import gzip
import importlib
import json
import math
import pickle
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedrun.errors import DataError, UnsafePickleError

PathLike = str | Path

# ---------------------------------------------------------------------------------------------- IDX

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


def read_idx(path: PathLike, ndim: int | None = None) -> np.ndarray:
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


def idx_path(directory: PathLike, stem: str) -> Path:
    """``directory/stem`` or ``directory/stem.gz``, whichever exists."""
    directory = Path(directory)
    candidates = [directory / stem, directory / f"{stem}.gz"]
    for c in candidates:
        if c.is_file():
            return c
    raise DataError(f"missing file: expected {candidates[0]} or {candidates[1]}")


def read_mnist_idx(directory: PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
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


# ---------------------------------------------------------------------------------------------- SVHN


def read_svhn_mat(path: PathLike) -> tuple[np.ndarray, np.ndarray]:
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


# --------------------------------------------------------------------------------------------- CIFAR


def _numpy_attr(submodule: str, name: str) -> Callable[..., Any]:
    """``numpy._core.<submodule>.<name>`` (numpy 2), else ``numpy.core.<submodule>.<name>`` (numpy 1)."""
    for prefix in ("numpy._core", "numpy.core"):
        try:
            return getattr(importlib.import_module(f"{prefix}.{submodule}"), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"numpy has no {submodule}.{name}")


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    """The ``_codecs.encode(str, 'latin1')`` call Python 3 emits for bytes in protocol-2 pickles."""
    if not isinstance(text, str) or encoding.replace("-", "").replace("_", "").lower() != "latin1":
        raise UnsafePickleError(f"_codecs.encode is allowed only as encode(str, 'latin1'), got {encoding!r}")
    return text.encode("latin1")


# The only globals a CIFAR batch file may name: numpy's array and dtype reconstruction. (Lists, dicts,
# bytes, str and ints need no globals.) _frombuffer is numpy's protocol-5 array form and _codecs.encode
# Python 3's protocol-2 bytes form; both appear when a batch is re-saved by a newer Python.
_PICKLE_ALLOWED: dict[tuple[str, str], Callable[[], Any]] = {
    ("numpy.core.multiarray", "_reconstruct"): lambda: _numpy_attr("multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"): lambda: _numpy_attr("multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"): lambda: _numpy_attr("numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"): lambda: _numpy_attr("numeric", "_frombuffer"),
    ("numpy", "ndarray"): lambda: np.ndarray,
    ("numpy", "dtype"): lambda: np.dtype,
    ("_codecs", "encode"): lambda: _latin1_encode,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        factory = _PICKLE_ALLOWED.get((module, name))
        if factory is None:
            raise UnsafePickleError(f"{module}.{name}")
        return factory()

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(f"persistent id {pid!r}")


def safe_unpickle(path: PathLike) -> Any:
    """Unpickle ``path`` allowing only dicts, lists, tuples, bytes, str, numbers and numpy arrays.

    Bytes of Python 2 pickles stay bytes (``encoding="bytes"``, as the CIFAR files need). Any other
    global (``os.system``, ``builtins.eval``, arbitrary classes) raises DataError before it is called.
    Arrays of object dtype are refused too.
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            obj = _RestrictedUnpickler(f, encoding="bytes").load()
    except FileNotFoundError:
        raise DataError(f"missing file: expected {path}") from None
    except UnsafePickleError as e:
        raise DataError(f"{path}: refusing to unpickle, it references {e} (only plain containers and "
                        "numpy arrays are allowed)") from None
    except Exception as e:  # truncated or corrupt streams raise many types
        raise DataError(f"{path}: corrupt or truncated pickle ({type(e).__name__}: {e})") from e
    _reject_object_arrays(obj, path)
    return obj


def _reject_object_arrays(obj: Any, path: Path, depth: int = 0) -> None:
    if depth > 8:
        raise DataError(f"{path}: pickle nested deeper than expected for a dataset batch")
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject:
            raise DataError(f"{path}: refusing an array of object dtype (expected numeric arrays)")
    elif isinstance(obj, dict):
        for v in obj.values():
            _reject_object_arrays(v, path, depth + 1)
    elif isinstance(obj, list | tuple):
        # label lists are long lists of ints: only recurse into the containers among them
        for v in obj:
            if isinstance(v, np.ndarray | dict | list | tuple):
                _reject_object_arrays(v, path, depth + 1)


def read_cifar_batch(path: PathLike, label_key: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
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


def read_cifar10(directory: PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``cifar-10-batches-py`` (``data_batch_1`` .. ``data_batch_5``, ``test_batch``) -> train/test arrays."""
    directory = Path(directory)
    parts = [read_cifar_batch(directory / f"data_batch_{i}", "labels", 10) for i in range(1, 6)]
    x_test, y_test = read_cifar_batch(directory / "test_batch", "labels", 10)
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), x_test, y_test)


def read_cifar100(directory: PathLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``cifar-100-python`` (``train``, ``test``) -> train/test arrays with the 100 fine labels."""
    directory = Path(directory)
    x_train, y_train = read_cifar_batch(directory / "train", "fine_labels", 100)
    x_test, y_test = read_cifar_batch(directory / "test", "fine_labels", 100)
    return x_train, y_train, x_test, y_test


# ------------------------------------------------------------------------------------- Tiny-ImageNet

_JPEG_SUFFIXES = {".jpeg", ".jpg"}


def _read_rgb(path: Path, size: int) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as im:
            if im.size != (size, size):
                raise DataError(f"{path}: expected a {size}x{size} image, got {im.size[0]}x{im.size[1]}")
            arr = np.asarray(im.convert("RGB"))  # a few Tiny-ImageNet images are grayscale
    except DataError:
        raise
    except FileNotFoundError:
        raise DataError(f"missing file: expected {path}") from None
    except Exception as e:  # PIL: UnidentifiedImageError, OSError("image file is truncated"), ...
        raise DataError(f"{path}: unreadable image, expected a {size}x{size} JPEG ({e})") from e
    return arr.transpose(2, 0, 1)


def read_tiny_imagenet(
    directory: PathLike, image_size: int = 64
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """The ``tiny-imagenet-200`` folder -> ``(x_train, y_train, x_val, y_val, wnids)``.

    Class ``i`` is the ``i``-th line of ``wnids.txt``. Training images are
    ``train/<wnid>/images/*.JPEG``; the labelled validation split (``val/val_annotations.txt``, tab
    separated ``file  wnid  x0 y0 x1 y1``, images in ``val/images/``) serves as the test split, since
    the ``test/`` folder has no labels. Images are uint8 ``[n, 3, image_size, image_size]``.
    """
    directory = Path(directory)
    wnids_path = directory / "wnids.txt"
    try:
        wnids = [w.strip() for w in wnids_path.read_text().splitlines() if w.strip()]
    except FileNotFoundError:
        raise DataError(f"missing file: expected {wnids_path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{wnids_path}: unreadable, expected one WordNet id per line ({e})") from e
    if not wnids:
        raise DataError(f"{wnids_path}: empty, expected one WordNet id per line")
    if len(set(wnids)) != len(wnids):
        raise DataError(f"{wnids_path}: duplicate WordNet ids, expected each class once")
    index = {w: i for i, w in enumerate(wnids)}

    train_files: list[tuple[Path, int]] = []
    for w, i in index.items():
        folder = directory / "train" / w / "images"
        if not folder.is_dir():
            raise DataError(f"missing directory: expected {folder} (class {w} of {wnids_path.name})")
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in _JPEG_SUFFIXES)
        if not files:
            raise DataError(f"{folder}: no .JPEG images, expected the training images of class {w}")
        train_files += [(p, i) for p in files]

    ann = directory / "val" / "val_annotations.txt"
    val_files: list[tuple[Path, int]] = []
    try:
        lines = ann.read_text().splitlines()
    except FileNotFoundError:
        raise DataError(f"missing file: expected {ann}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{ann}: unreadable, expected lines 'file wnid x0 y0 x1 y1' ({e})") from e
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        fields = line.split("\t") if "\t" in line else line.split()
        if len(fields) < 2:
            raise DataError(f"{ann}:{lineno}: expected 'file<TAB>wnid<TAB>x0<TAB>y0<TAB>x1<TAB>y1'")
        if fields[1] not in index:
            raise DataError(f"{ann}:{lineno}: WordNet id {fields[1]!r} is not in {wnids_path.name}")
        val_files.append((directory / "val" / "images" / fields[0], index[fields[1]]))

    def load(files: list[tuple[Path, int]]) -> tuple[np.ndarray, np.ndarray]:
        x = np.empty((len(files), 3, image_size, image_size), dtype=np.uint8)
        for k, (p, _) in enumerate(files):
            x[k] = _read_rgb(p, image_size)
        return x, np.array([i for _, i in files], dtype=np.int64)

    x_train, y_train = load(train_files)
    x_val, y_val = load(val_files)
    return x_train, y_train, x_val, y_val, wnids


# ---------------------------------------------------------------------------------------------- LEAF

# The 80 characters of LEAF's Shakespeare vocabulary: newline, space, punctuation, digits and letters.
SHAKESPEARE_CHARS = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
SHAKESPEARE_UNK = len(SHAKESPEARE_CHARS)  # index 80: any character outside the vocabulary
SHAKESPEARE_VOCAB_SIZE = SHAKESPEARE_UNK + 1  # 81 token ids (and classes of the next-char task)
SHAKESPEARE_SEQ_LEN = 80

_CHAR_TABLE = np.full(128, SHAKESPEARE_UNK, dtype=np.int64)
_CHAR_TABLE[[ord(c) for c in SHAKESPEARE_CHARS]] = np.arange(len(SHAKESPEARE_CHARS))


def encode_chars(text: str) -> np.ndarray:
    """Token ids of ``text`` over :data:`SHAKESPEARE_CHARS` (unknown characters -> SHAKESPEARE_UNK)."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return np.where(codes < 128, _CHAR_TABLE[np.minimum(codes, 127)], SHAKESPEARE_UNK)


@dataclass
class LeafUser:
    """One LEAF user's raw samples, and the file they came from."""

    name: str
    x: list[Any]
    y: list[Any]
    file: Path


def read_leaf_dir(directory: PathLike) -> list[LeafUser]:
    """All users of the LEAF JSON files ``directory/*.json`` (sorted by file name, then file order).

    Each file is ``{"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}``.
    """
    directory = Path(directory)
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    if not files:
        raise DataError(f"missing files: expected LEAF JSON files {directory}/*.json")
    users: list[LeafUser] = []
    for f in files:
        try:
            with f.open("rb") as fh:
                doc = json.load(fh)
        except json.JSONDecodeError as e:
            raise DataError(f"{f}: bad JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"{f}: unreadable, expected LEAF JSON ({e})") from e
        if not isinstance(doc, dict) or not isinstance(doc.get("users"), list) \
                or not isinstance(doc.get("user_data"), dict):
            raise DataError(f"{f}: expected a LEAF JSON object with 'users' (list) and 'user_data' (object)")
        counts = doc.get("num_samples")
        if counts is not None and (not isinstance(counts, list) or len(counts) != len(doc["users"])):
            raise DataError(f"{f}: expected 'num_samples' to be a list with one count per user")
        for k, name in enumerate(doc["users"]):
            data = doc["user_data"].get(name)
            if not isinstance(data, dict) or not isinstance(data.get("x"), list) \
                    or not isinstance(data.get("y"), list):
                raise DataError(f"{f}: user {name!r} needs user_data[{name!r}] with lists 'x' and 'y'")
            x, y = data["x"], data["y"]
            if len(x) != len(y):
                raise DataError(f"{f}: user {name!r} has {len(x)} x and {len(y)} y, expected equal counts")
            if counts is not None and counts[k] != len(y):
                raise DataError(f"{f}: user {name!r} has {len(y)} samples, num_samples says {counts[k]}")
            users.append(LeafUser(str(name), x, y, f))
    return users


def femnist_arrays(users: list[LeafUser]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LEAF FEMNIST users -> ``(x float32 [n, 1, 28, 28], y int64 [n], user index int64 [n])``.

    ``x`` keeps LEAF's pixel values (floats in [0, 1]); labels are the 62 classes (digits, upper,
    lower case letters).
    """
    xs, ys, gs = [], [], []
    for g, u in enumerate(users):
        try:
            x = np.asarray(u.x, dtype=np.float32)
            y = np.asarray(u.y, dtype=np.int64)
        except (TypeError, ValueError) as e:
            raise DataError(f"{u.file}: user {u.name!r}: expected x as lists of 784 numbers and y as "
                            f"integers ({e})") from e
        if len(u.x) and (x.ndim != 2 or x.shape[1] != 784):
            raise DataError(f"{u.file}: user {u.name!r}: expected x of shape [n, 784] (28x28 pixels), "
                            f"got {list(x.shape)}")
        if y.ndim != 1 or (len(y) and (y.min() < 0 or y.max() >= 62)):
            raise DataError(f"{u.file}: user {u.name!r}: expected y as integers in 0..61")
        xs.append(x.reshape(-1, 1, 28, 28))
        ys.append(y)
        gs.append(np.full(len(y), g, dtype=np.int64))
    return _cat(xs, (0, 1, 28, 28), np.float32), _cat(ys, (0,), np.int64), _cat(gs, (0,), np.int64)


def shakespeare_arrays(
    users: list[LeafUser], seq_len: int = SHAKESPEARE_SEQ_LEN
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LEAF Shakespeare users -> ``(x int64 [n, seq_len], y int64 [n], user index int64 [n])``.

    ``x`` are strings of ``seq_len`` characters and ``y`` the single next character, both encoded with
    :func:`encode_chars`.
    """
    xs, ys, gs = [], [], []
    for g, u in enumerate(users):
        if not all(isinstance(s, str) and len(s) == seq_len for s in u.x):
            raise DataError(f"{u.file}: user {u.name!r}: expected every x to be a string of {seq_len} "
                            "characters")
        if not all(isinstance(c, str) and len(c) == 1 for c in u.y):
            raise DataError(f"{u.file}: user {u.name!r}: expected every y to be a single character")
        xs.append(encode_chars("".join(u.x)).reshape(-1, seq_len))
        ys.append(encode_chars("".join(u.y)))
        gs.append(np.full(len(u.y), g, dtype=np.int64))
    return _cat(xs, (0, seq_len), np.int64), _cat(ys, (0,), np.int64), _cat(gs, (0,), np.int64)


def _cat(parts: list[np.ndarray], empty_shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(empty_shape, dtype)
