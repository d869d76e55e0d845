"""Where and with what a run ran (``runtime.json``'s ``provenance``), so that a result can be traced.

fedrun's version and, when the package is imported from a git checkout, the commit and whether the
tree had uncommitted changes (null when it is not: an installed package, no git; never an error); the
versions of Python, torch, numpy, mpi4py, h5py and the MPI library; rank 0's CPU kind (vendor, model, the
vector instruction sets it has, and the kernel family torch dispatches to on it: float results are the same
bits only on the same CPU kind with the same library versions, docs/results.md); the host name of every
rank; the Slurm job, step and array-task ids when present; the command line; the start time (UTC, ISO 8601).
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
    """``git args`` in the checkout holding the fedrun package; None when the package is not at the root of
    a git checkout (installed into site-packages, which may itself lie inside some other repository), when
    git is missing or fails."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():  # a directory, or a file in a worktree
        return None
    try:
        proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


# the instruction sets that decide which vector kernels numpy and torch take (the order of a float sum)
_ISA = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
        "amx_tile", "asimd", "sve", "sve2")


def cpu_kind() -> dict[str, Any]:
    """This machine's CPU: vendor, model, the instruction sets of ``_ISA`` it has (from /proc/cpuinfo on Linux,
    ``platform`` elsewhere) and torch's dispatch level (``torch.backends.cpu.get_cpu_capability``, e.g. AVX512);
    an unreadable field is None, never an error."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())  # the first processor's entry
    except OSError:
        pass
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    try:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError, RuntimeError):
        capability = None
    return {
        "machine": platform.machine() or None,
        "vendor": fields.get("vendor_id") or fields.get("CPU implementer") or None,
        "model": fields.get("model name") or fields.get("Model") or platform.processor() or None,
        "isa": [name for name in _ISA if name in flags] if flags else None,
        "torch_capability": capability,
    }


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
        "cpu": cpu_kind(),
        "hosts": hosts,
        "slurm": {key: os.environ[var] for key, var in _SLURM.items() if var in os.environ},
        "command": [sys.executable, *sys.argv],
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
