"""Rank 0 lists the local addresses its rendezvous TCPStore listens on (from /proc/net/tcp{,6}).

usage: mpiexec -n 2 python tests/_rendezvous_probe.py OUT.json
"""

import json
import sys

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
    if world.rank == 0:
        port = world.store.port
        with open(sys.argv[1], "w") as fh:
            json.dump({"port": port, "listening": listening_addresses(port)}, fh)
    world.close()


if __name__ == "__main__":
    main()
