"""The process world: rank, size, local rank and device, bootstrapped from MPI, Slurm or torchrun.

fedrun is started by ``mpiexec``/``mpirun``, by ``srun`` (with or without an MPI plugin), by ``torchrun``
(or any launcher that sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT, without MPI), or as a plain
single process. Under MPI, mpi4py is the control plane: it carries the rendezvous address and port and
small control messages. The data plane is torch.distributed (NCCL on GPUs, gloo on CPUs), initialised
from a TCPStore that rank 0 binds to a free port chosen by the OS, so two runs on one machine never
collide (under torchrun, from the store of torchrun's agent at MASTER_ADDR:MASTER_PORT).

Where the store and gloo listen (see :func:`choose_interface`, docs/clusters.md): when every rank is on
one host, on loopback only. When the ranks span hosts, on one deliberately chosen interface per rank:
``FEDRUN_IFNAME`` if set, else ``GLOO_SOCKET_IFNAME`` if set, else the interface of the route from this
host to the first host (on the first host, to the next host). The choice is in :attr:`World.network`.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
import socket
import struct
import sys
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from fedrun.errors import RunFailure, brief, one_line, report


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
        raise LaunchError(f"environment variable {name}={brief(value)}: expected an integer") from None


# set for every rank by the MPI process managers fedrun meets: Slurm's pmi2 and pmix plugins, MPICH's
# hydra (PMI_RANK), Open MPI's mpirun (OMPI_COMM_WORLD_SIZE)
_MPI_LAUNCH_VARIABLES = ("PMI_RANK", "PMI_FD", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE")


def _mpi_launched() -> bool:
    """Whether an MPI process manager started this process (then its ranks are MPI's)."""
    return any(os.environ.get(name) for name in _MPI_LAUNCH_VARIABLES)


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


def torchrun_env() -> dict[str, Any] | None:
    """RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT of torchrun (or another launcher that
    sets them, e.g. ``torch.distributed.launch`` or a hand-written script), or None when they are absent.

    RANK and WORLD_SIZE together mark such a launch; then MASTER_ADDR and MASTER_PORT are required.
    """
    if os.environ.get("RANK") is None or os.environ.get("WORLD_SIZE") is None:
        return None
    rank, size = _int_env("RANK"), _int_env("WORLD_SIZE")
    assert rank is not None and size is not None
    if size < 1 or not 0 <= rank < size:
        raise LaunchError(f"environment variables RANK={rank} WORLD_SIZE={size}: expected 0 <= RANK < WORLD_SIZE")
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            raise LaunchError(f"RANK and WORLD_SIZE are set (a torchrun-style launch) but {name} is not")
    local_rank = _int_env("LOCAL_RANK") or 0
    local_size = _int_env("LOCAL_WORLD_SIZE")
    return {"rank": rank, "size": size, "local_rank": local_rank, "local_size": local_size,
            "master_addr": os.environ["MASTER_ADDR"], "master_port": _int_env("MASTER_PORT"),
            "agent_store": os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            "elastic": "TORCHELASTIC_RUN_ID" in os.environ}


def init_world(device: str = "auto", timeout_s: float = 120.0) -> World:
    """Discover rank/size from the launcher and initialise torch.distributed when size > 1."""
    torchrun = torchrun_env()
    if torchrun is not None:  # before MPI: torchrun's workers are not MPI ranks (mpi4py is not imported)
        with _rendezvous_guard(torchrun["rank"], timeout_s, None):
            return _init_torchrun(torchrun, device, timeout_s)
    slurm_ntasks = _int_env("SLURM_NTASKS") if "SLURM_STEP_ID" in os.environ else None
    # srun without an MPI plugin (launch/srun.sh's default): Slurm gives the ranks, and mpi4py is not
    # imported, so no MPI library starts (an MPI singleton per task would only cost start-up time)
    without_mpi = slurm_ntasks is not None and slurm_ntasks > 1 and not _mpi_launched()
    comm = None if without_mpi else _mpi_comm()
    if comm is not None and comm.Get_size() > 1:
        launcher = "mpi"
        rank, size = comm.Get_rank(), comm.Get_size()
        local_comm = comm.Split_type(_split_type_shared(), key=rank)
        local_rank = local_comm.Get_rank()
        local_comm.Free()
    elif slurm_ntasks is not None and slurm_ntasks > 1:
        # srun without an MPI plugin (or an MPI that sees a singleton): take the ranks from Slurm.
        launcher = "slurm"
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
    with _rendezvous_guard(rank, timeout_s, comm):
        store, network = _rendezvous(comm, rank, size, timeout_s)
        return _init_group(World(rank=rank, size=size, local_rank=local_rank, device=dev, backend=backend,
                                 comm=comm, store=store, launcher=launcher, network=network), store, timeout_s)


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


def _init_group(world: World, store: Any, timeout_s: float) -> World:
    """``init_process_group`` on ``store`` with gloo bound to the chosen interface; every rank's choice
    ends up in ``world.network["ranks"]``."""
    network = world.network or {}
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
    mine = {k: network.get(k) for k in ("host", "bind_address", "ifname", "how")}
    network["ranks"] = world.allgather_object(mine)
    world.peers = exchange_peers(store, world.rank, world.size)
    return world


def _init_torchrun(env: dict[str, Any], device: str, timeout_s: float) -> World:
    """A torchrun worker: rank, size and local rank from the environment; the store is torchrun's agent
    store at MASTER_ADDR:MASTER_PORT (all ranks are clients), or, without an agent store (plain
    RANK/WORLD_SIZE launches), a store that rank 0 serves there."""
    rank, size, local_rank = env["rank"], env["size"], env["local_rank"]
    dev = _pick_device(local_rank, device)
    if size == 1:
        return World(rank=0, size=1, local_rank=0, device=dev, backend="none", launcher="torchrun")
    backend = "nccl" if dev.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    host, port = env["master_addr"], env["master_port"]
    single_host = env["local_size"] == size or _is_loopback_name(host)
    if single_host:
        bind, ifname, how = _loopback(), _ifname_of(_loopback()), "single host: loopback"
    else:
        bind, ifname, how = choose_interface(host)
    network = {"hosts": 1 if single_host else None, "host": socket.gethostname(), "bind_address": bind,
               "ifname": ifname, "how": how, "store": f"{host}:{port}",
               "store_owner": "torchrun agent" if env["agent_store"] else "rank 0"}
    if env["agent_store"]:  # torchrun's agent serves the store; a fresh one per restart (as torch does)
        tcp = store = dist.TCPStore(host, port, size, False, timeout=timeout)
    elif rank == 0:
        tcp = store = _master_store(_listen_address(host, bind, single_host), port, size, timeout)
    else:
        tcp = store = dist.TCPStore(host, port, size, False, timeout=timeout)
    world = World(rank=rank, size=size, local_rank=local_rank, device=dev, backend=backend, store=tcp,
                  launcher="torchrun", network=network)
    return _init_group(world, store, timeout_s)


def _split_type_shared() -> int:
    from mpi4py import MPI

    return MPI.COMM_TYPE_SHARED


def _rendezvous(comm: Any, rank: int, size: int, timeout_s: float) -> tuple[dist.TCPStore, dict[str, Any]]:
    """A TCPStore on rank 0 and the network this rank uses.

    Under MPI the hosts are known (allgather of host names): on one host the store listens on 127.0.0.1
    and gloo on loopback; across hosts every rank picks its interface (:func:`choose_interface`) and
    rank 0's store listens on rank 0's chosen address only, which, with the OS-chosen port, reaches the
    other ranks over MPI. Without MPI (srun, no plugin) the port is derived from the Slurm job and step
    ids and the address is the first node of the allocation (or MASTER_ADDR/MASTER_PORT when the user
    sets them).
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    me = socket.gethostname()
    if comm is not None:
        hosts = comm.allgather(me)
        distinct = list(dict.fromkeys(hosts))
        if len(distinct) == 1:
            bind, ifname, how = _loopback(), _ifname_of(_loopback()), "single host: loopback"
        else:
            first = os.environ.get("MASTER_ADDR") or distinct[0]
            bind, ifname, how = choose_interface(first, fallback=distinct[1] if len(distinct) > 1 else None)
        network = {"hosts": len(distinct), "host": me, "bind_address": bind, "ifname": ifname, "how": how}
        if rank == 0:
            store = _master_store(bind, 0, size, timeout)
            comm.bcast((bind, store.port), root=0)
        else:
            host, port = comm.bcast(None, root=0)
            store = dist.TCPStore(host, port, size, False, timeout=timeout)
        network["store"] = f"{bind if rank == 0 else host}:{store.port}"
        return store, network
    host = os.environ.get("MASTER_ADDR") or _first_slurm_host()
    port = _int_env("MASTER_PORT") or _slurm_port()
    single_host = host in ("127.0.0.1", "localhost")
    if single_host:
        bind, ifname, how = _loopback(), _ifname_of(_loopback()), "single host: loopback"
    else:
        bind, ifname, how = choose_interface(host)
    network = {"hosts": 1 if single_host else None, "host": me, "bind_address": bind, "ifname": ifname,
               "how": how, "store": f"{host}:{port}"}
    if rank == 0:
        return _master_store(_listen_address(host, bind, single_host), port, size, timeout), network
    return dist.TCPStore(host, port, size, False, timeout=timeout), network


def _listen_address(host: str, bind: str, single_host: bool) -> str:
    """Where rank 0's store listens when the others find it by the name ``host`` (not over MPI): its chosen
    address when ``host`` resolves to it (or loopback on one host), else every interface, since the name
    is all the other ranks have."""
    return bind if single_host or _resolves_to(host, bind) else "0.0.0.0"


def _master_store(address: str, port: int, size: int, timeout: datetime.timedelta) -> dist.TCPStore:
    """Rank 0's TCPStore server, accepting connections on ``address`` only ("0.0.0.0": every interface).

    TCPStore itself listens on every interface whatever host name it is given, so fedrun binds the
    listening socket itself and hands it over (``master_listen_fd``).
    """
    if address == "0.0.0.0":
        return dist.TCPStore("0.0.0.0", port, size, True, timeout=timeout, wait_for_workers=False)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(128)
        port = sock.getsockname()[1]
    except OSError as exc:
        sock.close()
        raise LaunchError(f"rendezvous: cannot listen on {address}:{port} ({exc})") from None
    fd = sock.detach()  # the store owns the listening socket from now on
    return dist.TCPStore(address, port, size, True, timeout=timeout, wait_for_workers=False,
                         master_listen_fd=fd, use_libuv=True)


# ------------------------------------------------------------------------------ choosing the interface


def choose_interface(first_host: str, fallback: str | None = None) -> tuple[str, str | None, str]:
    """``(address, interface, how)`` this rank binds to in a multi-host job.

    1. ``FEDRUN_IFNAME`` (fedrun's own setting), else 2. ``GLOO_SOCKET_IFNAME`` (its first name): that
    interface's IPv4 address. 3. Otherwise the interface of the route from here to ``first_host`` (the
    host of rank 0, or MASTER_ADDR): the address the kernel would use as the source of a packet to it.
    On the first host itself that route is loopback (or ``first_host`` resolves to 127.0.1.1, Debian's
    habit), so the route to ``fallback`` (the next host) is taken instead.
    """
    for var in ("FEDRUN_IFNAME", "GLOO_SOCKET_IFNAME"):
        value = os.environ.get(var, "").split(",")[0].strip()
        if value:
            address = _ipv4_of(value)
            if address is None:
                raise LaunchError(f"{var}={value}: no such network interface with an IPv4 address on "
                                  f"{socket.gethostname()} (have: {', '.join(_interfaces()) or 'none'})")
            return address, value, var
    tried = []
    for target in (first_host, fallback):
        if not target:
            continue
        address = _route_source(target)
        tried.append(f"{target} -> {address}")
        if address is not None and not ipaddress.ip_address(address).is_loopback:
            return address, _ifname_of(address), f"route to {target}"
    raise LaunchError(f"multi-host rendezvous: no non-loopback route from {socket.gethostname()} "
                      f"({'; '.join(tried) or 'no peer host'}); set FEDRUN_IFNAME to the interface the "
                      "ranks share")


def _route_source(host: str) -> str | None:
    """The local IPv4 address the kernel picks to reach ``host`` (no packet is sent), or None."""
    try:
        target = socket.gethostbyname(host)
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((target, 9))
        except OSError:
            return None
        return probe.getsockname()[0]


def _resolves_to(host: str, address: str) -> bool:
    try:
        return address in socket.gethostbyname_ex(host)[2]
    except OSError:
        return False


def _interfaces() -> list[str]:
    try:
        return [name for _, name in socket.if_nameindex()]
    except OSError:
        return []


def _ipv4_of(ifname: str) -> str | None:
    """The (primary) IPv4 address of interface ``ifname``, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))  # SIOCGIFADDR
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _ifname_of(address: str) -> str | None:
    """The interface that holds ``address``, or None."""
    for name in _interfaces():
        if _ipv4_of(name) == address:
            return name
    return None


def _is_loopback_name(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def _loopback() -> str:
    return "127.0.0.1"


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


# A failure is reported once: the first failing rank to claim the report in the rendezvous store writes its
# line; a survivor that only lost contact (its peer's failure, or the job being torn down) and comes second
# stays silent. The claim needs rank 0's store; without it (rank 0 is gone) the lowest rank not known to be
# gone reports.
_REPORT_KEY, _REPORTED_KEY = "fedrun/failure/claims", "fedrun/failure/reported"
_CLAIM_TIMEOUT = datetime.timedelta(seconds=5)  # a stopped rank 0 freezes its store: do not wait on it


def claim_failure_report(world: World, lost: list[str]) -> bool:
    """Whether this rank writes the job's failure line (``lost``: the peers found gone, from
    :func:`lost_ranks`). Only the first claimant does; the others wait briefly for its line to be written,
    so that their own exit (which may end the whole job) does not cut it off."""
    try:
        world.store.set_timeout(_CLAIM_TIMEOUT)
        if world.store.add(_REPORT_KEY, 1) == 1:
            return True
        world.store.wait([_REPORTED_KEY], _CLAIM_TIMEOUT)
        return False
    except Exception:  # noqa: BLE001 - the store went with rank 0 (or never answered): decide locally
        gone = {int(line.split()[1]) for line in lost}
        return world.rank == min(r for r in range(world.size) if r not in gone)


def failure_reported(world: World) -> None:
    """Tell the ranks waiting in :func:`claim_failure_report` that the line is written."""
    try:
        world.store.set(_REPORTED_KEY, "1")
    except Exception:  # noqa: BLE001 - nobody left to tell
        pass
