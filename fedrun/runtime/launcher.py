"""What the launcher says: rank, size and rendezvous hints from mpiexec/srun/torchrun environments.

Nothing here starts anything; :func:`fedrun.runtime.world.init_world` decides from these answers.
A variable that is set but malformed is a :class:`LaunchError` naming it.
"""

from __future__ import annotations

import os
import zlib
from typing import Any

from fedrun.errors import LaunchError, brief


def int_env(name: str) -> int | None:
    """The integer in environment variable ``name``; None when unset or empty."""
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"environment variable {name}={brief(value)}: expected an integer") from None


# set for every rank by the MPI process managers fedrun meets: Slurm's pmi2 and pmix plugins, MPICH's
# hydra (PMI_RANK), Open MPI's mpirun (OMPI_COMM_WORLD_SIZE)
MPI_LAUNCH_VARIABLES = ("PMI_RANK", "PMI_FD", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE")


def mpi_launched() -> bool:
    """Whether an MPI process manager started this process (then its ranks are MPI's)."""
    return any(os.environ.get(name) for name in MPI_LAUNCH_VARIABLES)


def mpi_comm() -> Any:
    """COMM_WORLD of mpi4py, or None if mpi4py (or an MPI library) is not available."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD


def torchrun_env() -> dict[str, Any] | None:
    """RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT of torchrun (or another launcher that
    sets them, e.g. ``torch.distributed.launch`` or a hand-written script), or None when they are absent.

    RANK and WORLD_SIZE together mark such a launch; then MASTER_ADDR and MASTER_PORT are required.
    """
    if os.environ.get("RANK") is None or os.environ.get("WORLD_SIZE") is None:
        return None
    rank, size = int_env("RANK"), int_env("WORLD_SIZE")
    assert rank is not None and size is not None
    if size < 1 or not 0 <= rank < size:
        raise LaunchError(f"environment variables RANK={rank} WORLD_SIZE={size}: expected 0 <= RANK < WORLD_SIZE")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            raise LaunchError(f"RANK and WORLD_SIZE are set (a torchrun-style launch) but {name} is not")
    local_rank = int_env("LOCAL_RANK") or 0
    local_size = int_env("LOCAL_WORLD_SIZE")
    return {"rank": rank, "size": size, "local_rank": local_rank, "local_size": local_size,
            "master_addr": os.environ["MASTER_ADDR"], "master_port": int_env("MASTER_PORT"),
            "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            "elastic": "TORCHELASTIC_RUN_ID" in os.environ}


def split_type_shared() -> int:
    """MPI's split type of the ranks that share a node (their order gives the local rank)."""
    from mpi4py import MPI

    return MPI.COMM_TYPE_SHARED


def first_slurm_host() -> str:
    """The first node of the Slurm step (where rank 0 runs), or loopback on one node."""
    nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST") or ""
    if not nodes or os.environ.get("SLURM_NNODES", "1") == "1":
        return "127.0.0.1"
    import subprocess

    out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def slurm_port() -> int:
    """The store's port without MPI: derived from the Slurm job and step ids, the same on every rank."""
    key = f"{os.environ.get('SLURM_JOB_ID', '0')}.{os.environ.get('SLURM_STEP_ID', '0')}"
    return 20000 + zlib.crc32(key.encode()) % 30000
