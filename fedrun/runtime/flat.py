"""Flat buffers: named entries packed into one contiguous tensor, so a round needs one collective.

One collective per direction (docs/design.md): uplinks are summed into one flat buffer per rank and reduced
once; the downlink is one flat broadcast. No per-parameter calls and no pickled objects on the hot path.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from fedrun.runtime.world import World


class FlatLayout:
    """Offsets of named entries (each a [numel] slice) inside one flat buffer."""

    def __init__(self, entries: list[tuple[str, int]]) -> None:
        self.slices: dict[str, slice] = {}
        offset = 0
        for name, numel in entries:
            self.slices[name] = slice(offset, offset + numel)
            offset += numel
        self.numel = offset

    def empty(self, dtype: torch.dtype, device: torch.device) -> Tensor:
        return torch.zeros(self.numel, dtype=dtype, device=device)

    def pack(self, values: dict[str, Tensor], out: Tensor, skip: frozenset[str] | set[str] = frozenset()) -> Tensor:
        """Copy every entry but those in ``skip`` (their slices are left as they are) into ``out``."""
        for name, sl in self.slices.items():
            if name not in skip:
                out[sl] = values[name].reshape(-1)
        return out

    def unpack(self, buf: Tensor, scalars: set[str] = frozenset()) -> dict[str, Tensor]:
        """Views into ``buf``; entries named in ``scalars`` come back as 0-d tensors."""
        return {name: (buf[sl][0] if name in scalars else buf[sl]) for name, sl in self.slices.items()}


def reduce_to_root(world: World, buf: Tensor) -> Tensor:
    """Sum ``buf`` over ranks into rank 0's copy (other ranks' copies are undefined afterwards)."""
    if world.size > 1:
        dist.reduce(buf, dst=0, op=dist.ReduceOp.SUM)
    return buf


def broadcast_from_root(world: World, buf: Tensor) -> Tensor:
    if world.size > 1:
        dist.broadcast(buf, src=0)
    return buf
