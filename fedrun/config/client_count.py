"""``data.num_clients`` of a ``federated_h5`` config that leaves it out: the train file's number of client
groups, read when the config is (the file's count need not be restated; docs/datasets.md), listed as the run
lists them: from the file's bytes (fedrun.hdf5), damage refused before HDF5 sees it (HDF5's own count of a
group whose B-tree node points at itself was a segfault)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py

from fedrun.errors import NotUnderstood
from fedrun.hdf5.groups import HDF5Groups


def with_client_count(data: Any) -> Any:
    """The config's ``data`` section as read, with ``num_clients`` filled in for a ``federated_h5`` section
    that leaves it out: the train file's number of client groups (the file's count need not be restated).
    Anything else comes back as it is; so does a section whose file does not open (the run then names it)."""
    if not isinstance(data, dict) or data.get("name") != "federated_h5" or "num_clients" in data:
        return data
    train = data["federated_h5"].get("train") if isinstance(data.get("federated_h5"), dict) else None
    if not isinstance(train, str):
        return data
    try:
        with h5py.File(Path(train).expanduser(), "r") as f:
            if not isinstance(f.get("examples"), h5py.Group):
                return data
            return {**data, "num_clients": _count(f)}
    except (KeyError, OSError, RuntimeError, TypeError, ValueError):  # h5py's errors, a DataError: the run names it
        return data


def _count(f: h5py.File) -> int:
    """The number of links of ``f``'s ``examples`` group: from the file's bytes (fedrun.hdf5, which refuses
    damage, a DataError), else (a layout it does not read, dense storage) HDF5's count."""
    link = f.id.links.get_info(b"examples")
    try:
        headers = HDF5Groups(f.filename)
    except NotUnderstood:
        return len(f["examples"])
    try:
        links = headers.links(link.u) if link.type == h5py.h5l.TYPE_HARD else None
    except NotUnderstood:
        links = None
    finally:
        headers.close()
    return len(f["examples"]) if links is None else len(links)
