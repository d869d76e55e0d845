"""Which client store a run uses (``state.store``), and why, decided before anything is allocated.

``memory`` holds the block's per-client entries as tensors: ``C x (d x vectors + scalars) x itemsize``
bytes per rank. ``disk`` keeps the vector entries in sparse files under ``state.dir`` and costs disk
only for the rows a run writes: at most ``min(C, rounds x cohort)`` rows per vector entry. ``auto`` takes
memory while the block's state fits in half the memory available now, else disk while the rows the run
can write fit in the free space of ``state.dir``; a run that fits neither, or whose ``state.dir`` is not
a writable directory, is refused with one line.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fedrun.errors import ConfigError

MEMORY_SHARE = 0.5  # auto: the in-memory store may take this share of the memory available


@dataclass(frozen=True)
class StorePlan:
    """The block's state in numbers: ``vectors`` and ``scalars`` entries of C = ``rows`` clients."""

    rows: int
    dim: int
    vectors: int
    scalars: int
    itemsize: int
    touched_rows: int  # the most rows one vector entry of the block can be written at (rounds x cohort)

    @property
    def memory_bytes(self) -> int:
        return self.rows * (self.dim * self.vectors + self.scalars) * self.itemsize

    @property
    def disk_bytes(self) -> int:
        return min(self.rows, self.touched_rows) * self.dim * self.vectors * self.itemsize


def choose(requested: str, plan: StorePlan, directory: Path, available: int | None) -> tuple[str, str]:
    """``(kind, reason)``: the store to use for ``plan`` and a phrase saying why (for the start-up line).
    ``available``: bytes of memory available now (None: unknown, taken as enough)."""
    mem, disk = plan.memory_bytes, plan.disk_bytes
    fits_memory = available is None or mem <= MEMORY_SHARE * available
    avail = "unknown" if available is None else _gib(available)
    if requested == "memory" or (requested == "auto" and (fits_memory or plan.vectors == 0)):
        if available is not None and mem > available:
            raise ConfigError(f"state.store={requested}: the client state needs {_gib(mem)} per rank, more than "
                              f"the {avail} of memory available; expected state.store=disk or auto")
        return "memory", f"{_gib(mem)} per rank, {avail} of memory available"
    free = _free_bytes(directory)
    if disk > free:
        raise ConfigError(f"state.dir={directory}: the client state needs up to {_gib(disk)} of disk per rank "
                          f"(min(clients, rounds x cohort) rows) and {_gib(mem)} in memory; {_gib(free)} free there "
                          f"and {avail} of memory available; expected fewer clients or rounds, or more space")
    _check_writable(directory)
    why = "requested" if requested == "disk" else f"{_gib(mem)} per rank does not fit {MEMORY_SHARE:g} x {avail}"
    return "disk", f"{why}; up to {_gib(disk)} on disk in {directory}, {_gib(free)} free"


def _check_writable(directory: Path) -> None:
    """``state.dir`` must be a directory the ranks can create their files in: made if missing, then probed
    with an anonymous file, so a bad path is one line before any rank opens its store."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise ConfigError(f"state.dir={directory}: cannot create the client state files there "
                          f"({exc.strerror or exc}); expected a writable directory") from None


def _free_bytes(directory: Path) -> int:
    """Free bytes of the file system ``directory`` is (or will be) on."""
    path = directory
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"
