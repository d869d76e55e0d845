"""Incremental checkpoints: a chain of files, each holding the client rows changed since the one it builds on.

A checkpoint with a ``meta/base`` entry is an *increment*: its server state, schedule, history, metrics and
scalar client entries are whole, but a vector client entry ``clients/<name>`` is a group of two datasets,
``rows`` (int64 client ids, sorted, unique) and ``values`` (``[k, d]``), the rows changed since the base.
``meta/base`` (JSON) names the base file (in the same directory), its round and ``created``, and its
*identity*: the CRC-32 over every dataset's path and ``crc32`` of the base, so a base replaced by another
file of the same name is detected without reading its data. A checkpoint without ``meta/base`` is *full*.
A full checkpoint may hold an entry in the same rows form too: then the rows it does not list hold the
entry's declared initial value (the disk store's FedAWE x_own, docs/checkpoint.md).

The state of a client row is that of the newest link that stores it (newest first: the first occurrence
wins); a row no link stores holds the initial value. :class:`Chain` reads it a window of rows at a time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from fedrun.checkpoint.crc import crc32
from fedrun.checkpoint.files import list_checkpoints
from fedrun.checkpoint.format import rows_path, values_path
from fedrun.checkpoint.manifest import Legacy, check_complete
from fedrun.checkpoint.reader import CheckpointReader
from fedrun.errors import BrokenChain, CheckpointError

BASE = "meta/base"


def identity(reader: CheckpointReader) -> int:
    """CRC-32 over ``path crc32`` of every dataset: changes when any dataset of the file does."""
    text = "".join(f"{path} {reader.checksum(path)}\n" for path in reader.datasets())
    return crc32(text.encode("utf-8"))


def base_of(reader: CheckpointReader) -> dict[str, Any] | None:
    """The ``meta/base`` link of an increment (file, round, created, identity, depth), or None (full)."""
    if not reader.has(BASE):
        return None
    try:
        link = json.loads(reader.read(BASE))
        link = {"file": str(link["file"]), "round": int(link["round"]), "created": str(link["created"]),
                "identity": int(link["identity"]), "depth": int(link["depth"])}
    except (ValueError, TypeError, KeyError):
        raise CheckpointError(f"{reader.path}: {BASE} is not a link (JSON with file, round, created, identity, "
                              "depth)") from None
    if Path(link["file"]).name != link["file"] or link["depth"] < 1 or link["round"] >= reader.meta["round"]:
        raise CheckpointError(f"{reader.path}: {BASE} names {link['file']!r} of round {link['round']} at depth "
                              f"{link['depth']}; expected a checkpoint file name in the same directory, of an "
                              f"earlier round than {reader.meta['round']}, and a depth >= 1")
    return link


def link_to(base: CheckpointReader, depth: int) -> dict[str, Any]:
    """The ``meta/base`` of an increment on ``base`` (which is ``depth - 1`` increments from a full one)."""
    return {"file": base.path.name, "round": int(base.meta["round"]), "created": base.meta["created"],
            "identity": identity(base), "depth": depth}


def base_file(path: Path) -> Path | None:
    """The file ``path`` builds on, or None (a full checkpoint, or one that does not open: nothing verified)."""
    try:
        with CheckpointReader(path) as r:
            link = base_of(r)
    except CheckpointError:
        return None
    return None if link is None else path.parent / link["file"]


def needed_links(path: Path) -> list[Path]:
    """The files ``path`` builds on, newest first, as far as they open (nothing is verified)."""
    found: list[Path] = []
    while (path := base_file(path)) is not None:  # the rounds fall along a chain: it ends
        found.append(path)
    return found


def dependents(link: Path) -> list[Path]:
    """The checkpoints of ``link``'s directory that build on it, directly or through other links."""
    return [p for p in list_checkpoints(link.parent) if p != link and link in needed_links(p)]


class _Part:
    """How one link stores one client entry: ``rows`` (the rows form) or None (every row, a dataset)."""

    def __init__(self, reader: CheckpointReader, name: str) -> None:
        self.reader, self.name = reader, name
        self.rows: np.ndarray | None = None
        if reader.has(rows_path(name)):
            n = int(reader.meta["num_clients"])
            rows = np.asarray(reader.read(rows_path(name)))
            if rows.ndim != 1 or rows.dtype.kind not in "iu" or len(rows) != reader.shape(values_path(name))[0] or (
                    len(rows) and (rows[0] < 0 or rows[-1] >= n or np.any(np.diff(rows) <= 0))):
                raise CheckpointError(f"{reader.path}: {rows_path(name)} must be sorted unique client ids below {n}, "
                                      f"one per row of {values_path(name)}")
            self.rows = rows.astype(np.int64)

    def windows(self, first: int, stop: int, size: int) -> set[int]:
        """Indices of the ``size``-row windows of ``first:stop`` holding a row this link stores."""
        if self.rows is not None:
            r = self.rows[(self.rows >= first) & (self.rows < stop)]
            return set(((r - first) // size).tolist())
        out: set[int] = set()
        for lo, hi in self.reader.allocated_rows(self.name):
            lo, hi = max(lo, first), min(hi, stop)
            if lo < hi:
                out.update(range((lo - first) // size, (hi - 1 - first) // size + 1))
        return out

    def overlay(self, lo: int, hi: int, out: np.ndarray, known: np.ndarray) -> None:
        """Rows ``lo:hi`` this link stores into ``out`` where not ``known`` yet (verified); marks them known."""
        if self.rows is None:
            data = self.reader.read_rows(self.name, lo, hi)
            out[~known] = data[~known]
            known[:] = True
            return
        i0, i1 = np.searchsorted(self.rows, [lo, hi])
        if i1 > i0:
            idx = self.rows[i0:i1] - lo
            new = ~known[idx]
            out[idx[new]] = self.reader.read_rows(values_path(self.name), int(i0), int(i1))[new]
            known[idx] = True


class Chain:
    """A checkpoint and the links it builds on, newest first, each open; ``links[0]`` is the checkpoint (a path,
    opened here, or a reader already open, which stays the caller's to close).

    Opening follows ``meta/base`` and checks that each base is there, opens, and is the file the increment
    was written on (round, created, identity); any failure is a :class:`BrokenChain` naming the link."""

    def __init__(self, head: str | os.PathLike | CheckpointReader) -> None:
        self._borrowed = isinstance(head, CheckpointReader)
        self.links: list[CheckpointReader] = [head if isinstance(head, CheckpointReader) else CheckpointReader(head)]
        self._parts: dict[str, list[_Part]] = {}
        try:
            while (link := base_of(self.links[-1])) is not None:
                self.links.append(self._open(self.links[-1], link))
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _open(child: CheckpointReader, link: dict[str, Any]) -> CheckpointReader:
        path = child.path.parent / link["file"]
        if not path.is_file():
            raise BrokenChain(f"chain link {path.name} is missing ({child.path.name} builds on it)", path)
        try:
            base = CheckpointReader(path)
        except CheckpointError as exc:
            raise BrokenChain(f"chain link {path.name} is damaged ({exc})", path) from None
        try:
            found = (int(base.meta["round"]), base.meta["created"], identity(base))
            if found != (link["round"], link["created"], link["identity"]):
                raise BrokenChain(f"chain link {path.name} was replaced: {child.path.name} was written on round "
                                  f"{link['round']}, created {link['created']}, identity {link['identity']}; the "
                                  f"file has round {found[0]}, created {found[1]}, identity {found[2]}", path)
        except BaseException:
            base.close()
            raise
        return base

    def __enter__(self) -> Chain:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for r in self.links[1:] if self._borrowed else self.links:
            r.close()

    @property
    def head(self) -> CheckpointReader:
        return self.links[0]

    def verify(self) -> None:
        """Check every dataset of every link (its CRC-32); a failing base is a :class:`BrokenChain`."""
        self.head.verify()
        for r in self.links[1:]:
            try:
                r.verify()
            except CheckpointError as exc:
                raise BrokenChain(f"chain link {r.path.name} is damaged ({exc})", r.path) from None

    def check(self, legacy: Legacy | None = None) -> None:
        """Raise :class:`CheckpointError` unless every link is complete (its manifest, or ``legacy``'s for a file
        without one: fedrun.checkpoint.manifest) and passes every checksum, each checked once; a failing base
        is a :class:`BrokenChain` naming it. ``--resume FILE``, ``--resume auto``, ``inspect`` and
        ``consolidate`` all ask this: one meaning of a damaged chain."""
        check_complete(self.head, legacy)
        for link in self.links[1:]:
            try:
                check_complete(link, legacy)
            except CheckpointError as exc:
                raise BrokenChain(f"chain link {link.path.name} is incomplete ({exc})", link.path) from None
        self.verify()

    def parts(self, name: str) -> list[_Part]:
        """How the links store entry ``name``, newest first, down to the first that stores every row."""
        if name not in self._parts:
            parts = []
            for r in self.links:
                parts.append(_Part(r, name))
                if parts[-1].rows is None:
                    break
            self._parts[name] = parts
        return self._parts[name]

    def windows(self, name: str, first: int, stop: int, size: int) -> list[tuple[int, int]]:
        """The ``size``-row windows of rows ``first:stop`` of which some link stores a row, in order."""
        ks = set().union(*(p.windows(first, stop, size) for p in self.parts(name)))
        return [(first + k * size, min(stop, first + (k + 1) * size)) for k in sorted(ks)]

    def overlay(self, name: str, lo: int, hi: int, out: np.ndarray) -> np.ndarray:
        """Write the state of rows ``lo:hi`` of entry ``name`` into ``out`` (``hi - lo`` rows) where a link stores
        it; returns which rows it wrote (the others hold the entry's initial value; ``out`` keeps them)."""
        known = np.zeros(hi - lo, dtype=bool)
        for part in self.parts(name):
            part.overlay(lo, hi, out, known)
            if known.all():
                break
        return known

    def whole(self, name: str, fill: float = np.nan) -> np.ndarray:
        """Every row of entry ``name`` (``N x d`` in memory: for comparing runs), rows no link stores = ``fill``."""
        part = self.parts(name)[0]
        path = values_path(name) if part.rows is not None else name
        n = int(self.head.meta["num_clients"])
        out = np.full((n, *self.head.shape(path)[1:]), fill, dtype=self.head.dtype(path))
        self.overlay(name, 0, n, out)
        return out


class ChainTip:
    """The writing side of the chain: the checkpoint the next increment would build on (the newest of the run
    directory this run wrote or resumed from; None: the next checkpoint is full) and its depth, the
    increments since the last full one."""

    def __init__(self, path: Path | None = None, depth: int = 0) -> None:
        self.path, self.depth = path, depth

    def next_link(self, full_every: int) -> dict[str, Any] | None:
        """The ``meta/base`` of the next checkpoint when it is an increment (one in ``full_every`` is full), else
        None (full: the chain is ``full_every`` long, there is no tip, or it no longer opens)."""
        if self.path is None or self.depth + 1 >= full_every or not self.path.is_file():
            return None
        try:
            with CheckpointReader(self.path) as base:
                return link_to(base, self.depth + 1)
        except CheckpointError:
            return None
