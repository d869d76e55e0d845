"""Checkpoint files in a run directory: names, listing, durable replace, pruning.

Nothing here knows HDF5. A checkpoint of the state *before* round ``r`` runs is the file
``ckpt_<r:08d>.h5``; while it is written it is ``.ckpt_<r:08d>.h5.tmp`` in the same directory, so the
final ``os.replace`` is atomic (same file system) and a reader never sees a half-written checkpoint.
"""

from __future__ import annotations

import errno
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path

from fedrun.errors import CheckpointError

_FINAL = re.compile(r"^ckpt_(\d{8,})\.h5$")
_TMP = re.compile(r"^\.ckpt_\d{8,}\.h5\.tmp$")


def checkpoint_name(round: int) -> str:
    """File name of the checkpoint whose next round to run is ``round``."""
    if round < 0:
        raise ValueError(f"round must be >= 0, got {round}")
    return f"ckpt_{round:08d}.h5"


def temporary_name(round: int) -> str:
    """File name a checkpoint is written under before it is renamed into place."""
    return "." + checkpoint_name(round) + ".tmp"


def checkpoint_round(path: str | os.PathLike) -> int:
    """The round encoded in a checkpoint file name (``ckpt_00000042.h5`` -> 42)."""
    match = _FINAL.match(Path(path).name)
    if match is None:
        raise CheckpointError(f"{path}: not a checkpoint file name (expected ckpt_<round>.h5)")
    return int(match.group(1))


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Checkpoint files in ``run_dir``, oldest round first; temporary files are not listed."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if (m := _FINAL.match(p.name)) and p.is_file()]
    return [p for _, p in sorted(found)]


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Delete temporaries left by a writer that died (exception, SIGKILL, node failure).

    Only one process (rank 0) writes checkpoints into a run directory, so any temporary present
    when a new write starts is garbage.
    """
    removed = []
    for p in run_dir.iterdir():
        if _TMP.match(p.name):
            try:
                p.unlink()
                removed.append(p)
            except FileNotFoundError:
                pass
    return removed


def fsync_directory(path: Path) -> None:
    """Make a rename in ``path`` durable. Some network file systems refuse; that is not an error."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EROFS):
            raise
    finally:
        os.close(fd)


def prune(run_dir: Path, newest_round: int, keep: int | None,
          base: Callable[[Path], Path | None]) -> list[Path]:
    """Keep the checkpoint of ``newest_round``, the ``keep - 1`` newest ones before it, and every file those
    build on (``base(path)``: the file an incremental checkpoint builds on, fedrun.checkpoint.chain; each
    kept file is asked once).

    ``keep`` counts checkpoints a run can resume from; a base is deleted only when no kept checkpoint
    needs it. Called only after the checkpoint of ``newest_round`` is in place. Checkpoints of rounds after
    ``newest_round`` (left by an earlier attempt of the run) are neither counted nor deleted; see
    :func:`remove_checkpoints_after`.
    """
    if keep is None:
        return []
    upto = [p for p in list_checkpoints(run_dir) if checkpoint_round(p) <= newest_round]
    kept, todo = set(upto[-keep:]), upto[-keep:]
    while todo:
        link = base(todo.pop())
        if link is not None and link not in kept:
            kept.add(link)
            todo.append(link)
    removed = []
    for p in upto:
        if p in kept:
            continue
        try:
            p.unlink()
            removed.append(p)
        except FileNotFoundError:
            pass
        except OSError as e:  # the new checkpoint is safe; failing to clean up must not fail the run
            warnings.warn(f"could not delete old checkpoint {p}: {e.strerror}", stacklevel=3)
    return removed


def remove_checkpoints_after(run_dir: str | os.PathLike, round: int) -> list[Path]:
    """Delete checkpoints of rounds > ``round``: for a run resumed from an older checkpoint."""
    removed = []
    for p in list_checkpoints(run_dir):
        if checkpoint_round(p) > round:
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed
