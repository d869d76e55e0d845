"""The index of a ``federated_h5`` file (fedrun/data/federated_h5_index.py) kept in fedrun's cache directory
(``$XDG_CACHE_HOME/fedrun``, else ``~/.cache/fedrun``): a file is indexed once, and again when it changes.

The key is the file's real path, size, modification time, inode and status change time, with the feature and
label names: the change time is what an edit in place cannot set back (``os.utime`` restores the modification
time and sets the change time to now). And the key is not all: each use of the index is checked against what HDF5
then reads (a client's count and example shape, its labels inside the classes; fedrun/data/federated_h5.py), so
an index that no longer holds is one line when its client is read, never data of another shape.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import h5py
import numpy as np

from fedrun.data.federated_h5_index import ClientIndex, ClientLinks, Members, index_clients

INDEX_VERSION = 2  # of the cached index's content: a change of what is checked bumps it


def cache_dir() -> Path:
    """Where fedrun keeps indexes of data files: ``$XDG_CACHE_HOME/fedrun``, else ``~/.cache/fedrun``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fedrun"


def cached_index(f: h5py.File, path: str, ids: list[str], members: Members, shape: tuple[int, ...] | None = None,
                 links: ClientLinks | None = None) -> ClientIndex:
    """:func:`index_clients` of file ``f``, from the cache when this very file (the module docstring's key) was
    indexed before with the same names; else indexed and cached. A cache that cannot be read or written is
    ignored (the file is indexed as if none were kept)."""
    st = os.stat(path)
    key = json.dumps([os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino,
                      members.feature, members.label, None if shape is None else list(shape), len(ids),
                      INDEX_VERSION])
    where = cache_dir() / f"h5index_{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz"
    try:
        with np.load(where, allow_pickle=False) as z:
            if str(z["key"]) == key and len(z["counts"]) == len(ids):
                return ClientIndex(z["counts"].astype(np.int64), tuple(int(v) for v in z["shape"]), int(z["top"]))
    except (OSError, KeyError, ValueError):
        pass
    index = index_clients(f, path, ids, members, shape, links)
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        temporary = where.with_name(f".{where.stem}.{os.getpid()}.npz")
        np.savez(temporary, key=key, counts=index.counts, shape=np.array(index.shape, dtype=np.int64),
                 top=index.top)
        os.replace(temporary, where)
    except OSError:
        pass
    return index
