"""Naming a lost rank, and reporting a failure once per job (docs/reliability.md); :class:`FailureGuard`, the
one place a run's ranks decide how to leave after an exception.

Every rank published its host and pid at the rendezvous (``World.peers``), so the survivor that notices a
broken collective first can name the rank that died or stopped, without asking the store again (it may
have died with rank 0).

A launcher may end the job before a survivor notices on its own: MPICH's ``mpiexec.gforker`` sends the
survivors SIGINT and, a second later, SIGQUIT, and reports status 0 for a rank that a signal ended. So a
SIGQUIT (:func:`name_lost_ranks_on_quit`) names a peer found gone and exits 1 instead of dying silently.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType

import torch.distributed as dist

from fedrun.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    StartupInterrupted,
    StorageFailure,
    exit_code,
    one_line,
    raised_on_every_rank,
    report,
    report_error,
)
from fedrun.runtime.world import World


def _process_state(pid: int) -> str | None:
    """How a process of this host fails: 'is gone' (exited, killed, a zombie) or 'is stopped'; None if running."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "is gone"
    return {"Z": "is gone", "X": "is gone", "T": "is stopped", "t": "is stopped"}.get(state)


def _end_stopped(pid: int) -> str:
    """SIGKILL the stopped process ``pid``; how to describe it then."""
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return "is stopped"
    return "is stopped; ended it, so that it holds nothing past the job"


def lost_ranks(world: World) -> list[str]:
    """``rank R on host H died or stopped answering (...)`` for every peer on this host whose process is gone
    or stopped; when none is, a lone peer on another host is the one that stopped answering.

    A stopped peer (SIGSTOP, a debugger) is ended here with SIGKILL: the job is ending because of it, and a
    stopped process is not ended by the SIGTERM or SIGINT a launcher sends (they wait until it continues).
    Left stopped, it would hold the run directory's lock past the job's end (``mpiexec.gforker`` leaves it
    behind, an orphan) or hold the job up (torchrun waits 30 s for it before its own SIGKILL)."""
    if not world.peers:
        return []
    here = socket.gethostname()
    found: list[str] = []
    deadline = time.monotonic() + 1.0  # a killed process may take a moment to leave the running state
    while not found and time.monotonic() < deadline:
        for rank, (host, pid) in enumerate(world.peers):
            if rank != world.rank and host == here and (state := _process_state(pid)) is not None:
                if state == "is stopped":
                    state = _end_stopped(pid)
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
_CLAIMING = [False]  # this rank is on its way to report a failure (or not): a SIGQUIT then lets it finish
_REPORTER_STATUS: list[int | None] = [None]  # the exit status of the rank that reported, when another one did


def claim_failure_report(world: World, lost: list[str]) -> bool:
    """Whether this rank writes the job's failure line (``lost``: the peers found gone, from
    :func:`lost_ranks`). Only the first claimant does; the others wait briefly for its line to be written,
    so that their own exit (which may end the whole job) does not cut it off."""
    _CLAIMING[0] = True
    gone = {int(line.split()[1]) for line in lost}
    if 0 in gone:  # the store went with rank 0: asking it would only wait out the timeout
        return world.rank == min(r for r in range(world.size) if r not in gone)
    try:
        world.store.set_timeout(_CLAIM_TIMEOUT)
        if world.store.add(_REPORT_KEY, 1) == 1:
            return True
        world.store.wait([_REPORTED_KEY], _CLAIM_TIMEOUT)
        _REPORTER_STATUS[0] = int(world.store.get(_REPORTED_KEY))
        return False
    except Exception:  # noqa: BLE001 - the store went with rank 0 (or never answered): decide locally
        return world.rank == min(r for r in range(world.size) if r not in gone)


_FORWARD_S = 0.2  # how long a launcher gets to forward the line before this rank ends the job


def failure_reported(world: World, status: int) -> None:
    """Tell the ranks waiting in :func:`claim_failure_report` that the line is written and with which exit
    ``status`` the job ends (theirs too: a launcher reports whichever abort reaches it first, and a survivor's
    lost contact must not turn a refused data file's 2 into 1), and give the launcher a moment to forward the
    line: Hydra's proxy, ended by the abort that follows, dropped it in 1 of 4 tries."""
    try:
        world.store.set(_REPORTED_KEY, str(status))
    except Exception:  # noqa: BLE001 - nobody left to tell
        pass
    time.sleep(_FORWARD_S)


def name_lost_ranks_on_quit(world: World) -> Callable[[], None]:
    """Install, for a job of several ranks, a SIGQUIT handler that ends this rank with status 1 and (once per
    job) the line ``fedrun[rank r]: error: rank R on host H died or stopped answering ...`` when a peer is
    gone; without a gone peer SIGQUIT keeps its default meaning (Ctrl-\\: quit at once). Returns the undo.

    Why: a launcher that tears the job down after a rank died may signal the survivors before their next
    collective fails; ``mpiexec.gforker`` sends SIGQUIT a second after SIGINT and counts a rank killed by a
    signal as status 0, so a dead rank 0 used to end the job with status 0, no line and no result.json."""
    if world.size < 2 or world.peers is None or threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_quit(signum: int, frame: FrameType | None) -> None:
        if _CLAIMING[0]:  # the failure is being reported where the rank is; it exits non-zero after that
            return
        lost = lost_ranks(world)
        if not lost:
            signal.signal(signal.SIGQUIT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGQUIT)
            return
        if claim_failure_report(world, lost):
            report(f"fedrun[rank {world.rank}]: error: {'; '.join(lost)}; the launcher is ending the job")
            failure_reported(world, EXIT_FAILURE)
        os._exit(EXIT_FAILURE)

    previous = signal.signal(signal.SIGQUIT, on_quit)
    return lambda: signal.signal(signal.SIGQUIT, previous)


class FailureGuard:
    """Context manager around a run on one rank (``fedrun.run``): while it is open a SIGQUIT names a lost peer
    (:func:`name_lost_ranks_on_quit`); an exception leaving it ends the job the way that keeps one line for
    one failure and no rank hanging. Only a guard that ``owns_world`` (made the World, so may end the job)
    acts on an exception; inner context managers (the run directory's lock) have released by then.

    * raised on every rank after the same broadcast (:func:`fedrun.errors.raised_on_every_rank`): rank 0
      reports it, then the ranks leave together (not after: a launcher may kill rank 0 as soon as another
      rank exited non-zero, and the line would be lost);
    * a stop signal before round 1 (:class:`StartupInterrupted`) reaches each rank where it is: rank 0 says
      so, and the job ends at once;
    * anything else on one rank of several: the job ends now, naming the rank, rather than let peers hang.
      A rank failing on its own always says why; of the survivors that only lost contact, the first names
      the rank that is gone and the others stay silent.
    """

    def __init__(self, world: World, owns_world: bool) -> None:
        self.world, self.owns_world = world, owns_world
        self._restore_quit: Callable[[], None] = lambda: None

    def __enter__(self) -> FailureGuard:
        self._restore_quit = name_lost_ranks_on_quit(self.world)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        try:
            if exc is not None and self.owns_world:
                self._leave(exc)
        finally:
            self._restore_quit()

    def _leave(self, exc: BaseException) -> None:
        world = self.world
        if raised_on_every_rank(exc):
            if world.size > 1 and world.is_root:
                report_error(exc)
            world.close()
        elif world.size > 1 and isinstance(exc, StartupInterrupted):
            if world.is_root:
                report_error(exc)
            world.abort(exit_code(exc))
        elif world.size > 1 and not isinstance(exc, (SystemExit, KeyboardInterrupt)):
            message, lost_peer = one_line(exc), _lost_peer(exc)
            lost = lost_ranks(world) if lost_peer else []
            if lost_peer:
                message = (f"{'; '.join(lost)}; lost contact in a collective: {message}"
                           if lost else "lost contact with another rank (it died or failed; its message, if any, "
                           f"is above): {message}")
            # a rank failing on its own claims too (so that the survivors stay silent) and reports anyway,
            # unless its failure is one that other ranks may meet alike at the same point: bad input (a data
            # file, a plugin rule breaking its declaration) or a shared disk that filled up; that is reported
            # by the first claimant only
            claimed = claim_failure_report(world, lost)
            alike = exit_code(exc) == EXIT_BAD_INPUT or isinstance(exc, StorageFailure)
            if claimed or not (lost_peer or alike):
                report(f"fedrun[rank {world.rank}]: error: {message}")
                failure_reported(world, exit_code(exc))
            reporter = None if claimed else _REPORTER_STATUS[0]
            world.abort(exit_code(exc) if reporter is None else reporter)


def _lost_peer(exc: BaseException) -> bool:
    """A collective failed because a peer's connection broke (gloo/NCCL transport errors)."""
    text = str(exc)
    return isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError) and any(
        marker in text for marker in ("gloo/transport", "Connection reset by peer", "Connection closed by peer",
                                      "NCCL error")))
