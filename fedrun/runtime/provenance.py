"""Where and with what a run ran (``runtime.json``'s ``provenance``), so that a result can be traced.

fedrun's version and, when the package is imported from a git checkout, the commit and whether the
tree had uncommitted changes; the versions of Python, torch, numpy, mpi4py, h5py and the MPI library;
the host name of every rank; the Slurm job, step and array-task ids when present; the command line; the
start time (UTC, ISO 8601).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from fedrun.runtime.world import World

_SLURM = {"job_id": "SLURM_JOB_ID", "step_id": "SLURM_STEP_ID", "array_job_id": "SLURM_ARRAY_JOB_ID",
          "array_task_id": "SLURM_ARRAY_TASK_ID"}


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    """``git args`` in the directory of the fedrun package (None when it is not a git checkout)."""
    try:
        proc = subprocess.run(["git", *args], cwd=Path(__file__).resolve().parents[2], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _mpi_library() -> str | None:
    """The version string of the MPI library this process started, None when the run does not use MPI
    (torchrun, srun without an MPI plugin: mpi4py is never imported, and is not imported here either)."""
    MPI = sys.modules.get("mpi4py.MPI")  # noqa: N806 - the module's own name
    if MPI is None:
        return None
    return " ".join(MPI.Get_library_version().split()) or None


def provenance(world: World) -> dict[str, Any]:
    """The provenance record (collective: every rank contributes its host name)."""
    hosts = world.allgather_object(socket.gethostname())
    if not world.is_root:
        return {}
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {
        "fedrun": _version("fedrun"),
        "git_commit": commit,
        "git_dirty": None if status is None else bool(status),
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in ("torch", "numpy", "mpi4py", "h5py")},
        "mpi_library": _mpi_library(),
        "hosts": hosts,
        "slurm": {key: os.environ[var] for key, var in _SLURM.items() if var in os.environ},
        "command": [sys.executable, *sys.argv],
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
