"""What a checkpoint holds, and the check that a file holds it: ``meta/manifest``.

The writer records at commit every dataset it wrote outside ``meta/`` with its shape (JSON
``{path: shape}``), so a file is *complete* when each of them is there with that shape: the check needs
nothing but the file, no algorithm or schedule rebuilt from its config. A dataset deleted or replaced
after the write (every remaining one still passing its checksum) is named in one line.

Files written before the manifest existed have none: their manifest is derived by the caller
(``legacy``: fedrun.checkpoint.legacy rebuilds it from the file's config, as every file was checked
before) and checked the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from fedrun.checkpoint.format import MANIFEST
from fedrun.checkpoint.reader import CheckpointReader
from fedrun.errors import CheckpointError

Manifest = dict[str, tuple[int, ...]]  # dataset path -> shape
Legacy = Callable[[CheckpointReader], Manifest]  # the manifest of a file written without one


def manifest(reader: CheckpointReader) -> Manifest | None:
    """The manifest ``reader``'s file records (checksum verified), or None when it has none (an older file)."""
    if not reader.has(MANIFEST):
        return None
    try:
        data = json.loads(reader.read(MANIFEST))
        found = {str(path): tuple(int(n) for n in shape) for path, shape in data.items()}
    except (ValueError, TypeError, AttributeError):
        raise CheckpointError(f"{reader.path}: {MANIFEST} is not a JSON mapping of dataset paths to shapes") \
            from None
    return found


def check_complete(reader: CheckpointReader, legacy: Legacy | None = None) -> None:
    """Raise :class:`CheckpointError` naming the first dataset of the file's manifest that is missing or
    misshapen (a file without one: ``legacy(reader)``'s; without ``legacy`` such a file is refused)."""
    want = manifest(reader)
    if want is None:
        if legacy is None:
            raise CheckpointError(f"{reader.path}: has no {MANIFEST} (written by an older fedrun)")
        want = legacy(reader)
    present = set(reader.datasets())
    for path, shape in want.items():
        if path not in present:
            raise CheckpointError(f"{reader.path}: incomplete checkpoint: dataset {path} is missing (expected "
                                  f"shape {shape} for algorithm {reader.meta['algorithm']})")
        if reader.shape(path) != shape:
            raise CheckpointError(f"{reader.path}: dataset {path} has shape {reader.shape(path)}, expected {shape}")
