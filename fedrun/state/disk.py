"""The client store on disk: each vector entry of a rank's block in one sparse file of ``[C, d]`` rows.

A row is read and written whole at its offset ``row * d * itemsize`` (``os.preadv`` / ``os.pwrite``),
so a round costs the cohort's rows, whatever the block size C. The file is created at its full length
with ``ftruncate`` and never written where no client was: the file system allocates no blocks there
(a sparse file), and a bool per client records which rows were written; a row never written reads as
its declared initial value (zeros, x^(0) or a constant). Scalar entries (counters, probabilities) stay
whole in memory: 8 bytes a client. The files are unlinked as soon as they are open, so they vanish with
the process, however it ends; they are scratch, the checkpoint is the durable copy.

Every write is checked: ``os.pwrite`` may write fewer bytes than asked (a full file system wrote 1,656 of
a row's 2,440 bytes without an error), so a row is written until all its bytes are in, and a write that
cannot finish raises :class:`fedrun.errors.StorageFailure` naming the file and the disk (its mount point)
before the row is marked written: a checkpoint never stores a half-written row. A short read is refused
alike.

Why plain files and not chunked HDF5: docs/scale.md has the measured comparison.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedrun.errors import StorageFailure
from fedrun.protocol import Entry, Vector
from fedrun.state.rows import ChangedRows, TracksChanges
from fedrun.state.store import block_of, initial_value


def mount_point(path: Path) -> Path:
    """The mount point of the file system ``path`` is on (the disk a message names)."""
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    while not os.path.ismount(path):
        path = path.parent
    return path


class _RowFile:
    """One entry's ``[C, d]`` rows in an anonymous sparse file, and which rows were ever written."""

    def __init__(self, path: Path, num_rows: int, initial: Tensor) -> None:
        self.path = path
        self.initial = initial.cpu()
        self.dtype = self.initial.numpy().dtype
        self.row_bytes = self.initial.numel() * self.dtype.itemsize
        self.written = np.zeros(num_rows, dtype=bool)
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as exc:
            raise self._failure("create", exc.strerror or str(exc)) from None
        os.unlink(path)
        os.ftruncate(self.fd, num_rows * self.row_bytes)

    def _failure(self, what: str, why: str) -> StorageFailure:
        return StorageFailure(f"cannot {what} the client state file {self.path} (state.dir, on the disk mounted at "
                          f"{mount_point(self.path.parent)}): {why}; the checkpoints written before are intact")

    def read(self, rows: np.ndarray) -> Tensor:
        out = self.initial.unsqueeze(0).repeat(len(rows), 1)
        view = out.numpy()
        for i, row in enumerate(rows):
            if self.written[row]:
                got = os.preadv(self.fd, [view[i]], int(row) * self.row_bytes)
                if got != self.row_bytes:
                    raise self._failure("read", f"row {int(row)}: read {got} of {self.row_bytes} bytes")
        return out

    def write(self, rows: np.ndarray, values: Tensor) -> None:
        """Write ``values[i]`` into row ``rows[i]``, every byte of it, then mark the rows written."""
        data = np.ascontiguousarray(values.detach().cpu().numpy().astype(self.dtype, copy=False))
        for i, row in enumerate(rows):
            raw, offset, done = memoryview(data[i]).cast("B"), int(row) * self.row_bytes, 0
            while done < self.row_bytes:
                try:
                    n = os.pwrite(self.fd, raw[done:], offset + done)
                except OSError as exc:
                    raise self._failure("write", f"row {int(row)}: {exc.strerror or exc} after {done} of "
                                                 f"{self.row_bytes} bytes") from None
                if n == 0:
                    raise self._failure("write", f"row {int(row)}: no progress after {done} of {self.row_bytes} "
                                                 "bytes")
                done += n
        self.written[rows] = True

    def close(self) -> None:
        os.close(self.fd)

    @property
    def disk_bytes(self) -> int:
        return os.fstat(self.fd).st_blocks * 512


class DiskStore(TracksChanges):
    """Named per-client tensors of one block of ``num_clients`` clients: vectors on disk under
    ``directory``, scalars in memory (a :class:`~fedrun.state.rows.ClientRows`)."""

    # checkpoint.full_every=0: a chain of 10 (a resume reads at most 10 files; an increment costs the rows
    # changed since the previous checkpoint, a full one the rows ever written)
    default_full_every = 10

    def __init__(self, entries: tuple[Entry, ...], num_clients: int, x0: Tensor, directory: Path,
                 label: str) -> None:
        self.entries = entries
        self.num_clients = num_clients
        self.device = x0.device
        directory.mkdir(parents=True, exist_ok=True)
        self.scalars: dict[str, Tensor] = {}
        self.files: dict[str, _RowFile] = {}
        self.marks = ChangedRows(entries, num_clients)
        for e in entries:
            if isinstance(e, Vector):
                path = directory / f".client_state_{label}_{e.name}.bin"
                self.files[e.name] = _RowFile(path, num_clients, initial_value(e, x0))
            else:
                self.scalars[e.name] = block_of(e, num_clients, x0)

    def gather(self, rows: Tensor, names: list[str]) -> dict[str, Tensor]:
        """Copies of the ``rows`` of the named entries (none for an empty list)."""
        index = rows.cpu().numpy()
        return {name: self.files[name].read(index).to(self.device) if name in self.files
                else self.scalars[name].index_select(0, rows) for name in names}

    def scatter(self, rows: Tensor, values: dict[str, Tensor]) -> None:
        """Write ``values[name]`` into the ``rows`` of each named entry."""
        index = rows.cpu().numpy()
        for name, value in values.items():
            if name in self.files:
                self.files[name].write(index, value)
                self.marks.mark(name, index)
            else:
                t = self.scalars[name]
                t.index_copy_(0, rows, value.to(t.dtype))

    def block(self, name: str, start: int, stop: int) -> Tensor:
        """Rows ``start:stop`` of the entry (what a checkpoint streams)."""
        if name in self.files:
            return self.files[name].read(np.arange(start, stop)).to(self.device)
        return self.scalars[name][start:stop]

    def load(self, name: str, start: int, values: Tensor) -> None:
        """Rows ``start .. start + len(values)`` of the entry from a checkpoint; a vector row equal to its
        initial value is not written (it stays sparse)."""
        if name not in self.files:
            t = self.scalars[name]
            t[start:start + len(values)] = values.to(t.dtype)
            return
        f = self.files[name]
        values = values.to(device="cpu", dtype=f.initial.dtype).contiguous()
        raw = values.numpy().view(np.uint8).reshape(len(values), -1)  # bit for bit: -0.0 is not 0.0
        rows = np.flatnonzero((raw != f.initial.numpy().view(np.uint8)).any(axis=1))
        f.write(rows + start, values[torch.as_tensor(rows)])
        self.marks.mark(name, rows + start)

    def written(self, name: str) -> np.ndarray:
        """Which block rows of a vector entry were ever written (the others hold its initial value); every row
        of a scalar entry (in memory, not tracked)."""
        f = self.files.get(name)
        return np.ones(self.num_clients, dtype=bool) if f is None else f.written

    def whole(self, names: list[str]) -> dict[str, Tensor]:
        """The named scalar entries for every client of the block (vector entries stay on disk)."""
        on_disk = [name for name in names if name in self.files]
        if on_disk:
            raise ValueError(f"the disk store cannot hand out whole vector entries ({', '.join(on_disk)})")
        return {name: self.scalars[name] for name in names}

    def replace(self, values: dict[str, Tensor]) -> None:
        self.whole(list(values))  # scalars only
        self.scalars.update(values)

    def close(self) -> None:
        for f in self.files.values():
            f.close()

    @property
    def nbytes(self) -> int:
        """Bytes in memory: the scalars and the written- and changed-rows flags."""
        return sum(t.numel() * t.element_size() for t in self.scalars.values()) + sum(
            f.written.nbytes for f in self.files.values()) + self.marks.nbytes

    @property
    def disk_bytes(self) -> int:
        """Bytes the files occupy on disk (their allocated blocks, not their length)."""
        return sum(f.disk_bytes for f in self.files.values())
