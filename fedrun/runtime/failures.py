"""Naming a lost rank, and reporting a failure once per job (docs/reliability.md).

Every rank published its host and pid at the rendezvous (``World.peers``), so the survivor that notices a
broken collective first can name the rank that died or stopped, without asking the store again (it may
have died with rank 0).
"""

from __future__ import annotations

import datetime
import socket
import time

from fedrun.runtime.world import World


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
