"""State allocated from a declaration: the client store of a rank's block, and the server state.

docs/design.md: per-client state lives on the rank that owns the client, as named
``[n_local, d]`` (vectors) and ``[n_local]`` (scalars) tensors; rank 0 holds only server entries.
"""

from __future__ import annotations

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


class ClientStore:
    """Named per-client tensors of one block of ``num_clients`` clients."""

    def __init__(self, entries: tuple[Entry, ...], num_clients: int, x0: Tensor) -> None:
        self.entries = entries
        self.tensors: dict[str, Tensor] = {}
        for e in entries:
            value = initial_value(e, x0)
            self.tensors[e.name] = value.unsqueeze(0).repeat(num_clients, *([1] * value.dim()))

    def gather(self, rows: Tensor, names: list[str]) -> dict[str, Tensor]:
        """Copies of the ``rows`` of the named entries (none for an empty list)."""
        return {name: self.tensors[name].index_select(0, rows) for name in names}

    def scatter(self, rows: Tensor, values: dict[str, Tensor]) -> None:
        """Write ``values[name]`` into the ``rows`` of each named entry."""
        for name, value in values.items():
            t = self.tensors[name]
            t.index_copy_(0, rows, value.to(t.dtype))

    def replace(self, values: dict[str, Tensor]) -> None:
        for name in self.tensors:
            self.tensors[name] = values[name]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())
