"""The process world: rank, size, local rank and device, bootstrapped from MPI, Slurm or torchrun.

fedrun is started by ``mpiexec``/``mpirun``, by ``srun`` (with or without an MPI plugin), by ``torchrun``
(or any launcher that sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, without MPI), or as a plain
single process. Under MPI, mpi4py is the control plane: it carries the rendezvous address and port and
small control messages. The data plane is torch.distributed, initialised from a TCPStore that rank 0
binds to a free port chosen by the OS, so two runs on one machine never collide (under torchrun, from the
store of torchrun's agent at MASTER_ADDR:MASTER_PORT; fedrun.runtime.rendezvous).
Its backend follows where the ranks run (:func:`collective_backend`): NCCL when every rank has a GPU of its
own, else gloo on host buffers (ranks on CPUs, or several ranks sharing a GPU: a host's ranks take its GPUs
round-robin, ``local_rank % device_count``).
What the launcher's environment says is read in fedrun.runtime.launcher; naming a lost rank is
fedrun.runtime.failures.

Where the store and gloo listen (fedrun.runtime.network, docs/clusters.md): when every rank is on
one host, on loopback only. When the ranks span hosts, on one deliberately chosen interface per rank:
``FEDRUN_IFNAME`` if set, else ``GLOO_SOCKET_IFNAME`` if set, else the interface of the route from this
host to the first host (on the first host, to the next host). The choice is in :attr:`World.network`.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from fedrun.errors import ConfigError, LaunchError, RunFailure, one_line, report
from fedrun.runtime.launcher import int_env, mpi_comm, mpi_launched, split_type_shared, torchrun_env
from fedrun.runtime.network import choose_interface, ifname_of, is_loopback_name, loopback
from fedrun.runtime.rendezvous import exchange, exchange_peers, listen_address, master_store, rendezvous


@dataclass
class World:
    rank: int
    size: int
    local_rank: int
    device: torch.device
    backend: str  # "gloo", "nccl" or "none" (single process); chosen by collective_backend
    comm: Any = None  # mpi4py communicator, or None without MPI
    store: Any = None  # the rendezvous TCPStore, kept alive until every rank has left the group
    peers: list[tuple[str, int]] | None = None  # (host, pid) of every rank, learnt at the rendezvous
    launcher: str = "single"  # "mpi", "slurm" (srun without an MPI plugin), "torchrun" or "single"
    # how the ranks found each other (None for one process): hosts, this rank's bind address and
    # interface and why it was chosen, the store's address, and every rank's choice (``ranks``)
    network: dict[str, Any] | None = None

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def bind_address(self) -> str | None:
        """The local address this rank's gloo sockets (and, on rank 0, the store) listen on."""
        return None if self.network is None else self.network.get("bind_address")

    @property
    def ifname(self) -> str | None:
        """The network interface of :attr:`bind_address` (``lo`` on a single host)."""
        return None if self.network is None else self.network.get("ifname")

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    # The control plane goes through torch.distributed, never MPI, once the group exists: a gloo collective
    # fails when a peer dies, while MPICH's shared-memory collectives wait for a dead rank forever, in C,
    # where no signal handler runs (rank 0 SIGKILLed during a checkpoint's allgather hung its survivor, and
    # mpiexec.gforker with it).

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (control plane only: small objects, rare calls)."""
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def allgather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (control plane only: small objects, rare calls)."""
        if self.size == 1:
            return [obj]
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
        """Leave the process group together: no rank tears down its sockets while a peer still uses them. The
        barrier is gloo's, which fails when a peer has died; MPI's only where no process group was made (an
        MPI barrier waits for a dead peer forever under some launchers, docs/reliability.md)."""
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
        elif self.comm is not None and self.size > 1:
            self.comm.Barrier()
        self.store = None


def deterministic_cuda() -> None:
    """Deterministic CUDA kernels, which exact batched training needs (docs/design.md): cuDNN's deterministic
    algorithms without benchmarking, and torch's deterministic mode (ops without a deterministic kernel
    warn). cuBLAS is deterministic only with CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8) set before its
    first call; fedrun sets the first where the environment has neither."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)


def _pick_device(local_rank: int, requested: str) -> torch.device:
    """The CPU, or the GPU ``local_rank % device_count`` of this host: more ranks than GPUs share them
    round-robin."""
    if requested == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        deterministic_cuda()
        return torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
    if requested == "cuda":
        raise ConfigError("run.device=cuda: no CUDA device is visible to this process; expected a GPU (check "
                          "CUDA_VISIBLE_DEVICES and that torch is a CUDA build), or run.device=auto or cpu")
    return torch.device("cpu")


def _device_or_problem(local_rank: int, requested: str, size: int) -> tuple[torch.device, str | None]:
    """:func:`_pick_device`, or, for one rank of several, the CPU and why its device is missing: the rank still
    joins the rendezvous and says why there (:func:`_init_group`), so that no peer waits for it in vain."""
    try:
        return _pick_device(local_rank, requested), None
    except LaunchError as exc:
        if size == 1:
            raise
        return torch.device("cpu"), f"{exc} (on {socket.gethostname()})"


def device_key(device: torch.device) -> str:
    """This rank's host and device, as a string that two ranks share exactly when they share the device (a
    GPU by its UUID, so that ranks which each see their own GPU as cuda:0 are told apart)."""
    if device.type != "cuda":
        return f"{socket.gethostname()} cpu"
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return f"{socket.gethostname()} {device if uuid is None else f'cuda-{uuid}'}"


def collective_backend(devices: list[str]) -> tuple[str, str]:
    """The process group's backend for ranks on ``devices`` (every rank's :func:`device_key`), and why.

    NCCL runs one rank per GPU (two NCCL ranks on one device fail: "invalid usage"), so it is taken only
    when every rank has a GPU that no other rank has. Otherwise gloo, whose collectives fedrun runs on host
    buffers (fedrun.runtime.flat copies a GPU buffer to the host and back around each one): ranks on CPUs,
    or several ranks sharing a GPU. The collectives only move and add buffers whose sums are exact
    (fedrun.runtime.exact_sum), so either backend gives the same bits."""
    on_cpu = [rank for rank, key in enumerate(devices) if key.endswith(" cpu")]
    if len(on_cpu) == len(devices):
        return "gloo", "gloo: the ranks run on CPUs"
    if on_cpu:
        return "gloo", f"gloo on host buffers: rank {on_cpu[0]} runs on a CPU"
    first: dict[str, int] = {}
    for rank, key in enumerate(devices):
        if key in first:
            return "gloo", f"gloo on host buffers: ranks {first[key]} and {rank} share one GPU ({key})"
        first[key] = rank
    return "nccl", "nccl: every rank has a GPU of its own"


def init_world(device: str = "auto", timeout_s: float = 120.0) -> World:
    """Discover rank/size from the launcher and initialise torch.distributed when size > 1."""
    torchrun = torchrun_env()
    if torchrun is not None:  # before MPI: torchrun's workers are not MPI ranks (mpi4py is not imported)
        with _rendezvous_guard(torchrun["rank"], timeout_s, None):
            return _init_torchrun(torchrun, device, timeout_s)
    slurm_ntasks = int_env("SLURM_NTASKS") if "SLURM_STEP_ID" in os.environ else None
    # srun without an MPI plugin (launch/srun.sh's default): Slurm gives the ranks, and mpi4py is not
    # imported, so no MPI library starts (an MPI singleton per task would only cost start-up time)
    without_mpi = slurm_ntasks is not None and slurm_ntasks > 1 and not mpi_launched()
    comm = None if without_mpi else mpi_comm()
    if comm is not None and comm.Get_size() > 1:
        launcher = "mpi"
        rank, size = comm.Get_rank(), comm.Get_size()
        local_comm = comm.Split_type(split_type_shared(), key=rank)
        local_rank = local_comm.Get_rank()
        local_comm.Free()
    elif slurm_ntasks is not None and slurm_ntasks > 1:
        # srun without an MPI plugin (or an MPI that sees a singleton): take the ranks from Slurm.
        launcher = "slurm"
        comm = None
        rank = int_env("SLURM_PROCID")
        local_rank = int_env("SLURM_LOCALID") or 0
        size = slurm_ntasks
        if rank is None:
            raise LaunchError("SLURM_NTASKS > 1 but SLURM_PROCID is not set")
    else:
        rank, size, local_rank = 0, 1, 0
        comm = comm if comm is not None and comm.Get_size() == 1 else None
    dev, problem = _device_or_problem(local_rank, device, size)
    if size == 1:
        return World(rank=0, size=1, local_rank=0, device=dev, backend="none", comm=comm)
    with _rendezvous_guard(rank, timeout_s, comm):
        store, network = rendezvous(comm, rank, size, timeout_s)
        return _init_group(World(rank=rank, size=size, local_rank=local_rank, device=dev, backend="gloo",
                                 comm=comm, store=store, launcher=launcher, network=network), store, timeout_s,
                           problem)


@contextmanager
def _rendezvous_guard(rank: int, timeout_s: float, comm: Any) -> Iterator[None]:
    """A rendezvous that fails (a peer that never connects within ``run.timeout_s``, a refused connection)
    ends this rank with one line naming it, never a traceback; under MPI it ends the whole job at once
    (``MPI_Abort``: a peer waiting in an MPI call has no timeout), elsewhere every rank meets its own
    timeout and says so."""
    try:
        yield
    except (LaunchError, KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # noqa: BLE001 - whatever torch.distributed raises (DistNetworkError, timeouts)
        report(f"fedrun[rank {rank}]: error: the rendezvous of the ranks failed within run.timeout_s="
               f"{timeout_s:g} s: {one_line(exc)}")
        if comm is not None and comm.Get_size() > 1:
            sys.stderr.flush()
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # MPICH's own "Abort(1) on node ..." line
            comm.Abort(1)
        failure = RunFailure(f"rendezvous failed: {one_line(exc)}")
        failure.reported = True  # type: ignore[attr-defined]
        raise failure from None


def _init_group(world: World, store: Any, timeout_s: float, problem: str | None) -> World:
    """``init_process_group`` on ``store`` with the backend of the ranks' devices (:func:`collective_backend`,
    learnt through the store) and gloo bound to the chosen interface; every rank's choice ends up in
    ``world.network["ranks"]``. A rank's ``problem`` (its device is missing) stops every rank, with that one
    line, before the group is made."""
    network = world.network or {}
    devices = exchange(store, world.rank, world.size, "device", f"!{problem}" if problem else device_key(world.device))
    missing = [(rank, key[1:]) for rank, key in enumerate(devices) if key.startswith("!")]
    if missing:  # rank 0 serves the store: it leaves last, once every rank has read what it needs
        store.set(f"fedrun/device-read/{world.rank}", "1")
        if world.is_root:
            store.wait([f"fedrun/device-read/{rank}" for rank in range(world.size)])
        raise LaunchError(f"rank {missing[0][0]}: {missing[0][1]}")
    world.backend, network["collectives"] = collective_backend(devices)
    user_gloo = os.environ.get("GLOO_SOCKET_IFNAME")
    if world.backend == "gloo" and user_gloo and network.get("hosts") == 1:
        # one host: the store stays on loopback, but a GLOO_SOCKET_IFNAME the user set is gloo's
        network.update(gloo_ifname=user_gloo.split(",")[0], how="single host: loopback store, gloo on "
                       "GLOO_SOCKET_IFNAME")
    set_gloo = world.backend == "gloo" and bool(network.get("ifname")) and not user_gloo
    if set_gloo:
        os.environ["GLOO_SOCKET_IFNAME"] = network["ifname"]  # read when the gloo process group is made
    try:
        if world.device.type == "cuda":
            torch.cuda.set_device(world.device)
        dist.init_process_group(backend=world.backend, store=store, rank=world.rank, world_size=world.size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    finally:
        if set_gloo:
            del os.environ["GLOO_SOCKET_IFNAME"]
    mine = {k: network.get(k) for k in ("host", "bind_address", "ifname", "how")} | {"device": str(world.device)}
    network["ranks"] = world.allgather_object(mine)
    world.peers = exchange_peers(store, world.rank, world.size)
    return world


def _init_torchrun(env: dict[str, Any], device: str, timeout_s: float) -> World:
    """A torchrun worker: rank, size and local rank from the environment; the store is torchrun's agent
    store at MASTER_ADDR:MASTER_PORT (all ranks are clients), or, without an agent store (plain
    RANK/WORLD_SIZE launches), a store that rank 0 serves there."""
    rank, size, local_rank = env["rank"], env["size"], env["local_rank"]
    dev, problem = _device_or_problem(local_rank, device, size)
    if size == 1:
        return World(rank=0, size=1, local_rank=0, device=dev, backend="none", launcher="torchrun")
    timeout = datetime.timedelta(seconds=timeout_s)
    host, port = env["master_addr"], env["master_port"]
    single_host = env["local_size"] == size or is_loopback_name(host)
    if single_host:
        bind, ifname, how = loopback(), ifname_of(loopback()), "single host: loopback"
    else:
        bind, ifname, how = choose_interface(host)
    network = {"hosts": 1 if single_host else None, "host": socket.gethostname(), "bind_address": bind,
               "ifname": ifname, "how": how, "store": f"{host}:{port}",
               "store_owner": "torchrun agent" if env["agent_store"] else "rank 0"}
    if env["agent_store"]:  # torchrun's agent serves the store; a fresh one per restart (as torch does)
        tcp = store = dist.TCPStore(host, port, size, False, timeout=timeout)
    elif rank == 0:
        tcp = store = master_store(listen_address(host, bind, single_host), port, size, timeout)
    else:
        tcp = store = dist.TCPStore(host, port, size, False, timeout=timeout)
    world = World(rank=rank, size=size, local_rank=local_rank, device=dev, backend="gloo", store=tcp,
                  launcher="torchrun", network=network)
    return _init_group(world, store, timeout_s, problem)
