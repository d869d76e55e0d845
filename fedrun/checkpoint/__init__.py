"""Checkpoints of a whole run in one HDF5 file: atomic, checksummed, schema-versioned.

See docs/checkpoint.md for the layout and the guarantees. Only rank 0 writes; any rank reads.
``files`` names and lists the files of a run directory, ``writer`` and ``reader`` write and read one,
``format`` is what both agree on, ``crc`` the checksum arithmetic, ``guarded`` the writer's file object,
``chain`` incremental checkpoints (the client rows changed since the one they build on) and their chains.
"""

from .files import (
    checkpoint_name,
    checkpoint_round,
    list_checkpoints,
    remove_checkpoints_after,
)
from .format import FORMAT_VERSION, META_NAMES
from .reader import CheckpointReader, describe_checkpoint, find_latest_valid
from .writer import CheckpointWriter

__all__ = [
    "FORMAT_VERSION",
    "META_NAMES",
    "CheckpointReader",
    "CheckpointWriter",
    "checkpoint_name",
    "checkpoint_round",
    "describe_checkpoint",
    "find_latest_valid",
    "list_checkpoints",
    "remove_checkpoints_after",
]
