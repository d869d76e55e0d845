"""``data.num_clients`` of a ``federated_h5`` config that leaves it out: the train file's number of client
groups, read when the config is (the file's count need not be restated; docs/datasets.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py


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
            examples = f.get("examples")
            return {**data, "num_clients": len(examples)} if isinstance(examples, h5py.Group) else data
    except (KeyError, OSError, RuntimeError, TypeError, ValueError):  # h5py's errors for a damaged file
        return data
