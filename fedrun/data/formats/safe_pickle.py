"""Pickled dataset files read with a restricted unpickler: only plain containers and numpy arrays, no
other global (``os.system``, ``builtins.eval``, arbitrary classes) is ever called."""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedrun.errors import DataError, UnsafePickleError


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


def safe_unpickle(path: str | Path) -> Any:
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
