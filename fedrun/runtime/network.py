"""Which network interface a rank binds to in a multi-host job (docs/clusters.md).

``FEDRUN_IFNAME`` if set, else ``GLOO_SOCKET_IFNAME`` if set, else the interface of the route from this
host to the first host (on the first host, to the next host); on a single host, loopback.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct

from fedrun.errors import LaunchError


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
            return address, ifname_of(address), f"route to {target}"
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


def resolves_to(host: str, address: str) -> bool:
    """Whether the name ``host`` resolves to the local ``address`` (among all its addresses)."""
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


def ifname_of(address: str) -> str | None:
    """The interface that holds ``address``, or None."""
    for name in _interfaces():
        if _ipv4_of(name) == address:
            return name
    return None


def is_loopback_name(host: str) -> bool:
    """Whether ``host`` resolves to a loopback address (every rank then shares one host)."""
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def loopback() -> str:
    """The address single-host jobs bind to."""
    return "127.0.0.1"
