"""Checkpoints of a whole run in one HDF5 file: atomic, checksummed, schema-versioned.

See docs/checkpoint.md for the layout and the guarantees. Only rank 0 writes; any rank reads.
"""

from .files import (
    CheckpointError,
    checkpoint_name,
    checkpoint_round,
    list_checkpoints,
    remove_checkpoints_after,
)
from .h5 import (
    FORMAT_VERSION,
    META_NAMES,
    CheckpointReader,
    CheckpointWriter,
    describe_checkpoint,
    find_latest_valid,
)

__all__ = [
    "FORMAT_VERSION",
    "META_NAMES",
    "CheckpointError",
    "CheckpointReader",
    "CheckpointWriter",
    "checkpoint_name",
    "checkpoint_round",
    "describe_checkpoint",
    "find_latest_valid",
    "list_checkpoints",
    "remove_checkpoints_after",
]
