"""LEAF JSON (FEMNIST, Shakespeare): the users of a directory of JSON files, and their arrays; Shakespeare's
80-character vocabulary."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedrun.errors import DataError

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


def read_leaf_dir(directory: str | Path) -> list[LeafUser]:
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
