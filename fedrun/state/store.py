"""State allocated from a declaration: the client store of a rank's block in memory, and the server state.

docs/design.md: per-client state lives on the rank that owns the client, as named
``[n_local, d]`` (vectors) and ``[n_local]`` (scalars) tensors; rank 0 holds only server entries.
Two stores hold them behind one interface, :class:`fedrun.state.rows.ClientRows`: :class:`ClientStore` in
memory (the default while the state fits) and :class:`fedrun.state.disk.DiskStore` on disk (docs/scale.md).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedrun.protocol import Entry, Vector
from fedrun.state.rows import ChangedRows, TracksChanges


def initial_value(entry: Entry, x0: Tensor) -> Tensor:
    """The declared initial value: zeros, the initial model, or a constant."""
    if isinstance(entry, Vector):
        if entry.init == "model":
            return x0.clone()
        if entry.init == "zeros":
            return torch.zeros_like(x0)
        return torch.full_like(x0, float(entry.init))
    return torch.tensor(float(entry.init), dtype=x0.dtype, device=x0.device)


def constant_init(entry: Entry) -> float | None:
    """The entry's declared initial value when it is one number for every element (zeros, a constant), else
    None (the initial model x^(0))."""
    if isinstance(entry, Vector) and entry.init == "model":
        return None
    return 0.0 if entry.init == "zeros" else float(entry.init)


def init_server(entries: tuple[Entry, ...], x0: Tensor) -> dict[str, Tensor]:
    return {e.name: initial_value(e, x0) for e in entries}


def block_of(entry: Entry, num_clients: int, x0: Tensor) -> Tensor:
    """``num_clients`` rows of the entry's declared initial value."""
    value = initial_value(entry, x0)
    return value.unsqueeze(0).repeat(num_clients, *([1] * value.dim()))


class ClientStore(TracksChanges):
    """Named per-client tensors of one block of ``num_clients`` clients, in memory (a
    :class:`~fedrun.state.rows.ClientRows`)."""

    default_full_every = 1  # every checkpoint full: an in-memory run's files stay as they were before the chain

    def __init__(self, entries: tuple[Entry, ...], num_clients: int, x0: Tensor) -> None:
        self.entries = entries
        self.num_clients = num_clients
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

    def written(self, name: str) -> np.ndarray:
        """Every row: the memory store does not track which rows still hold their initial value."""
        return np.ones(self.num_clients, dtype=bool)

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
