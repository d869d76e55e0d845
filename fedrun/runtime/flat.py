"""Flat buffers: named entries packed into one contiguous tensor, so a round needs one collective.

One collective per direction (docs/design.md): uplinks are summed into one flat buffer per rank and reduced
once; the downlink is one flat broadcast. No per-parameter calls and no pickled objects on the hot path.

Under gloo (ranks on CPUs, or several ranks sharing a GPU: fedrun.runtime.world.collective_backend) every
collective here runs on a host buffer: a GPU buffer is copied to the host, the collective runs there and the
result is copied back (:func:`_on_host`), one copy each way per round's exchange. Every collective here only
moves buffers or adds terms whose sum is exact, so the bits do not depend on the backend.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

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


# bytes that a reduction gathers in all (its buffer times the ranks) up to which it is a gather and a local sum
# rather than the reduce collective: on gloo over loopback, 2 ranks, a 330-element all-reduce took 1.5-1.9 ms and
# an all-gather of it 0.4 ms; a 700-element reduce 0.5-0.8 ms, a gather 0.3 ms (bench/RESULTS.md, issue 31)
GATHER_BYTES = 1 << 22


@contextmanager
def _on_host(world: World, buf: Tensor, back: bool = True) -> Iterator[Tensor]:
    """The tensor a collective on ``buf`` runs on: ``buf`` itself, or, under gloo with ``buf`` on a GPU, a host
    copy whose result is copied back into ``buf`` (``back``) afterwards."""
    if world.backend != "gloo" or buf.device.type == "cpu":
        yield buf
        return
    host = buf.cpu()
    yield host
    if back:
        buf.copy_(host)


def _gathers(world: World, buf: Tensor) -> bool:
    return world.size * buf.numel() * buf.element_size() <= GATHER_BYTES


def reduce_to_root(world: World, buf: Tensor) -> Tensor:
    """Sum ``buf`` over ranks into rank 0's copy (other ranks' copies are undefined afterwards).

    Every caller's terms sum exactly in any order (integers, or one non-zero term per entry), so how the sum is
    taken does not change its bits: a small buffer is gathered to rank 0 and summed there, a large one reduced
    by the collective."""
    if world.size > 1:
        with _on_host(world, buf, back=world.is_root) as wire:
            if _gathers(world, wire):
                parts = [torch.empty_like(wire) for _ in range(world.size)] if world.is_root else None
                dist.gather(wire, parts, dst=0)
                if parts is not None:
                    torch.sum(torch.stack(parts), dim=0, out=wire)
            else:
                dist.reduce(wire, dst=0, op=dist.ReduceOp.SUM)
    return buf


def all_reduce(world: World, buf: Tensor, op: Literal["sum", "max"]) -> Tensor:
    """``buf`` <- its ``"sum"`` or ``"max"`` over ranks, on every rank, in place. As in :func:`reduce_to_root`
    the terms must combine exactly in any order (integers; a max always does): a small buffer is all-gathered
    and combined locally, a large one all-reduced."""
    if world.size > 1:
        with _on_host(world, buf) as wire:
            if _gathers(world, wire):
                parts = [torch.empty_like(wire) for _ in range(world.size)]
                dist.all_gather(parts, wire)
                stacked = torch.stack(parts)
                wire.copy_(stacked.sum(dim=0) if op == "sum" else stacked.amax(dim=0))
            else:
                dist.all_reduce(wire, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return buf


def broadcast_from_root(world: World, buf: Tensor) -> Tensor:
    """Rank 0's ``buf`` on every rank, in place."""
    if world.size > 1:
        with _on_host(world, buf, back=not world.is_root) as wire:
            dist.broadcast(wire, src=0)
    return buf


def send(world: World, buf: Tensor, dst: int) -> None:
    """``buf`` to rank ``dst`` (which calls :func:`recv`)."""
    with _on_host(world, buf, back=False) as wire:
        dist.send(wire, dst=dst)


def recv(world: World, buf: Tensor, src: int) -> Tensor:
    """``buf`` <- what rank ``src`` sends (:func:`send`), in place."""
    with _on_host(world, buf) as wire:
        dist.recv(wire, src=src)
    return buf
