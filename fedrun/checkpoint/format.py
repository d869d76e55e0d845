"""What the checkpoint writer and reader agree on: the format version, the ``meta`` entries, the groups of a
run's checkpoint, the storable dtypes and strings, and how an OS or HDF5 error reads on one line
(docs/checkpoint.md)."""

from __future__ import annotations

import re

import h5py

FORMAT_VERSION = 2  # 2: schedule/ replaces participation/ and runtime_state/
META_NAMES = ("round", "config", "format_version", "algorithm", "num_clients", "dim", "created")
MANIFEST = "meta/manifest"  # every other dataset with its shape, JSON (files written before it have none)
# the groups of a run's checkpoint, one per part of the run state (fedrun.federation.snapshot names the parts)
SERVER, SCHEDULE, HISTORY, RANDOM, RUNTIME, METRICS, PRIVACY = (
    "server", "schedule", "history", "random", "runtime", "metrics", "privacy")
CLIENTS = "clients"  # the client rows: one entry per per-client table (fedrun.checkpoint.entries)
STRING = h5py.string_dtype("utf-8")
KINDS = "biufcS"  # bool, ints, floats, complex, fixed-length bytes


def rows_path(name: str) -> str:
    """The client ids of entry ``name`` (``clients/<name>``) in the rows form (fedrun.checkpoint.entries)."""
    return f"{name}/rows"


def values_path(name: str) -> str:
    """The rows of entry ``name`` in the rows form, one per client id of :func:`rows_path`."""
    return f"{name}/values"


def error_line(e: BaseException) -> str:
    """The useful part of an OS or HDF5 error, on one line."""
    text = str(e)
    m = re.search(r"error message = '([^']*)'", text)  # HDF5 wraps the OS error of a failed write
    if m:
        return m.group(1)
    if isinstance(e, OSError) and e.strerror and not text.startswith("Unable"):
        return e.strerror
    text = " ".join(text.split())
    return text if len(text) <= 240 else text[:237] + "..."


def is_string(ds: h5py.Dataset) -> bool:
    """Whether ``ds`` holds a UTF-8 string (its CRC is over the string's UTF-8 bytes)."""
    return h5py.check_string_dtype(ds.dtype) is not None and ds.dtype.kind == "O"
