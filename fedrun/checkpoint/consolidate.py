"""``fedrun checkpoint consolidate CKPT --out FILE``: one self-contained checkpoint from a chain.

An increment (fedrun.checkpoint.chain) needs the files it builds on. For archiving or moving a run, this
writes the state it stands for as one full checkpoint: the head's server state, schedule, history, metrics and
scalar client entries as they are, and every vector client entry in the rows form with the rows some link
stores (each from the newest link storing it); rows no link stores hold the entry's initial value, as in
the chain. Rank-free, one process, a window of rows at a time (never ``N x d``; the rows are read twice,
their count comes first in the file); every link and the output are verified. Nothing is left at ``--out``
unless the whole file is written and verifies.

A full checkpoint (no ``meta/base``) is whole already: it is verified and, with ``--out``, copied byte for
byte (the copy verified before it takes the name), without ``--out`` only reported as whole.

Whether the chain is whole is the caller's ``check``, the one a resume asks
(``fedrun.federation.snapshot.check_chain``: a file written without a manifest is checked against the layout
its config implies, which takes the algorithm).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedrun.checkpoint import CheckpointReader, CheckpointWriter, checkpoint_name
from fedrun.checkpoint.chain import Chain, base_of
from fedrun.checkpoint.format import CLIENTS, error_line, rows_path, values_path
from fedrun.errors import CheckpointError

_WINDOW_BYTES = 8 << 20  # rows of one entry held at a time


def consolidate(source: str | os.PathLike, out: str | os.PathLike | None,
                check: Callable[[CheckpointReader], None]) -> tuple[Path | None, int, bool]:
    """Write the state of checkpoint ``source`` (and its chain) to ``out`` as one full checkpoint; returns
    (out, rounds done, whether ``source`` was whole already). A full ``source`` is copied as it is (``out``
    None: nothing written). ``check(reader)`` raises :class:`CheckpointError` unless the chain is whole. Raises
    :class:`CheckpointError` (one line) with nothing written at ``out``."""
    source, out = Path(source), None if out is None else Path(out)
    if out is not None and out.exists():
        raise CheckpointError(f"--out {out}: already exists; expected a new file name")
    if out is not None and not out.parent.is_dir():
        raise CheckpointError(f"--out {out}: no such directory {out.parent}")
    with CheckpointReader(source) as ckpt:
        check(ckpt)  # every link opens, is the file it was written on, is complete and verifies
        whole, done = base_of(ckpt) is None, ckpt.round
    if out is None:
        if not whole:
            raise CheckpointError(f"{source}: an incremental checkpoint; expected --out FILE to write it to")
        return None, done, True
    try:
        scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as exc:
        raise CheckpointError(f"--out {out}: cannot write there ({error_line(exc)})") from None
    try:
        if whole:
            written = scratch / source.name
            shutil.copyfile(source, written)
            with CheckpointReader(written) as copy:
                copy.verify()
            os.replace(written, out)
            return out, done, True
        with Chain(source) as chain:
            head = chain.head
            m = head.meta
            with CheckpointWriter(scratch, m["round"], algorithm=m["algorithm"], num_clients=m["num_clients"],
                                  dim=m["dim"], config=head.read("meta/config"), keep=None) as w:
                for path in head.datasets():
                    if not path.startswith(("meta/", f"{CLIENTS}/")):
                        w.write(path, head.read(path))
                for name in head.names(CLIENTS):
                    _copy_entry(chain, w, f"{CLIENTS}/{name}", m["num_clients"])
        written = scratch / checkpoint_name(m["round"])
        with CheckpointReader(written) as copy:
            copy.verify()
        os.replace(written, out)
    except OSError as exc:
        raise CheckpointError(f"--out {out}: cannot write the file ({error_line(exc)})") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out, done, False


def _copy_entry(chain: Chain, w: CheckpointWriter, name: str, n: int) -> None:
    """Entry ``name`` of the chain's state into ``w``: a scalar entry whole, a vector entry in the rows form."""
    head = chain.head
    if head.has(name) and len(head.shape(name)) == 1:  # a scalar entry: whole in every link
        w.create_rows(name, n, (), head.dtype(name))
        step = max(1, _WINDOW_BYTES // head.dtype(name).itemsize)
        for lo in range(0, n, step):
            w.write_rows(name, lo, head.read_rows(name, lo, min(n, lo + step)))
        return
    part = chain.parts(name)[0]
    values = values_path(name) if part.rows is not None else name
    row_shape, dtype = head.shape(values)[1:], head.dtype(values)
    size = max(1, _WINDOW_BYTES // max(1, dtype.itemsize * int(np.prod(row_shape))))
    windows = chain.windows(name, 0, n, size)
    counts = []  # first pass: how many rows the chain stores (the file's row count comes first)
    for lo, hi in windows:
        counts.append(int(chain.overlay(name, lo, hi, np.zeros((hi - lo, *row_shape), dtype=dtype)).sum()))
    w.create_rows(rows_path(name), sum(counts), (), np.int64)
    w.create_rows(values_path(name), sum(counts), row_shape, dtype)
    done = 0
    for lo, hi in windows:
        buf = np.zeros((hi - lo, *row_shape), dtype=dtype)
        known = chain.overlay(name, lo, hi, buf)
        w.write_rows(rows_path(name), done, np.flatnonzero(known).astype(np.int64) + lo)
        w.write_rows(values_path(name), done, buf[known])
        done += int(known.sum())
