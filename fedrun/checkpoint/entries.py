"""How a per-client entry ``clients/<name>`` is stored, and :class:`EntryWriter`, which stores one from the rows
a run hands it (in ascending client order, any pieces).

Two forms (docs/checkpoint.md):

* **whole**: one ``[N, ...]`` dataset. Chunks holding no stored row are never allocated and read back as the
  fill value, the entry's constant initial value (zeros, a number); the other rows of a chunk holding a
  stored row are written as that value.
* **rows**: ``clients/<name>/rows`` (the sorted, unique client ids stored, int64) and
  ``clients/<name>/values`` (``[k, ...]``, their rows). The rows not listed hold the entry's initial value
  (a full checkpoint) or the state of the link below (an increment, fedrun.checkpoint.chain).

Which form: a vector entry of an increment, and a sparse vector entry whose initial value is not one
number (x^(0)), take the rows form; every other entry the whole form, in small chunks when sparse (a chunk
holding one stored row then costs about that row) and about 8 MiB of rows when every row is stored.
"""

from __future__ import annotations

import numpy as np

from fedrun.checkpoint.format import rows_path, values_path
from fedrun.checkpoint.writer import CheckpointWriter

_SPARSE_CHUNK_BYTES = 64 << 10  # rows per chunk of a sparse whole entry: one row of a large model
_DENSE_CHUNK_BYTES = 8 << 20  # rows per chunk of an entry storing every row


class EntryWriter:
    """Writes entry ``path`` (``clients/<name>``) of ``writer``: ``stored`` rows of shape ``row_shape`` out of
    the writer's N, handed to :meth:`put` in ascending client order; :meth:`finish` when all are in.

    ``increment``: the file builds on another (rows not stored are the base's); ``fill``: the entry's
    initial value when it is one number, else None."""

    def __init__(self, writer: CheckpointWriter, path: str, stored: int, row_shape: tuple[int, ...],
                 dtype: np.dtype, *, increment: bool, fill: float | None) -> None:
        n = writer.num_clients
        self.writer, self.path, self.done = writer, path, 0
        row_bytes = max(1, int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
        self.rows_form = bool(row_shape) and (increment or (stored < n and fill is None))
        if self.rows_form:
            writer.create_rows(rows_path(path), stored, (), np.int64)
            writer.create_rows(values_path(path), stored, row_shape, dtype)
            return
        chunk = (_SPARSE_CHUNK_BYTES if stored < n else _DENSE_CHUNK_BYTES) // row_bytes
        sparse = stored < n and fill is not None
        writer.create_rows(path, n, row_shape, dtype, rows_per_chunk=max(1, chunk), fill=fill if sparse else 0.0)

    def put(self, ids: np.ndarray, values: np.ndarray) -> None:
        """The rows of clients ``ids`` (sorted, after every id put before)."""
        if self.rows_form:
            self.writer.write_rows(rows_path(self.path), self.done, ids.astype(np.int64, copy=False))
            self.writer.write_rows(values_path(self.path), self.done, values)
            self.done += len(ids)
            return
        breaks = np.flatnonzero(np.diff(ids) != 1) + 1  # runs of consecutive clients
        for lo, hi in zip([0, *breaks.tolist()], [*breaks.tolist(), len(ids)], strict=True):
            if hi > lo:
                self.writer.skip_rows(self.path, self.done, int(ids[lo]))
                self.writer.write_rows(self.path, int(ids[lo]), values[lo:hi])
                self.done = int(ids[hi - 1]) + 1

    def finish(self) -> None:
        """Every row is in: the rows after the last stored one hold the fill value."""
        if not self.rows_form:
            self.writer.skip_rows(self.path, self.done, self.writer.num_clients)
