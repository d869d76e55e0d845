"""Which client store a run uses (``state.store``), and why, decided before anything is allocated.

``memory`` holds the block's per-client entries as tensors: ``C x (d x vectors + scalars) x itemsize``
bytes per rank. ``disk`` keeps the vector entries in sparse files under ``state.dir`` and costs disk
only for the rows a run writes: at most ``min(C, rounds x cohort)`` rows per vector entry. ``auto`` takes
memory while the block's state fits in half the memory available now, else disk while the rows the run
can write fit in the free space of ``state.dir``; a run that fits neither, or whose ``state.dir`` is not
a writable directory, is refused with one line. The free space is shared: the ranks whose ``state.dir``
is on one file system (one host and ``st_dev``) need the sum of their rows there,
``sum_{r on the disk} min(C_r, rounds x cohort) x d x vectors x itemsize <= free``.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fedrun.errors import ConfigError

MEMORY_SHARE = 0.5  # auto: the in-memory store may take this share of the memory available
DENSE_CHECKPOINT_BYTES = 256 << 20  # auto: a dense checkpoint per rank up to this size is cheap whatever
DENSE_RATIO = 4  # auto: beyond it, the dense checkpoint may be at most this many times the touchable rows


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


@dataclass(frozen=True)
class DiskShare:
    """One rank's claim on the file system of its ``state.dir``: ``need`` bytes of the ``free`` there."""

    host: str
    device: int  # st_dev of state.dir (or of its nearest existing parent)
    mount: str  # the file system's mount point, for the message
    free: int
    need: int


def disk_share(directory: Path, need: int) -> DiskShare:
    """This rank's :class:`DiskShare` of ``directory`` (every rank sends its own to rank 0)."""
    from fedrun.state.disk import mount_point

    existing = _existing(directory)
    return DiskShare(socket.gethostname(), os.stat(existing).st_dev, str(mount_point(existing)),
                     shutil.disk_usage(existing).free, need)


def crowded(shares: list[DiskShare]) -> tuple[DiskShare, int, int] | None:
    """The first disk whose ranks together need more than its free space: (a share of it, their total need,
    how many ranks share it); None when every disk has room."""
    disks: dict[tuple[str, int], list[DiskShare]] = {}
    for share in shares:
        disks.setdefault((share.host, share.device), []).append(share)
    for group in disks.values():
        need = sum(s.need for s in group)
        if need > min(s.free for s in group):
            return group[0], need, len(group)
    return None


def choose(requested: str, plan: StorePlan, directory: Path, available: int | None,
           shares: list[DiskShare] | None = None) -> tuple[str, str]:
    """``(kind, reason)``: the store to use for ``plan`` and a phrase saying why (for the start-up line).
    ``available``: bytes of memory available now (None: unknown, taken as enough); ``shares``: every rank's
    claim on its disk (None: this rank alone)."""
    mem, disk = plan.memory_bytes, plan.disk_bytes
    fits_memory = available is None or mem <= MEMORY_SHARE * available
    dense = mem > DENSE_CHECKPOINT_BYTES and mem > DENSE_RATIO * disk  # checkpoints far dearer than on disk
    avail = "unknown" if available is None else _gib(available)
    if requested == "memory" or (requested == "auto" and ((fits_memory and not dense) or plan.vectors == 0)):
        if available is not None and mem > available:
            raise ConfigError(f"state.store={requested}: the client state needs {_gib(mem)} per rank, more than "
                              f"the {avail} of memory available; expected state.store=disk or auto")
        return "memory", f"{_gib(mem)} per rank, {avail} of memory available"
    shares = shares or [disk_share(directory, disk)]
    full = crowded(shares)
    if full is not None:
        share, need, ranks = full
        raise ConfigError(f"state.dir={directory}: the client state needs up to {_gib(need)} of disk on "
                          f"{share.host}:{share.mount} for the {ranks} rank(s) sharing it (min(clients, rounds x "
                          f"cohort) rows) and {_gib(mem)} in memory per rank; {_gib(share.free)} free there and "
                          f"{avail} of memory available; expected fewer clients or rounds, or more space")
    free = shares[0].free
    _check_writable(directory)
    why = ("requested" if requested == "disk" else
           f"{_gib(mem)} per rank does not fit {MEMORY_SHARE:g} x {avail}" if not fits_memory else
           f"in memory each checkpoint would write all {_gib(mem)} per rank, on disk only the rows written")
    return "disk", f"{why}; up to {_gib(disk)} on disk in {directory} per rank, {_gib(free)} free"


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


def _existing(directory: Path) -> Path:
    """``directory``, or its nearest existing parent (the file system it will be on)."""
    path = directory
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"
