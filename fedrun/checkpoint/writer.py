"""The streaming, checksummed, atomic checkpoint writer.

Layout (docs/checkpoint.md): ``server/x`` and other server entries, ``clients/<name>`` as ``[N, d]``
(chunked ``(rows_per_chunk, d)``) or ``[N]`` datasets, ``participation/``, ``random/``, ``history/``
groups of arbitrary numeric arrays, ``meta/*`` written by the writer itself, ``metrics/jsonl`` text.
Any ``group/name`` path works; only ``meta/<reserved>`` is off limits and ``clients/*`` must have
``num_clients`` rows.

At commit the writer records ``meta/manifest``: every dataset it wrote, with its shape (JSON), which a
reader checks the file against (fedrun.checkpoint.manifest).

Every dataset carries ``crc32``: zlib's CRC-32 of its bytes in row (C) order, as h5py reads them
back (strings: their UTF-8 bytes). Datasets written row by row also carry ``crc32_blocks``, one
CRC-32 per HDF5 chunk of ``crc32_block_rows`` rows, so that a rank reading only its own clients can
verify just those rows. Nothing is ever pickled.
"""

from __future__ import annotations

import errno
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from fedrun.checkpoint.chain import base_file
from fedrun.checkpoint.crc import crc32, crc32_combine, crc32_repeat, fill_crc
from fedrun.checkpoint.files import (
    checkpoint_name,
    fsync_directory,
    prune,
    remove_stale_temporaries,
    temporary_name,
)
from fedrun.checkpoint.format import FORMAT_VERSION, KINDS, MANIFEST, META_NAMES, STRING, error_line
from fedrun.checkpoint.guarded import GuardedFile
from fedrun.errors import CheckpointError

# HDF5 1.10 file format: checksummed metadata, large attributes; any HDF5 >= 1.10 (2016) reads it.
_LIBVER = ("v110", "v110")
_CHUNK_TARGET_BYTES = 8 << 20  # default HDF5 chunk of a row dataset: about 8 MiB of whole rows
_CHUNK_MAX_BYTES = (4 << 30) - 1  # HDF5 limit on one chunk


def _check_path(path: str) -> str:
    parts = path.split("/")
    if not path or any(p in ("", ".", "..") for p in parts):
        raise CheckpointError(f"bad dataset path {path!r}: use 'group/name' without leading or empty parts")
    return path


def _as_array(value: Any, path: str) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, without importing torch
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.dtype.kind not in KINDS:
        raise CheckpointError(
            f"{path}: cannot store dtype {arr.dtype} (numeric, bool, bytes or a str scalar only; no pickling)"
        )
    return arr


def _default_rows_per_chunk(row_bytes: int) -> int:
    return max(1, _CHUNK_TARGET_BYTES // max(1, row_bytes))


@dataclass
class _RowStream:
    dataset: h5py.Dataset
    num_rows: int
    row_shape: tuple[int, ...]
    dtype: np.dtype
    block_rows: int
    next_row: int = 0
    crc: int = 0
    block_crc: int = 0
    block_bytes: int = 0
    blocks: list[int] = field(default_factory=list)

    def finish(self) -> None:
        self.dataset.attrs["crc32"] = np.uint32(self.crc)
        self.dataset.attrs["crc32_blocks"] = np.asarray(self.blocks, dtype=np.uint32)
        self.dataset.attrs["crc32_block_rows"] = np.int64(self.block_rows)


# ------------------------------------------------------------------------------------------ writer


class CheckpointWriter:
    """Write the checkpoint ``<run_dir>/ckpt_<round:08d>.h5`` atomically.

    ``round`` is the next round to run. Use as a context manager: on normal exit the file is
    closed, fsynced, renamed into place, the directory fsynced and old checkpoints pruned to
    ``keep`` (None: keep all); on an exception the temporary is deleted and nothing else changes.
    Without ``with``, call :meth:`commit` or :meth:`abort`. ``run_dir`` must exist: it is never created
    here, so that a run directory moved or removed mid-run fails the checkpoint instead of coming back
    empty at the old path (where the run would go on writing).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        round: int,
        *,
        algorithm: str,
        num_clients: int,
        dim: int,
        config: str = "",
        keep: int | None = 3,
        base: dict[str, Any] | None = None,
    ) -> None:
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be >= 1 or None, got {keep}")
        self.run_dir = Path(run_dir)
        self.round = int(round)
        self.num_clients = int(num_clients)
        self.dim = int(dim)
        self.keep = keep
        self.path = self.run_dir / checkpoint_name(self.round)
        self.tmp_path = self.run_dir / temporary_name(self.round)
        self._streams: dict[str, _RowStream] = {}
        self._manifest: dict[str, list[int]] = {}  # every dataset written outside meta/, with its shape
        self._raw: GuardedFile | None = None
        self._file: h5py.File | None = None
        self._done = False
        try:
            if not self.run_dir.is_dir():
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(self.run_dir))
            remove_stale_temporaries(self.run_dir)
        except OSError as e:
            raise CheckpointError(f"cannot write checkpoints into {self.run_dir}: {error_line(e)}") from e
        try:
            with self._failure("creating the file"):
                self._raw = GuardedFile(self.tmp_path)
                self._file = h5py.File(self._raw, "w", libver=_LIBVER)
            meta = {
                "round": np.int64(self.round),
                "config": config or "",
                "format_version": np.int64(FORMAT_VERSION),
                "algorithm": algorithm,
                "num_clients": np.int64(self.num_clients),
                "dim": np.int64(self.dim),
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
            if base is not None:  # an increment (fedrun.checkpoint.chain)
                meta["base"] = json.dumps(base, sort_keys=True)
            for name, value in meta.items():
                self._write(f"meta/{name}", value)
        except BaseException:
            self.abort()
            raise

    # -- context manager
    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.commit()
        else:
            self.abort()
        return False

    # -- errors
    @contextmanager
    def _failure(self, what: str):
        """Turn OS/HDF5 errors into one CheckpointError; the temporary is removed by abort()."""
        try:
            yield
        except CheckpointError:
            raise
        except (OSError, RuntimeError, ValueError, KeyError) as e:
            raise CheckpointError(f"cannot write checkpoint {self.path} ({what}): {error_line(e)}") from e
        if self._raw is not None and self._raw.error is not None:
            e = self._raw.error
            raise CheckpointError(f"cannot write checkpoint {self.path} ({what}): {error_line(e)}") from e

    def _h5(self) -> h5py.File:
        if self._file is None or self._done:
            raise CheckpointError(f"checkpoint {self.path} is already committed or aborted")
        return self._file

    def _new_path(self, path: str) -> str:
        _check_path(path)
        if path.startswith("meta/") and path[5:] in (*META_NAMES, "base", "manifest"):
            raise CheckpointError(f"{path} is written by the checkpoint writer itself")
        if path in self._h5():
            raise CheckpointError(f"{path} is already in checkpoint {self.path}")
        return path

    def _check_clients(self, path: str, shape: tuple[int, ...]) -> None:
        """A whole entry ``clients/<name>`` has N rows (the rows form ``clients/<name>/rows|values`` any number)."""
        whole = path.startswith("clients/") and path.count("/") == 1
        if whole and (len(shape) == 0 or shape[0] != self.num_clients):
            raise CheckpointError(
                f"{path}: per-client entries need {self.num_clients} rows, got shape {shape}"
            )

    # -- small entries
    def write(self, path: str, value: Any) -> None:
        """Write a whole dataset at once: a numpy array/tensor, a number, a bool or a str (UTF-8)."""
        self._new_path(path)
        if not isinstance(value, str):
            value = _as_array(value, path)
            self._check_clients(path, value.shape)
        self._write(path, value)

    def _write(self, path: str, value: str | np.ndarray | np.generic) -> None:
        with self._failure(f"writing {path}"):
            f = self._h5()
            if isinstance(value, str):
                ds = f.create_dataset(path, data=value, dtype=STRING)
                ds.attrs["crc32"] = np.uint32(crc32(value.encode("utf-8")))
            else:
                arr = np.asarray(value)
                ds = f.create_dataset(path, data=arr)
                ds.attrs["crc32"] = np.uint32(crc32(arr.astype(ds.dtype, copy=False)))
            if not path.startswith("meta/"):
                self._manifest[path] = list(ds.shape)

    # -- streamed [N, ...] entries
    def create_rows(
        self,
        path: str,
        num_rows: int,
        row_shape: tuple[int, ...] | int = (),
        dtype: Any = np.float32,
        *,
        rows_per_chunk: int | None = None,
        fill: float = 0.0,
    ) -> None:
        """Declare a ``[num_rows, *row_shape]`` dataset to be filled by :meth:`write_rows`, in order; whole
        chunks of rows that are all ``fill`` may be passed over with :meth:`skip_rows` (never allocated)."""
        self._new_path(path)
        row_shape = (row_shape,) if isinstance(row_shape, int) else tuple(int(s) for s in row_shape)
        dtype = np.dtype(dtype)
        if dtype.kind not in KINDS:
            raise CheckpointError(f"{path}: cannot store dtype {dtype}")
        shape = (int(num_rows), *row_shape)
        self._check_clients(path, shape)
        row_bytes = dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
        if rows_per_chunk is None:
            rows_per_chunk = _default_rows_per_chunk(row_bytes)
        rows_per_chunk = max(1, min(int(rows_per_chunk), num_rows, _CHUNK_MAX_BYTES // max(1, row_bytes)))
        chunks = (rows_per_chunk, *row_shape) if num_rows > 0 and all(row_shape) else None
        with self._failure(f"creating {path}"):
            ds = self._h5().create_dataset(path, shape=shape, dtype=dtype, chunks=chunks, fillvalue=fill)
        stream = _RowStream(ds, int(num_rows), row_shape, dtype, rows_per_chunk)
        self._manifest[path] = list(shape)
        self._streams[path] = stream
        if num_rows == 0:
            with self._failure(f"writing {path}"):
                stream.finish()

    def write_rows(self, path: str, start: int, rows: Any) -> None:
        """Write rows ``start .. start + len(rows)`` of a dataset made by :meth:`create_rows`.

        Calls must cover the rows in order (each ``start`` is where the previous call stopped).
        The writer keeps no copy: memory is what the caller passes (plus a cast if the dtype differs).
        """
        s = self._streams.get(path)
        if s is None:
            raise CheckpointError(f"{path}: call create_rows() before write_rows()")
        if start != s.next_row:
            raise CheckpointError(
                f"{path}: rows must be written in order; expected start {s.next_row}, got {start}"
            )
        arr = _as_array(rows, path)
        stop = start + (arr.shape[0] if arr.ndim else 0)
        if arr.ndim == 0 or tuple(arr.shape[1:]) != s.row_shape or stop > s.num_rows:
            raise CheckpointError(
                f"{path}: rows {start}:{stop} of shape {arr.shape} do not fit a dataset of shape "
                f"{(s.num_rows, *s.row_shape)}"
            )
        try:
            arr = np.ascontiguousarray(arr.astype(s.dtype, casting="same_kind", copy=False))
        except TypeError as e:
            raise CheckpointError(f"{path}: cannot store {arr.dtype} rows in a {s.dtype} dataset") from e
        with self._failure(f"writing {path} rows {start}:{stop}"):
            self._h5()
            s.dataset[start:stop] = arr
            row = start
            while row < stop:  # one CRC per chunk; the dataset's CRC is combined from them
                end = min(stop, (row // s.block_rows + 1) * s.block_rows)
                piece = arr[row - start : end - start]
                s.block_crc = crc32(piece, s.block_crc)
                s.block_bytes += piece.nbytes
                if end % s.block_rows == 0 or end == s.num_rows:
                    s.blocks.append(s.block_crc)
                    s.crc = crc32_combine(s.crc, s.block_crc, s.block_bytes)
                    s.block_crc = s.block_bytes = 0
                row = end
            s.next_row = stop
            if stop == s.num_rows:
                s.finish()

    def skip_rows(self, path: str, start: int, stop: int) -> None:
        """Pass over rows ``start:stop``, all equal to the dataset's fill value: HDF5 allocates no chunk lying
        wholly inside them and reads it back as the fill value, its CRC-32 that of the fill bytes
        (:func:`fill_crc`); the rows of a chunk they cover in part are written (as the fill value). So a
        checkpoint of sparse client state costs the chunks holding a row written."""
        s = self._streams.get(path)
        if s is None:
            raise CheckpointError(f"{path}: call create_rows() before skip_rows()")
        if start != s.next_row or not start <= stop <= s.num_rows:
            raise CheckpointError(f"{path}: rows must be passed over in order; expected rows from {s.next_row} "
                                  f"to at most {s.num_rows}, got {start}:{stop}")
        b = s.block_rows
        head = min(stop, -(-start // b) * b)  # the end of the chunk ``start`` is in
        tail = stop if stop == s.num_rows else max(head, stop // b * b)  # the whole chunks end here
        if head > start:
            self.write_rows(path, start, np.full((head - start, *s.row_shape), s.dataset.fillvalue, s.dtype))
        row_bytes = s.dtype.itemsize * int(np.prod(s.row_shape, dtype=np.int64))
        whole, rest = (tail - head) // b, (tail - head) % b
        with self._failure(f"skipping {path} rows {head}:{tail}"):
            for count, rows in ((whole, b), (1 if rest else 0, rest)):  # the whole chunks, then a last short one
                if count:
                    crc = fill_crc(s.dataset.fillvalue, s.dtype, rows * row_bytes)
                    s.blocks.extend([crc] * count)
                    s.crc = crc32_combine(s.crc, crc32_repeat(crc, rows * row_bytes, count), count * rows * row_bytes)
            if tail > head:
                s.next_row = tail
                if tail == s.num_rows:
                    s.finish()
        if stop > tail:
            self.write_rows(path, tail, np.full((stop - tail, *s.row_shape), s.dataset.fillvalue, s.dtype))

    # -- finishing
    def commit(self) -> Path:
        """Record the manifest, close, fsync, rename into place, fsync the directory, prune; returns the final
        path."""
        f = self._h5()
        try:
            for path, s in self._streams.items():
                if s.next_row != s.num_rows:
                    raise CheckpointError(
                        f"cannot write checkpoint {self.path}: "
                        f"{path} has {s.next_row} of {s.num_rows} rows written"
                    )
            self._write(MANIFEST, json.dumps(self._manifest, sort_keys=True))
            with self._failure("closing the file"):
                f.flush()
                f.close()
            with self._failure("syncing it to disk"):
                self._done = True
                self._raw.fsync()
                self._raw.close()
            with self._failure("renaming it into place"):
                os.replace(self.tmp_path, self.path)
                fsync_directory(self.run_dir)
        except BaseException:
            self.abort()
            raise
        prune(self.run_dir, self.round, self.keep, base_file)
        return self.path

    def abort(self) -> None:
        """Drop the temporary; existing checkpoints are untouched. Safe to call more than once."""
        self._done = True
        for obj in (self._file, self._raw):
            if obj is not None:
                try:
                    obj.close()
                except Exception:  # the file may be unusable after a failed write; it is deleted anyway
                    pass
        try:
            self.tmp_path.unlink()
        except OSError:
            pass
