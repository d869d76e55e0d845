"""State allocated from a declaration: the client store of a rank's block, and the server state.

docs/design.md: per-client state lives on the rank that owns the client, as named
``[n_local, d]`` (vectors) and ``[n_local]`` (scalars) tensors; rank 0 holds only server entries.
Two stores hold them behind one interface (gather and scatter of rows, a block slice for the checkpoint,
rows loaded from one, the block-wide entries for ``after_round``, the vector rows changed since the last
checkpoint for an incremental one): :class:`ClientStore` in memory (the
default while the state fits) and :class:`fedrun.state.disk.DiskStore` on disk (docs/scale.md).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedrun.protocol import Entry, Vector


def initial_value(entry: Entry, x0: Tensor) -> Tensor:
    """The declared initial value: zeros, the initial model, or a constant."""
    if isinstance(entry, Vector):
        if entry.init == "model":
            return x0.clone()
        if entry.init == "zeros":
            return torch.zeros_like(x0)
        return torch.full_like(x0, float(entry.init))
    return torch.tensor(float(entry.init), dtype=x0.dtype, device=x0.device)


def init_server(entries: tuple[Entry, ...], x0: Tensor) -> dict[str, Tensor]:
    return {e.name: initial_value(e, x0) for e in entries}


def block_of(entry: Entry, num_clients: int, x0: Tensor) -> Tensor:
    """``num_clients`` rows of the entry's declared initial value."""
    value = initial_value(entry, x0)
    return value.unsqueeze(0).repeat(num_clients, *([1] * value.dim()))


class ChangedRows:
    """A bool per block row of each vector entry: written since the last checkpoint (an increment stores
    these rows only, docs/checkpoint.md). Scalar entries are stored whole and are not tracked."""

    def __init__(self, entries: tuple[Entry, ...], num_clients: int) -> None:
        self.masks = {e.name: np.zeros(num_clients, dtype=bool) for e in entries if isinstance(e, Vector)}

    def mark(self, name: str, rows: np.ndarray | slice) -> None:
        if name in self.masks:
            self.masks[name][rows] = True

    def changed(self, name: str) -> np.ndarray | None:
        return self.masks.get(name)

    def clear(self) -> None:
        for mask in self.masks.values():
            mask[:] = False

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.masks.values())


class TracksChanges:
    """What both stores share: the rows changed since the last checkpoint, in ``self.marks``."""

    marks: ChangedRows

    def changed(self, name: str) -> np.ndarray | None:
        """Which block rows of a vector entry changed since the last checkpoint (None for a scalar entry)."""
        return self.marks.changed(name)

    def checkpointed(self) -> None:
        """A checkpoint holding every changed row is in place: start counting changes afresh."""
        self.marks.clear()


class ClientStore(TracksChanges):
    """Named per-client tensors of one block of ``num_clients`` clients, in memory."""

    kind = "memory"

    def __init__(self, entries: tuple[Entry, ...], num_clients: int, x0: Tensor) -> None:
        self.entries = entries
        self.tensors: dict[str, Tensor] = {e.name: block_of(e, num_clients, x0) for e in entries}
        self.marks = ChangedRows(entries, num_clients)

    def gather(self, rows: Tensor, names: list[str]) -> dict[str, Tensor]:
        """Copies of the ``rows`` of the named entries (none for an empty list)."""
        return {name: self.tensors[name].index_select(0, rows) for name in names}

    def scatter(self, rows: Tensor, values: dict[str, Tensor]) -> None:
        """Write ``values[name]`` into the ``rows`` of each named entry."""
        for name, value in values.items():
            t = self.tensors[name]
            t.index_copy_(0, rows, value.to(t.dtype))
            self.marks.mark(name, rows.cpu().numpy())

    def block(self, name: str, start: int, stop: int) -> Tensor:
        """Rows ``start:stop`` of the entry (what a checkpoint streams)."""
        return self.tensors[name][start:stop]

    def load(self, name: str, start: int, values: Tensor) -> None:
        """Rows ``start .. start + len(values)`` of the entry from a checkpoint."""
        t = self.tensors[name]
        t[start:start + len(values)] = values.to(t.dtype)
        self.marks.mark(name, slice(start, start + len(values)))

    def written(self, name: str) -> None:
        """None: a checkpoint stores every row of an in-memory entry (the disk store answers which rows)."""
        return None

    def whole(self, names: list[str]) -> dict[str, Tensor]:
        """The named entries for every client of the block (``after_round``'s state)."""
        return {name: self.tensors[name] for name in names}

    def replace(self, values: dict[str, Tensor]) -> None:
        """Replace the named entries by block-wide ``values`` (``after_round``'s result)."""
        self.tensors.update(values)
        for name in values:
            self.marks.mark(name, slice(None))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @property
    def disk_bytes(self) -> int:
        return 0
