"""Every rank writes what fedrun's World chose (launcher, hosts, bind address and interface, store) and,
on rank 0, the local addresses the rendezvous store listens on (from /proc/net/tcp{,6}).

usage: srun -N 2 -n 2 [--mpi=pmi2] python tests/cluster/probe_world.py OUT_DIR   (or mpiexec, torchrun)
writes OUT_DIR/rank<R>.json
"""

import json
import socket
import sys
from pathlib import Path

from fedrun.runtime.world import init_world


def listening_addresses(port: int) -> list[str]:
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                if len(address) == 8:
                    found.append(".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0)))
                else:
                    found.append("::" if int(address, 16) == 0 else address)
    return found


def main() -> None:
    world = init_world("cpu", 60)
    out = {"rank": world.rank, "size": world.size, "hostname": socket.gethostname(), "launcher": world.launcher,
           "bind_address": world.bind_address, "ifname": world.ifname, "network": world.network,
           "mpi4py_imported": "mpi4py.MPI" in sys.modules}
    if world.rank == 0 and world.store is not None and hasattr(world.store, "port"):
        out["store_port"] = world.store.port
        out["listening"] = listening_addresses(world.store.port)
    Path(sys.argv[1], f"rank{world.rank}.json").write_text(json.dumps(out, indent=1))
    world.close()


if __name__ == "__main__":
    main()
