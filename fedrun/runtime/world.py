"""The process world: rank, size, local rank and device, bootstrapped from MPI or Slurm.

fedrun is started by ``mpiexec``/``mpirun``, by ``srun`` (with or without an MPI plugin), or as a
plain single process. MPI (mpi4py) is the control plane: it carries the rendezvous port and small
control messages. The data plane is torch.distributed (NCCL on GPUs, gloo on CPUs), initialised from
a TCPStore that rank 0 binds to a free port chosen by the OS, so two runs on one machine never collide.
The store listens on 127.0.0.1 only unless the ranks span several hosts (see ``_master_store``).
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import time
import zlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


class LaunchError(RuntimeError):
    """The launcher environment is inconsistent (one line naming the variable)."""


@dataclass
class World:
    rank: int
    size: int
    local_rank: int
    device: torch.device
    backend: str  # "gloo", "nccl" or "none" (single process)
    comm: Any = None  # mpi4py communicator, or None without MPI
    store: Any = None  # the rendezvous TCPStore, kept alive until every rank has left the group
    peers: list[tuple[str, int]] | None = None  # (host, pid) of every rank, learnt at the rendezvous

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (control plane only: small objects, rare calls)."""
        if self.size == 1:
            return obj
        if self.comm is not None:
            return self.comm.bcast(obj, root=0)
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def allgather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (control plane only: small objects, rare calls)."""
        if self.size == 1:
            return [obj]
        if self.comm is not None:
            return self.comm.allgather(obj)
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (used when one rank fails, so that no peer hangs)."""
        if self.comm is not None and self.size > 1:
            # the caller printed fedrun's one line; MPICH would add "Abort(c) on node ...": keep stderr to that line
            sys.stderr.flush()
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
            self.comm.Abort(code)
        os._exit(code)

    def close(self) -> None:
        """Leave the process group together: no rank tears down its sockets while a peer still uses them."""
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
        if self.comm is not None and self.size > 1:
            self.comm.Barrier()
        self.store = None


def _int_env(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"environment variable {name}={value!r}: expected an integer") from None


def _mpi_comm() -> Any:
    """COMM_WORLD of mpi4py, or None if mpi4py (or an MPI library) is not available."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI.COMM_WORLD


def _pick_device(local_rank: int, requested: str) -> torch.device:
    if requested == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
    if requested == "cuda":
        raise LaunchError("run.device=cuda: no CUDA device is visible to this process")
    return torch.device("cpu")


def init_world(device: str = "auto", timeout_s: float = 120.0) -> World:
    """Discover rank/size from the launcher and initialise torch.distributed when size > 1."""
    comm = _mpi_comm()
    slurm_ntasks = _int_env("SLURM_NTASKS") if "SLURM_STEP_ID" in os.environ else None
    if comm is not None and comm.Get_size() > 1:
        rank, size = comm.Get_rank(), comm.Get_size()
        local_comm = comm.Split_type(_split_type_shared(), key=rank)
        local_rank = local_comm.Get_rank()
        local_comm.Free()
    elif slurm_ntasks is not None and slurm_ntasks > 1:
        # srun without an MPI plugin: every task is an MPI singleton; take the ranks from Slurm.
        comm = None
        rank = _int_env("SLURM_PROCID")
        local_rank = _int_env("SLURM_LOCALID") or 0
        size = slurm_ntasks
        if rank is None:
            raise LaunchError("SLURM_NTASKS > 1 but SLURM_PROCID is not set")
    else:
        rank, size, local_rank = 0, 1, 0
        comm = comm if comm is not None and comm.Get_size() == 1 else None
    dev = _pick_device(local_rank, device)
    if size == 1:
        return World(rank=0, size=1, local_rank=0, device=dev, backend="none", comm=comm)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    store = _rendezvous(comm, rank, size, timeout_s)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return World(rank=rank, size=size, local_rank=local_rank, device=dev, backend=backend, comm=comm,
                 store=store, peers=exchange_peers(store, rank, size))


def _split_type_shared() -> int:
    from mpi4py import MPI

    return MPI.COMM_TYPE_SHARED


def _rendezvous(comm: Any, rank: int, size: int, timeout_s: float) -> dist.TCPStore:
    """A TCPStore on rank 0; its address and OS-chosen port reach the other ranks over MPI.

    Without MPI (srun, no plugin) the port is derived from the Slurm job and step ids and the address
    is the first node of the allocation (or MASTER_ADDR/MASTER_PORT when the user sets them).
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    if comm is not None:
        hosts = comm.allgather(socket.gethostname())
        host = "127.0.0.1" if len(set(hosts)) == 1 else os.environ.get("MASTER_ADDR", hosts[0])
        if rank == 0:
            store = _master_store(host == "127.0.0.1", 0, size, timeout)
            comm.bcast((host, store.port), root=0)
            return store
        host, port = comm.bcast(None, root=0)
        return dist.TCPStore(host, port, size, False, timeout=timeout)
    host = os.environ.get("MASTER_ADDR") or _first_slurm_host()
    port = _int_env("MASTER_PORT") or _slurm_port()
    if rank == 0:
        return _master_store(host in ("127.0.0.1", "localhost"), port, size, timeout)
    return dist.TCPStore(host, port, size, False, timeout=timeout)


def _master_store(loopback: bool, port: int, size: int, timeout: datetime.timedelta) -> dist.TCPStore:
    """Rank 0's TCPStore server; on one host it accepts connections on 127.0.0.1 only.

    TCPStore itself listens on every interface whatever host name it is given, so for a single-host
    job fedrun binds the listening socket to loopback itself and hands it over (``master_listen_fd``).
    """
    if not loopback:
        return dist.TCPStore("0.0.0.0", port, size, True, timeout=timeout, wait_for_workers=False)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        port = sock.getsockname()[1]
    except OSError as exc:
        sock.close()
        raise LaunchError(f"rendezvous: cannot listen on 127.0.0.1:{port} ({exc})") from None
    fd = sock.detach()  # the store owns the listening socket from now on
    return dist.TCPStore("127.0.0.1", port, size, True, timeout=timeout, wait_for_workers=False,
                         master_listen_fd=fd, use_libuv=True)


def _first_slurm_host() -> str:
    nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST") or ""
    if not nodes or os.environ.get("SLURM_NNODES", "1") == "1":
        return "127.0.0.1"
    import subprocess

    out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def _slurm_port() -> int:
    key = f"{os.environ.get('SLURM_JOB_ID', '0')}.{os.environ.get('SLURM_STEP_ID', '0')}"
    return 20000 + zlib.crc32(key.encode()) % 30000


# ------------------------------------------------------------------------------- naming a lost rank
#
# Every rank publishes its host and pid in the rendezvous store (whatever the launcher: mpiexec, srun or
# torchrun all go through a TCPStore), so that the survivor that notices a broken collective first can
# name the rank that died or stopped, without asking the store again (it may have died with rank 0).


def exchange_peers(store: Any, rank: int, size: int) -> list[tuple[str, int]]:
    """(host, pid) of every rank, in rank order, through the store (every rank calls it)."""
    store.set(f"fedrun/peer/{rank}", f"{socket.gethostname()} {os.getpid()}")
    peers = []
    for r in range(size):
        host, pid = store.get(f"fedrun/peer/{r}").decode().rsplit(" ", 1)
        peers.append((host, int(pid)))
    return peers


def _process_state(pid: int) -> str | None:
    """How a process of this host fails: 'is gone' (exited, killed, a zombie) or 'is stopped'; None if running."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "is gone"
    return {"Z": "is gone", "X": "is gone", "T": "is stopped", "t": "is stopped"}.get(state)


def lost_ranks(world: World) -> list[str]:
    """``rank R on host H died or stopped answering (...)`` for every peer on this host whose process is gone
    or stopped; when none is, a lone peer on another host is the one that stopped answering."""
    if not world.peers:
        return []
    here = socket.gethostname()
    found: list[str] = []
    deadline = time.monotonic() + 1.0  # a killed process may take a moment to leave the running state
    while not found and time.monotonic() < deadline:
        for rank, (host, pid) in enumerate(world.peers):
            if rank != world.rank and host == here and (state := _process_state(pid)) is not None:
                found.append(f"rank {rank} on host {host} died or stopped answering (its process {pid} {state})")
        if not found:
            time.sleep(0.05)
    others = [(r, host) for r, (host, _) in enumerate(world.peers) if host != here]
    if not found and len(others) == 1:
        found.append(f"rank {others[0][0]} on host {others[0][1]} died or stopped answering")
    return found
