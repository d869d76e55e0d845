"""The HDF5 checkpoint file: a streaming, checksummed, atomic writer and a verifying reader.

Layout (docs/checkpoint.md): ``server/x`` and other server entries, ``clients/<name>`` as ``[N, d]``
(chunked ``(rows_per_chunk, d)``) or ``[N]`` datasets, ``participation/``, ``random/``, ``history/``
groups of arbitrary numeric arrays, ``meta/*`` written by the writer itself, ``metrics/jsonl`` text.
Any ``group/name`` path works; only ``meta/<reserved>`` is off limits and ``clients/*`` must have
``num_clients`` rows.

Every dataset carries ``crc32``: zlib's CRC-32 of its bytes in row (C) order, as h5py reads them
back (strings: their UTF-8 bytes). Datasets written row by row also carry ``crc32_blocks``, one
CRC-32 per HDF5 chunk of ``crc32_block_rows`` rows, so that a rank reading only its own clients can
verify just those rows. Nothing is ever pickled.
"""

from __future__ import annotations

import errno
import os
import re
import zlib
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .files import (
    CheckpointError,
    checkpoint_name,
    checkpoint_round,
    fsync_directory,
    list_checkpoints,
    prune,
    remove_stale_temporaries,
    temporary_name,
)

FORMAT_VERSION = 2  # 2: schedule/ replaces participation/ and runtime_state/
META_NAMES = ("round", "config", "format_version", "algorithm", "num_clients", "dim", "created")
# HDF5 1.10 file format: checksummed metadata, large attributes; any HDF5 >= 1.10 (2016) reads it.
_LIBVER = ("v110", "v110")
_CHUNK_TARGET_BYTES = 8 << 20  # default HDF5 chunk of a row dataset: about 8 MiB of whole rows
_CHUNK_MAX_BYTES = (4 << 30) - 1  # HDF5 limit on one chunk
_READ_SLICE_BYTES = 64 << 20  # verify() reads this much at a time
_STRING = h5py.string_dtype("utf-8")
_KINDS = "biufcS"  # bool, ints, floats, complex, fixed-length bytes


# ----------------------------------------------------------------------------------------- helpers


def _one_line(e: BaseException) -> str:
    """The useful part of an OS or HDF5 error, on one line."""
    text = str(e)
    m = re.search(r"error message = '([^']*)'", text)  # HDF5 wraps the OS error of a failed write
    if m:
        return m.group(1)
    if isinstance(e, OSError) and e.strerror and not text.startswith("Unable"):
        return e.strerror
    text = " ".join(text.split())
    return text if len(text) <= 240 else text[:237] + "..."


def _check_path(path: str) -> str:
    parts = path.split("/")
    if not path or any(p in ("", ".", "..") for p in parts):
        raise CheckpointError(f"bad dataset path {path!r}: use 'group/name' without leading or empty parts")
    return path


def _as_array(value: Any, path: str) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, without importing torch
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.dtype.kind not in _KINDS:
        raise CheckpointError(
            f"{path}: cannot store dtype {arr.dtype} (numeric, bool, bytes or a str scalar only; no pickling)"
        )
    return arr


def _crc(data: Any, crc: int = 0) -> int:
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data)
        return zlib.crc32(data.reshape(-1).view(np.uint8), crc)
    return zlib.crc32(data, crc)


# CRC-32 of a concatenation from the CRCs of its parts, so the dataset CRC costs no second pass
# over the data: crc(A + B) = (crc(A) * x^(8 len B) mod P) ^ crc(B), in zlib's bit-reflected form.
_POLY = 0xEDB88320


def _mul_mod_p(a: int, b: int) -> int:
    """a * b modulo the CRC-32 polynomial (bit-reflected: 1 << 31 is x^0)."""
    product = 0
    bit = 1 << 31
    while a:
        if a & bit:
            product ^= b
            a ^= bit
        bit >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


_X_POW_2K = [1 << 30]  # x^(2^k) mod P for k = 0..63
for _ in range(63):
    _X_POW_2K.append(_mul_mod_p(_X_POW_2K[-1], _X_POW_2K[-1]))


@lru_cache(maxsize=64)
def _x_pow_8n(n: int) -> int:
    """x^(8 n) mod P: the effect of appending n bytes on a CRC register."""
    result, k = 1 << 31, 3
    while n:
        if n & 1:
            result = _mul_mod_p(_X_POW_2K[k], result)
        n >>= 1
        k += 1
    return result


def _crc_combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """CRC-32 of A + B from crc32(A), crc32(B) and len(B) in bytes."""
    return _mul_mod_p(_x_pow_8n(len_b), crc_a) ^ crc_b if len_b else crc_a


def _default_rows_per_chunk(row_bytes: int) -> int:
    return max(1, _CHUNK_TARGET_BYTES // max(1, row_bytes))


class _GuardedFile:
    """The writer's file, handed to HDF5 as a Python file object.

    A failed write(2) (full disk, quota, EFBIG) is recorded here and hidden from HDF5, which then
    finishes and closes normally; the writer raises the recorded error and deletes the file. This
    matters: after a write error inside HDF5, closing the file can crash the process (seen with
    h5py 3.16 / HDF5 2.0), and an error could otherwise surface only at close, rounds later.
    """

    def __init__(self, path: Path) -> None:
        self._f = open(path, "w+b", buffering=0)  # closed by close()
        self.error: OSError | None = None

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._f.seek(pos, whence)

    def tell(self) -> int:
        return self._f.tell()

    def read(self, n: int = -1) -> bytes:
        return self._f.read(n)

    def readinto(self, buf: Any) -> int:
        return self._f.readinto(buf)

    def write(self, buf: Any) -> int:
        view = memoryview(buf).cast("B")
        if self.error is None:
            try:
                done = 0
                while done < len(view):
                    done += self._f.write(view[done:])
            except OSError as e:
                self.error = e
        return len(view)

    def truncate(self, size: int | None = None) -> int:
        if self.error is None:
            try:
                return self._f.truncate(size)
            except OSError as e:
                self.error = e
        return self._f.tell() if size is None else size

    def flush(self) -> None:
        pass

    def fsync(self) -> None:
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


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
        self._raw: _GuardedFile | None = None
        self._file: h5py.File | None = None
        self._done = False
        try:
            if not self.run_dir.is_dir():
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(self.run_dir))
            remove_stale_temporaries(self.run_dir)
        except OSError as e:
            raise CheckpointError(f"cannot write checkpoints into {self.run_dir}: {_one_line(e)}") from e
        try:
            with self._failure("creating the file"):
                self._raw = _GuardedFile(self.tmp_path)
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
            raise CheckpointError(f"cannot write checkpoint {self.path} ({what}): {_one_line(e)}") from e
        if self._raw is not None and self._raw.error is not None:
            e = self._raw.error
            raise CheckpointError(f"cannot write checkpoint {self.path} ({what}): {_one_line(e)}") from e

    def _h5(self) -> h5py.File:
        if self._file is None or self._done:
            raise CheckpointError(f"checkpoint {self.path} is already committed or aborted")
        return self._file

    def _new_path(self, path: str) -> str:
        _check_path(path)
        if path.startswith("meta/") and path[5:] in META_NAMES:
            raise CheckpointError(f"{path} is written by the checkpoint writer itself")
        if path in self._h5():
            raise CheckpointError(f"{path} is already in checkpoint {self.path}")
        return path

    def _check_clients(self, path: str, shape: tuple[int, ...]) -> None:
        if path.startswith("clients/") and (len(shape) == 0 or shape[0] != self.num_clients):
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
                ds = f.create_dataset(path, data=value, dtype=_STRING)
                ds.attrs["crc32"] = np.uint32(_crc(value.encode("utf-8")))
            else:
                arr = np.asarray(value)
                ds = f.create_dataset(path, data=arr)
                ds.attrs["crc32"] = np.uint32(_crc(arr.astype(ds.dtype, copy=False)))

    # -- streamed [N, ...] entries
    def create_rows(
        self,
        path: str,
        num_rows: int,
        row_shape: tuple[int, ...] | int = (),
        dtype: Any = np.float32,
        *,
        rows_per_chunk: int | None = None,
    ) -> None:
        """Declare a ``[num_rows, *row_shape]`` dataset to be filled by :meth:`write_rows`, in order."""
        self._new_path(path)
        row_shape = (row_shape,) if isinstance(row_shape, int) else tuple(int(s) for s in row_shape)
        dtype = np.dtype(dtype)
        if dtype.kind not in _KINDS:
            raise CheckpointError(f"{path}: cannot store dtype {dtype}")
        shape = (int(num_rows), *row_shape)
        self._check_clients(path, shape)
        row_bytes = dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
        if rows_per_chunk is None:
            rows_per_chunk = _default_rows_per_chunk(row_bytes)
        rows_per_chunk = max(1, min(int(rows_per_chunk), num_rows, _CHUNK_MAX_BYTES // max(1, row_bytes)))
        chunks = (rows_per_chunk, *row_shape) if num_rows > 0 and all(row_shape) else None
        with self._failure(f"creating {path}"):
            ds = self._h5().create_dataset(path, shape=shape, dtype=dtype, chunks=chunks)
        stream = _RowStream(ds, int(num_rows), row_shape, dtype, rows_per_chunk)
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
                s.block_crc = _crc(piece, s.block_crc)
                s.block_bytes += piece.nbytes
                if end % s.block_rows == 0 or end == s.num_rows:
                    s.blocks.append(s.block_crc)
                    s.crc = _crc_combine(s.crc, s.block_crc, s.block_bytes)
                    s.block_crc = s.block_bytes = 0
                row = end
            s.next_row = stop
            if stop == s.num_rows:
                s.finish()

    # -- finishing
    def commit(self) -> Path:
        """Close, fsync, rename into place, fsync the directory, prune; returns the final path."""
        f = self._h5()
        try:
            for path, s in self._streams.items():
                if s.next_row != s.num_rows:
                    raise CheckpointError(
                        f"cannot write checkpoint {self.path}: "
                        f"{path} has {s.next_row} of {s.num_rows} rows written"
                    )
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
        prune(self.run_dir, self.round, self.keep)
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


# ------------------------------------------------------------------------------------------ reader


class CheckpointReader:
    """Open a checkpoint for reading; checks the format version and the ``meta`` entries on open.

    ``meta`` is a dict with round (the next round to run), config, format_version, algorithm,
    num_clients, dim and created. Any number of ranks may read one file at once.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            what = "no such checkpoint file"
            if self.path.is_dir():
                what = "is a directory, not a checkpoint file"
            raise CheckpointError(f"{self.path}: {what}")
        try:
            self._file = h5py.File(self.path, "r")
        except (OSError, RuntimeError, ValueError) as e:
            raise CheckpointError(f"{self.path}: not a readable HDF5 file ({_one_line(e)})") from e
        try:
            self.meta = self._read_meta()
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def _error(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: {what}")

    @contextmanager
    def _reading(self, path: str):
        try:
            yield
        except CheckpointError:
            raise
        except (OSError, RuntimeError, ValueError, KeyError, TypeError) as e:
            raise self._error(f"cannot read {path} ({_one_line(e)})") from e

    def _read_meta(self) -> dict[str, Any]:
        if "meta/format_version" not in self._file:
            raise self._error("not a fedrun checkpoint (no meta/format_version)")
        version = int(self.read("meta/format_version"))
        if version != FORMAT_VERSION:
            raise self._error(
                f"checkpoint format version {version}; this fedrun reads version {FORMAT_VERSION} only"
            )
        meta: dict[str, Any] = {}
        for name in META_NAMES:
            if f"meta/{name}" not in self._file:
                raise self._error(f"missing meta/{name}")
            value = self.read(f"meta/{name}")
            meta[name] = value if isinstance(value, str) else int(value)
        return meta

    def _dataset(self, path: str) -> h5py.Dataset:
        with self._reading(path):
            obj = self._file.get(path)
        if not isinstance(obj, h5py.Dataset):
            raise self._error(f"no dataset {path!r}" + (" (it is a group)" if obj is not None else ""))
        return obj

    # -- listing
    def names(self, group: str = "") -> list[str]:
        """Sorted names of the entries (datasets and groups) directly in ``group`` ('' is the root)."""
        with self._reading(group or "/"):
            obj = self._file[group] if group else self._file
        if not isinstance(obj, h5py.Group):
            raise self._error(f"no group {group!r}")
        return sorted(obj.keys())

    def datasets(self) -> list[str]:
        """All dataset paths in the file, sorted."""
        found: list[str] = []

        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                found.append(name)

        with self._reading("/"):
            self._file.visititems(visit)
        return sorted(found)

    def shape(self, path: str) -> tuple[int, ...]:
        return tuple(self._dataset(path).shape)

    def dtype(self, path: str) -> np.dtype:
        ds = self._dataset(path)
        return np.dtype(object) if _is_string(ds) else ds.dtype

    def nbytes(self, path: str) -> int:
        """Size of the dataset's data in bytes (strings: their UTF-8 length)."""
        ds = self._dataset(path)
        if _is_string(ds):
            return len(self.read(path, verify=False).encode("utf-8"))
        return int(ds.size) * ds.dtype.itemsize

    # -- reading
    def _expected(self, ds: h5py.Dataset, path: str) -> int:
        crc = ds.attrs.get("crc32")
        if crc is None:
            raise self._error(f"{path} has no checksum (not written by a complete CheckpointWriter)")
        return int(crc)

    def read(self, path: str, *, verify: bool = True) -> Any:
        """A whole dataset: ndarray, numpy scalar or str. Checks its CRC-32 unless verify=False."""
        ds = self._dataset(path)
        with self._reading(path):
            if _is_string(ds):
                value = ds.asstr()[()]
                data = value.encode("utf-8")
            else:
                value = data = ds[()]
        if verify and _crc(data) != self._expected(ds, path):
            raise self._error(f"checksum mismatch in {path}")
        return value

    def read_rows(self, path: str, start: int, stop: int, *, verify: bool = True) -> np.ndarray:
        """Rows ``start:stop`` of an ``[N, ...]`` dataset (one rank's block of clients).

        With verify, the CRC-32 of every chunk the rows touch is checked, so up to one chunk of
        extra rows is read at each end; datasets without per-chunk checksums are verified whole.
        """
        ds = self._dataset(path)
        if ds.ndim == 0:
            raise self._error(f"{path} is a scalar, it has no rows")
        n = ds.shape[0]
        if not 0 <= start <= stop <= n:
            raise self._error(f"rows {start}:{stop} out of range for {path} with {n} rows")
        if not verify:
            with self._reading(path):
                return ds[start:stop]
        if "crc32_blocks" not in ds.attrs:
            return self.read(path)[start:stop]
        b = int(ds.attrs["crc32_block_rows"])
        lo = (start // b) * b
        hi = min(n, -(-stop // b) * b) if stop > start else lo
        with self._reading(path):
            data = ds[lo:hi]
            blocks = ds.attrs["crc32_blocks"]
        for row in range(lo, hi, b):
            if _crc(data[row - lo : row - lo + b]) != int(blocks[row // b]):
                raise self._error(f"checksum mismatch in {path} rows {row}:{min(row + b, n)}")
        return data if (lo, hi) == (start, stop) else data[start - lo : stop - lo].copy()

    def verify(self, paths: list[str] | None = None) -> None:
        """Check the CRC-32 of every dataset (or of ``paths``), reading big ones a slice at a time."""
        for path in self.datasets() if paths is None else paths:
            self._verify_one(path)

    def _verify_one(self, path: str) -> None:
        ds = self._dataset(path)
        if _is_string(ds) or ds.ndim == 0:
            self.read(path)
            return
        expected = self._expected(ds, path)
        n = ds.shape[0]
        row_bytes = max(1, ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64)))
        blocks = ds.attrs.get("crc32_blocks")
        b = int(ds.attrs["crc32_block_rows"]) if blocks is not None else 1
        step = max(1, _READ_SLICE_BYTES // row_bytes // b) * b  # whole blocks per slice
        crc = 0
        with self._reading(path):
            for lo in range(0, n, step):
                data = ds[lo : min(n, lo + step)]
                if blocks is None:
                    crc = _crc(data, crc)
                    continue
                for row in range(lo, lo + len(data), b):
                    piece = data[row - lo : row - lo + b]
                    block_crc = _crc(piece)
                    if block_crc != int(blocks[row // b]):
                        raise self._error(f"checksum mismatch in {path} rows {row}:{min(row + b, n)}")
                    crc = _crc_combine(crc, block_crc, piece.nbytes)
        if crc != expected:
            raise self._error(f"checksum mismatch in {path}")


def _is_string(ds: h5py.Dataset) -> bool:
    return h5py.check_string_dtype(ds.dtype) is not None and ds.dtype.kind == "O"


# ------------------------------------------------------------------------------------- run level


def find_latest_valid(run_dir: str | os.PathLike, warn: Callable[[str], None] | None = None,
                      check: Callable[[CheckpointReader], None] | None = None) -> Path | None:
    """The newest checkpoint in ``run_dir`` that opens and verifies, or None.

    Each newer one that fails is reported through ``warn`` (default: ``warnings.warn``), naming the
    file and what is wrong, before falling back to the previous one. Temporaries are ignored.
    ``check(reader)`` may raise :class:`CheckpointError` for a file that verifies but is not what the
    caller needs (an incomplete layout); that file is skipped too.
    """
    if warn is None:
        import warnings

        def warn(message: str) -> None:
            warnings.warn(message, stacklevel=3)

    for path in reversed(list_checkpoints(run_dir)):
        try:
            with CheckpointReader(path) as reader:
                if reader.meta["round"] != checkpoint_round(path):
                    raise CheckpointError(
                        f"{path}: file name says round {checkpoint_round(path)}, "
                        f"meta/round says {reader.meta['round']}"
                    )
                reader.verify()
                if check is not None:
                    check(reader)
            return path
        except CheckpointError as e:
            warn(f"skipping checkpoint {path.name}: {e}; falling back to the previous one")
    return None


def describe_checkpoint(path: str | os.PathLike) -> str:
    """A human-readable summary (what ``fedrun inspect CKPT.h5`` prints); verifies every checksum."""
    with CheckpointReader(path) as r:
        m = r.meta
        lines = [
            f"checkpoint {r.path}",
            f"  after round {m['round']} (resumes with round {m['round'] + 1})   algorithm {m['algorithm']}   "
            f"clients N={m['num_clients']}   "
            f"dim d={m['dim']}   format version {m['format_version']}   created {m['created']}",
            "  datasets:",
        ]
        rows, failed, total = [], [], 0
        for name in r.datasets():
            shape = r.shape(name)
            dtype = "str" if r.dtype(name) == np.dtype(object) else str(r.dtype(name))
            size = r.nbytes(name)
            total += size
            try:
                r.verify([name])
                status = "ok"
            except CheckpointError as e:
                status = "FAILED"
                failed.append(str(e))
            rows.append((name, str(shape), dtype, f"{size:,} B", status))
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        for row in rows:
            cells = [
                row[0].ljust(widths[0]),
                row[1].ljust(widths[1]),
                row[2].ljust(widths[2]),
                row[3].rjust(widths[3]),
                row[4],
            ]
            lines.append("    " + "  ".join(cells))
        lines.append(f"  total data {total:,} bytes ({_human(total)}); file {r.path.stat().st_size:,} bytes")
        if failed:
            lines.append(f"  checksums: FAILED for {len(failed)} of {len(rows)} datasets")
            lines.extend(f"    {msg}" for msg in failed)
        else:
            lines.append(f"  checksums: all {len(rows)} datasets verify")
    return "\n".join(lines)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"
