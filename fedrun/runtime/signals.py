"""SIGTERM / SIGUSR1 (what Slurm sends before a time limit or on preemption), SIGHUP (a closed terminal,
``timeout -s HUP``) and SIGINT (Ctrl-C) as a stop request; so is a closed stdout (``fedrun train ... | head``).

The handler only sets a flag. The round loop carries every rank's flag to rank 0 inside the round's
reduce and the decision back inside the broadcast, so all ranks finish the same round, write one
checkpoint together and exit with status 75 (fedrun.errors.EXIT_REQUEUE), whichever of the signals
arrived. A second SIGINT means "stop now": it raises :class:`KeyboardInterrupt` where the rank is
(no new checkpoint; the caller removes a half-written one; exit status 130). It must come at least
:data:`SECOND_CTRL_C_S` after the first: one Ctrl-C at a terminal reaches a rank twice under mpiexec (from
the terminal, to the whole process group, and forwarded by mpiexec).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from fedrun.errors import StartupInterrupted

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
SECOND_CTRL_C_S = 0.5  # a SIGINT this soon after the first is the same Ctrl-C delivered twice


class StopSignals:
    """Context manager: ``requested`` becomes True once a stop signal arrives; a second SIGINT raises
    :class:`KeyboardInterrupt`. With ``announce`` (rank 0 of a command line run) the first SIGINT is
    acknowledged at once on stdout, so that a user at the terminal knows the round is being finished."""

    def __init__(self, announce: bool = False, starting: bool = False) -> None:
        self.announce = announce
        self.starting = starting  # before round 1: a stop signal raises StartupInterrupted at once
        self.requested = False
        self.signal_name = ""
        self._first_sigint: float | None = None  # time.monotonic() of the first SIGINT
        self._previous: dict[int, object] = {}
        self._depth = 0  # re-entrant: the CLI installs the handlers early, the round loop enters again

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.starting:
            self.starting = False  # raised once; a repeated signal finds the flag set
            self.requested, self.signal_name = True, signal.Signals(signum).name
            raise StartupInterrupted(f"stopped by {self.signal_name} during start-up, before round 1; nothing was "
                                     "written (run it again to start)")
        if signum == signal.SIGINT:
            now = time.monotonic()
            if self._first_sigint is not None:
                if now - self._first_sigint >= SECOND_CTRL_C_S:
                    raise KeyboardInterrupt  # Ctrl-C twice: stop at once
                return  # the first Ctrl-C, delivered again
            self._first_sigint = now
            if self.announce:
                try:  # a raw write: the handler may interrupt a print of the progress line
                    os.write(sys.stdout.fileno(), b"fedrun: Ctrl-C: finishing this round, then a checkpoint "
                                                  b"(Ctrl-C again stops at once)\n")
                except (OSError, ValueError):
                    pass
        self.requested = True
        self.signal_name = signal.Signals(signum).name

    def request(self, reason: str) -> None:
        """A stop request that is not a signal (``reason``, e.g. "a closed stdout"): stop after the round."""
        if not self.requested:
            self.requested, self.signal_name = True, reason

    def reinstall(self) -> None:
        """Install the handlers again (after MPI's initialisation, which may have taken SIGHUP for itself)."""
        if self._depth and threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._handle)

    def __enter__(self) -> StopSignals:
        self._depth += 1
        if self._depth == 1 and threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            self._previous.clear()


def shown(signals: StopSignals, show: Callable[..., object], *args: object, **kwargs: object) -> None:
    """Run ``show(*args, **kwargs)`` (a print to stdout); if stdout is closed (its reader went away:
    ``fedrun train ... | head -4``), point it at /dev/null and make that a stop request, so the run finishes
    the round, writes a checkpoint and exits 75 instead of ending on the next print with its rounds lost."""
    try:
        show(*args, **kwargs)
    except (BrokenPipeError, ValueError):  # ValueError: a closed sys.stdout
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        signals.request("a closed stdout")
