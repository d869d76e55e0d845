"""The verifying checkpoint reader, and the run-level questions answered by reading: the newest
checkpoint that verifies (with the newer ones passed over, as data), and a description of one file
(``fedrun inspect``).

A reader checks the format version and the ``meta`` entries on open and the CRC-32 of what it reads
(docs/checkpoint.md); a rank reading only its own clients verifies just the chunks those rows touch.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import h5py
import numpy as np
import yaml

from fedrun.checkpoint.crc import crc32, crc32_combine, crc32_repeat, fill_crc
from fedrun.checkpoint.files import checkpoint_round, list_checkpoints
from fedrun.checkpoint.format import FORMAT_VERSION, MANIFEST, META_NAMES, error_line, is_string
from fedrun.errors import CheckpointError

_READ_SLICE_BYTES = 64 << 20  # verify() reads this much at a time


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
            raise CheckpointError(f"{self.path}: not a readable HDF5 file ({error_line(e)})") from e
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
            raise self._error(f"cannot read {path} ({error_line(e)})") from e

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

    @property
    def round(self) -> int:
        """``meta/round``: the rounds the checkpoint has done."""
        return int(self.meta["round"])

    def check_written_for(self, **run: Any) -> None:
        """Raise :class:`CheckpointError` unless the file was written for this run: each of ``run``'s ``meta``
        entries (algorithm, num_clients, dim) as the file records it."""
        for key, value in run.items():
            if self.meta[key] != value:
                raise self._error(f"written for {key}={self.meta[key]!r}, but this run has {key}={value!r}")

    def config(self) -> dict[str, Any]:
        """The resolved config the checkpoint was written with (``meta/config``), as a dict."""
        try:
            data = yaml.safe_load(self.meta["config"])
        except yaml.YAMLError:
            data = None
        if not isinstance(data, dict):
            raise self._error("meta/config is not a YAML mapping of config sections")
        return data

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

    def has(self, path: str) -> bool:
        """Whether ``path`` is a dataset of the file."""
        with self._reading(path):
            return isinstance(self._file.get(path), h5py.Dataset)

    def checksum(self, path: str) -> int:
        """The CRC-32 the writer recorded for dataset ``path``."""
        return self._expected(self._dataset(path), path)

    def shape(self, path: str) -> tuple[int, ...]:
        return tuple(self._dataset(path).shape)

    def dtype(self, path: str) -> np.dtype:
        ds = self._dataset(path)
        return np.dtype(object) if is_string(ds) else ds.dtype

    def nbytes(self, path: str) -> int:
        """Size of the dataset's data in bytes (strings: their UTF-8 length)."""
        ds = self._dataset(path)
        if is_string(ds):
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
            if is_string(ds):
                value = ds.asstr()[()]
                data = value.encode("utf-8")
            else:
                value = data = ds[()]
        if verify and crc32(data) != self._expected(ds, path):
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
            if crc32(data[row - lo : row - lo + b]) != int(blocks[row // b]):
                raise self._error(f"checksum mismatch in {path} rows {row}:{min(row + b, n)}")
        return data if (lo, hi) == (start, stop) else data[start - lo : stop - lo].copy()

    def allocated_rows(self, path: str) -> list[tuple[int, int]]:
        """The row ranges of the chunks HDF5 allocated for a chunked ``[N, ...]`` dataset, in order (rows
        outside them read as the fill value: passed over by :meth:`CheckpointWriter.skip_rows`)."""
        ds = self._dataset(path)
        if ds.chunks is None or ds.ndim == 0:
            return [(0, ds.shape[0] if ds.ndim else 0)]
        b, n = ds.chunks[0], ds.shape[0]
        with self._reading(path):
            firsts = sorted(ds.id.get_chunk_info(i).chunk_offset[0] for i in range(ds.id.get_num_chunks()))
        return [(lo, min(n, lo + b)) for lo in firsts]

    def verify(self, paths: list[str] | None = None) -> None:
        """Check the CRC-32 of every dataset (or of ``paths``), reading big ones a slice at a time."""
        for path in self.datasets() if paths is None else paths:
            self._verify_one(path)

    def _verify_one(self, path: str) -> None:
        ds = self._dataset(path)
        if is_string(ds) or ds.ndim == 0:
            self.read(path)
            return
        expected = self._expected(ds, path)
        n = ds.shape[0]
        row_bytes = max(1, ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64)))
        blocks = ds.attrs.get("crc32_blocks")
        b = int(ds.attrs["crc32_block_rows"]) if blocks is not None else 1
        step = max(1, _READ_SLICE_BYTES // row_bytes // b) * b  # whole blocks per slice
        crc = 0
        if blocks is not None and ds.chunks is not None and ds.chunks[0] == b and len(blocks) == -(-n // b):
            self._verify_sparse(path, ds, np.asarray(blocks), b, row_bytes, expected)
            return
        with self._reading(path):
            for lo in range(0, n, step):
                data = ds[lo : min(n, lo + step)]
                if blocks is None:
                    crc = crc32(data, crc)
                    continue
                for row in range(lo, lo + len(data), b):
                    piece = data[row - lo : row - lo + b]
                    block_crc = crc32(piece)
                    if block_crc != int(blocks[row // b]):
                        raise self._error(f"checksum mismatch in {path} rows {row}:{min(row + b, n)}")
                    crc = crc32_combine(crc, block_crc, piece.nbytes)
        if crc != expected:
            raise self._error(f"checksum mismatch in {path}")


    def _verify_sparse(self, path: str, ds: h5py.Dataset, blocks: np.ndarray, b: int, row_bytes: int,
                       expected: int) -> None:
        """Verify a chunked dataset chunk by chunk: an allocated chunk is read and checked, a chunk HDF5 never
        allocated holds the fill value, whose CRC is known without reading; runs of them combine at once."""
        n = ds.shape[0]
        allocated = [lo // b for lo, _ in self.allocated_rows(path)]
        crc, done = 0, 0  # done: chunks combined so far

        def fill_run(upto: int) -> None:  # chunks done .. upto - 1, none allocated
            nonlocal crc, done
            full = min(upto, n // b) - done  # whole fill chunks, then possibly the short last one
            if full > 0:
                want = fill_crc(ds.fillvalue, ds.dtype, b * row_bytes)
                bad = np.flatnonzero(blocks[done:done + full] != want)
                if len(bad):
                    row = (done + int(bad[0])) * b
                    raise self._error(f"checksum mismatch in {path} rows {row}:{min(row + b, n)}")
                crc = crc32_combine(crc, crc32_repeat(want, b * row_bytes, full), full * b * row_bytes)
                done += full
            if done < upto:  # the short last chunk
                size = (n - done * b) * row_bytes
                block_crc = fill_crc(ds.fillvalue, ds.dtype, size)
                if block_crc != int(blocks[done]):
                    raise self._error(f"checksum mismatch in {path} rows {done * b}:{n}")
                crc, done = crc32_combine(crc, block_crc, size), done + 1

        for k in allocated:
            fill_run(k)
            with self._reading(path):
                piece = ds[k * b : min(n, (k + 1) * b)]
            block_crc = crc32(piece)
            if block_crc != int(blocks[k]):
                raise self._error(f"checksum mismatch in {path} rows {k * b}:{min(n, (k + 1) * b)}")
            crc, done = crc32_combine(crc, block_crc, piece.nbytes), k + 1
        fill_run(len(blocks))
        if crc != expected:
            raise self._error(f"checksum mismatch in {path}")


@dataclass(frozen=True)
class Skipped:
    """A checkpoint passed over when looking for the newest that verifies: its file name and why."""

    file: str
    why: str  # the CheckpointError's line

    def __str__(self) -> str:
        return f"skipping checkpoint {self.file}: {self.why}; falling back to the previous one"


T = TypeVar("T")


def newest(run_dir: str | os.PathLike, accept: Callable[[CheckpointReader], T]) -> tuple[Path | None, T | None,
                                                                                      list[Skipped]]:
    """The newest checkpoint of ``run_dir`` whose round agrees with its name and that ``accept(reader)`` takes
    (raising :class:`CheckpointError` otherwise), with what ``accept`` returned, each checkpoint opened once;
    and every newer one passed over, newest first. ``(None, None, skipped)`` when none is left."""
    skipped: list[Skipped] = []
    for path in reversed(list_checkpoints(run_dir)):
        try:
            with CheckpointReader(path) as reader:
                if reader.meta["round"] != checkpoint_round(path):
                    raise CheckpointError(f"{path}: file name says round {checkpoint_round(path)}, "
                                          f"meta/round says {reader.meta['round']}")
                return path, accept(reader), skipped
        except CheckpointError as e:
            skipped.append(Skipped(path.name, str(e)))
    return None, None, skipped


def find_latest_valid(run_dir: str | os.PathLike, warn: Callable[[str], None] | None = None,
                      check: Callable[[CheckpointReader], None] | None = None) -> Path | None:
    """The newest checkpoint in ``run_dir`` that opens and verifies, or None (:func:`newest`).

    Each newer one that fails is reported through ``warn`` (default: ``warnings.warn``), naming the
    file and what is wrong, before falling back to the previous one. Temporaries are ignored.
    ``check(reader)`` may raise :class:`CheckpointError` for a file that verifies but is not what the
    caller needs (an incomplete layout, a broken chain); that file is skipped too.
    """

    def accept(reader: CheckpointReader) -> None:
        reader.verify()
        if check is not None:
            check(reader)

    found, _, skipped = newest(run_dir, accept)
    for passed in skipped:
        if warn is None:
            warnings.warn(str(passed), stacklevel=2)
        else:
            warn(str(passed))
    return found


def describe_checkpoint(path: str | os.PathLike) -> str:
    """A human-readable summary (what ``fedrun inspect CKPT.h5`` prints); verifies every checksum. The manifest
    (``meta/manifest``, the list of the others) has a line of its own."""
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
        for name in (n for n in r.datasets() if n != MANIFEST):
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
        if r.has(MANIFEST):
            try:
                r.verify([MANIFEST])
                lines.append(f"  manifest: {MANIFEST} lists the file's datasets, checksum ok")
            except CheckpointError as e:
                failed.append(str(e))
        else:
            lines.append("  manifest: none (written by an older fedrun; checked against the layout its config implies)")
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
