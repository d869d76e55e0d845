"""The rendezvous: rank 0's TCPStore, where it listens, and what every rank learns through it.

Under MPI, mpi4py carries the store's address and the OS-chosen port; without MPI (srun without a plugin,
torchrun-style launches) the ranks meet at an address and port they all derive from the environment.
Every rank also publishes its host and pid in the store (:func:`exchange_peers`), so that a survivor can
name a rank that died (fedrun.runtime.failures).
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any

import torch.distributed as dist

from fedrun.errors import LaunchError
from fedrun.runtime.launcher import first_slurm_host, int_env, slurm_port
from fedrun.runtime.network import choose_interface, ifname_of, loopback, resolves_to


def rendezvous(comm: Any, rank: int, size: int, timeout_s: float) -> tuple[dist.TCPStore, dict[str, Any]]:
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
            bind, ifname, how = loopback(), ifname_of(loopback()), "single host: loopback"
        else:
            first = os.environ.get("MASTER_ADDR") or distinct[0]
            bind, ifname, how = choose_interface(first, fallback=distinct[1] if len(distinct) > 1 else None)
        network = {"hosts": len(distinct), "host": me, "bind_address": bind, "ifname": ifname, "how": how}
        if rank == 0:
            store = master_store(bind, 0, size, timeout)
            comm.bcast((bind, store.port), root=0)
        else:
            host, port = comm.bcast(None, root=0)
            store = dist.TCPStore(host, port, size, False, timeout=timeout)
        network["store"] = f"{bind if rank == 0 else host}:{store.port}"
        return store, network
    host = os.environ.get("MASTER_ADDR") or first_slurm_host()
    port = int_env("MASTER_PORT") or slurm_port()
    single_host = host in ("127.0.0.1", "localhost")
    if single_host:
        bind, ifname, how = loopback(), ifname_of(loopback()), "single host: loopback"
    else:
        bind, ifname, how = choose_interface(host)
    network = {"hosts": 1 if single_host else None, "host": me, "bind_address": bind, "ifname": ifname,
               "how": how, "store": f"{host}:{port}"}
    if rank == 0:
        return master_store(listen_address(host, bind, single_host), port, size, timeout), network
    return dist.TCPStore(host, port, size, False, timeout=timeout), network


def listen_address(host: str, bind: str, single_host: bool) -> str:
    """Where rank 0's store listens when the others find it by the name ``host`` (not over MPI): its chosen
    address when ``host`` resolves to it (or loopback on one host), else every interface, since the name
    is all the other ranks have."""
    return bind if single_host or resolves_to(host, bind) else "0.0.0.0"


def master_store(address: str, port: int, size: int, timeout: datetime.timedelta) -> dist.TCPStore:
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


def exchange(store: Any, rank: int, size: int, topic: str, value: str) -> list[str]:
    """Every rank's ``value`` under ``topic``, in rank order, through the store (every rank calls it; usable
    before the process group exists)."""
    store.set(f"fedrun/{topic}/{rank}", value)
    return [store.get(f"fedrun/{topic}/{r}").decode() for r in range(size)]


def exchange_peers(store: Any, rank: int, size: int) -> list[tuple[str, int]]:
    """(host, pid) of every rank, in rank order, through the store (every rank calls it)."""
    peers = []
    for entry in exchange(store, rank, size, "peer", f"{socket.gethostname()} {os.getpid()}"):
        host, pid = entry.rsplit(" ", 1)
        peers.append((host, int(pid)))
    return peers
