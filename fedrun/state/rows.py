"""The one interface of a rank's client state, :class:`ClientRows`, whichever store holds it.

A rank holds the rows of its block of C clients, one row per client of every per-client entry (``[C, d]``
vectors, ``[C]`` scalars). The round engine reads and writes rows (``gather``/``scatter``, the block-wide
scalars through ``whole``/``replace``); the checkpoint (fedrun.state.part) streams the rows that
differ from their declared initial value (``written``) or changed since the last checkpoint (``changed``)
and loads rows back (``block``/``load``). Snapshot and resume never ask which store they have: the memory
store (fedrun.state.store) answers ``written`` with every row, the disk store (fedrun.state.disk) with
the rows it ever wrote, and each says how long its chain of increments is by default
(``default_full_every``, docs/checkpoint.md).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
from torch import Tensor

from fedrun.protocol import Entry, Vector


@runtime_checkable
class ClientRows(Protocol):
    """The client rows of one block of clients; row ``i`` is the block's ``i``-th client."""

    entries: tuple[Entry, ...]
    default_full_every: int  # checkpoint.full_every=0: every how many checkpoints one is full

    def gather(self, rows: Tensor, names: list[str]) -> dict[str, Tensor]:
        """Copies of the ``rows`` of the named entries (none for an empty list)."""

    def scatter(self, rows: Tensor, values: dict[str, Tensor]) -> None:
        """Write ``values[name]`` into the ``rows`` of each named entry (they count as changed)."""

    def block(self, name: str, start: int, stop: int) -> Tensor:
        """Rows ``start:stop`` of the entry (no rows: its dtype and device)."""

    def load(self, name: str, start: int, values: Tensor) -> None:
        """Rows ``start .. start + len(values)`` of the entry from a checkpoint."""

    def whole(self, names: list[str]) -> dict[str, Tensor]:
        """The named entries for every client of the block (``after_round``'s scalar state)."""

    def replace(self, values: dict[str, Tensor]) -> None:
        """Replace the named entries by block-wide ``values`` (``after_round``'s result)."""

    def written(self, name: str) -> np.ndarray:
        """A bool per block row: the rows that may differ from the entry's declared initial value (a full
        checkpoint stores these; the others read back as the initial value)."""

    def changed(self, name: str) -> np.ndarray:
        """A bool per block row of a vector entry: written since the last checkpoint (an increment stores
        these)."""

    def checkpointed(self) -> None:
        """A checkpoint holding every changed row is in place: start counting changes afresh."""

    @property
    def nbytes(self) -> int:
        """Bytes of client state in memory."""

    @property
    def disk_bytes(self) -> int:
        """Bytes of client state on disk."""


class ChangedRows:
    """A bool per block row of each vector entry: written since the last checkpoint (an increment stores
    these rows only, docs/checkpoint.md). Scalar entries are stored whole and are not tracked."""

    def __init__(self, entries: tuple[Entry, ...], num_clients: int) -> None:
        self.masks = {e.name: np.zeros(num_clients, dtype=bool) for e in entries if isinstance(e, Vector)}

    def mark(self, name: str, rows: np.ndarray | slice) -> None:
        if name in self.masks:
            self.masks[name][rows] = True

    def clear(self) -> None:
        for mask in self.masks.values():
            mask[:] = False

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.masks.values())


class TracksChanges:
    """What both stores share: the rows changed since the last checkpoint, in ``self.marks``."""

    marks: ChangedRows

    def changed(self, name: str) -> np.ndarray:
        """Which block rows of a vector entry changed since the last checkpoint."""
        return self.marks.masks[name]

    def checkpointed(self) -> None:
        """A checkpoint holding every changed row is in place: start counting changes afresh."""
        self.marks.clear()
