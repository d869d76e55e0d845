"""Writing and reading a checkpoint of parts ``{group: part}`` on every rank together, both kinds of part of
fedrun.checkpoint.stateful by one path each way (docs/checkpoint.md).

Saving (:func:`save_parts`, rank 0 writes the file): a :class:`Stateful` part's ``state_dict()`` becomes the
datasets ``group/<name>``; each table of a :class:`StreamingStateful` part is streamed to rank 0 in blocks of
about ``BLOCK_BYTES``, ranks in ascending order of their first row, through the world's point-to-point
calls (fedrun.runtime.flat), and fedrun.checkpoint.entries decides how the file holds the rows. The first
error on rank 0 is recorded, the other ranks' rows are still drained (no rank is left blocked in a send),
then every rank raises one :class:`CheckpointWriteError`.

Loading (:func:`load_parts`): a :class:`Stateful` part reads its group of the newest link; each rank reads
the rows of its own span of every table, a window of about ``BLOCK_BYTES`` at a time, newest link of the
chain first (fedrun.checkpoint.chain); rows no link stores keep their value (the initial one).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrun.checkpoint.chain import Chain
from fedrun.checkpoint.entries import EntryWriter
from fedrun.checkpoint.stateful import Stateful, StreamingStateful
from fedrun.checkpoint.writer import CheckpointWriter
from fedrun.errors import CheckpointError, CheckpointWriteError
from fedrun.runtime.flat import broadcast_from_root, recv, send
from fedrun.runtime.world import World

BLOCK_BYTES = 8 << 20  # rows of a table sent to rank 0 (and read back on resume) at a time

Part = Stateful | StreamingStateful


class _RootFile:
    """Rank 0's file (None elsewhere, or when it could not be opened) and the first error writing it; once an
    error is recorded the file is abandoned, but the rows still flow."""

    def __init__(self, world: World, open_writer: Callable[[], CheckpointWriter]) -> None:
        self.error: Exception | None = None
        self.writer: CheckpointWriter | None = self.attempt(open_writer) if world.is_root else None

    def attempt(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(...)``'s value, or None once an error is recorded (the first one, reported after the rows)."""
        if self.error is None:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # keep draining the other ranks' rows, then report
                self.error = exc
        return None


def save_parts(world: World, open_writer: Callable[[], CheckpointWriter], parts: dict[str, Part], *,
               increment: bool, what: str, where: Path | None) -> Path | None:
    """Write ``parts`` into the file ``open_writer()`` opens on rank 0 and commit it (collective call; every
    rank passes its parts in the same order). ``increment``: the file builds on another, its tables store the
    rows changed since. Returns the file's path on rank 0; raises :class:`CheckpointWriteError` on every rank
    naming ``what`` ("checkpoint after round R") and ``where`` (its directory) when rank 0 could not write it."""
    file = _RootFile(world, open_writer)
    for group, part in parts.items():
        if isinstance(part, StreamingStateful):
            _stream(world, file, group, part, increment)
        elif file.writer is not None:
            file.attempt(_write_state, file.writer, group, part)
    path = None
    if file.writer is not None:
        if file.error is None:
            file.attempt(file.writer.commit)
            path = file.writer.path
        if file.error is not None:
            file.writer.abort()
    failed = torch.tensor([1.0 if file.error is not None else 0.0], device=world.device)
    broadcast_from_root(world, failed)
    if file.error is not None:
        raise CheckpointWriteError(f"{what} in {where} failed: {file.error}; the earlier checkpoints are "
                                   "intact") from None
    if failed.item():
        raise CheckpointWriteError(f"{what} failed on rank 0")
    for part in parts.values():
        if isinstance(part, StreamingStateful):
            part.checkpointed()  # the file is in place: its rows are no longer changes
    return path


def _write_state(writer: CheckpointWriter, group: str, part: Stateful) -> None:
    for name, value in part.state_dict().items():
        writer.write(f"{group}/{name}", value)


def _stream(world: World, file: _RootFile, group: str, part: StreamingStateful, increment: bool) -> None:
    """Every table of ``part`` into rank 0's file as ``group/<name>``: the rows each rank stores, from their
    owners in ascending row order, a block of at most ``BLOCK_BYTES`` at a time."""
    for name, fill in part.tables().items():
        mine = part.stored(name, increment)
        spans = world.allgather_object((part.span[0], len(mine)))  # every rank's first row and rows to send
        empty = part.rows(name, mine[:0])  # no rows: the dtype, device and row shape
        row_shape = tuple(empty.shape[1:])
        sink = None if file.writer is None else file.attempt(
            EntryWriter, file.writer, f"{group}/{name}", sum(count for _, count in spans), row_shape,
            torch.empty(0, dtype=empty.dtype).numpy().dtype, increment=increment, fill=fill)
        block = _rows_per_block(empty)
        for rank in sorted(range(world.size), key=lambda r: spans[r][0]):
            first, count = spans[rank]
            for lo in range(0, count, block):
                k = min(block, count - lo)
                if rank == world.rank:
                    rows = mine[lo:lo + k]
                    values = part.rows(name, rows)
                    ids = torch.as_tensor(rows + first, device=world.device)
                    if not world.is_root:
                        send(world, ids, 0)
                        send(world, values, 0)
                elif world.is_root:
                    ids = torch.empty(k, dtype=torch.int64, device=world.device)
                    values = torch.empty((k, *row_shape), dtype=empty.dtype, device=empty.device)
                    recv(world, ids, rank)  # received even when the file failed: the sender must not block
                    recv(world, values, rank)
                if sink is not None:  # rank 0, the file still being written
                    file.attempt(sink.put, ids.cpu().numpy(), values.cpu().numpy())
        if sink is not None:
            file.attempt(sink.finish)


def _rows_per_block(empty: torch.Tensor) -> int:
    """Rows of a table in about ``BLOCK_BYTES``, from its empty ``[0, *row_shape]`` tensor (at least one)."""
    row_bytes = max(1, int(np.prod(empty.shape[1:], dtype=np.int64)) * empty.element_size())
    return max(1, BLOCK_BYTES // row_bytes)


def load_parts(chain: Chain, parts: dict[str, Part]) -> None:
    """Load every part from ``chain`` (each read verifies its checksum): a :class:`Stateful` part from its group
    of the newest link, a :class:`StreamingStateful` part's rows of this rank's span from the newest link
    storing each."""
    head = chain.head
    for group, part in parts.items():
        if isinstance(part, StreamingStateful):
            _load_tables(chain, group, part)
            continue
        state = {name: head.read(f"{group}/{name}") for name in head.names(group)}
        try:
            part.load_state_dict(state)
        except CheckpointError as err:  # the part's state does not fit this run's config
            raise CheckpointError(f"{head.path}: {err}") from None


def _load_tables(chain: Chain, group: str, part: StreamingStateful) -> None:
    first, stop = part.span
    for name in part.tables():
        for lo, hi in chain.windows(f"{group}/{name}", first, stop, _rows_per_block(part.rows(name, np.arange(0)))):
            rows = part.rows(name, np.arange(lo - first, hi - first)).cpu().numpy().copy()
            chain.overlay(f"{group}/{name}", lo, hi, rows)  # verifies what it reads
            part.load(name, lo - first, rows)
    part.checkpointed()
