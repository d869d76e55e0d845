"""SIGTERM / SIGUSR1 (what Slurm sends before a time limit or on preemption) as a stop request.

The handler only sets a flag. The round loop carries every rank's flag to rank 0 inside the round's
reduce and the decision back inside the broadcast, so all ranks finish the same round, write one
checkpoint together and exit with status 75 (fedrun.errors.EXIT_REQUEUE).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopSignals:
    """Context manager: ``requested`` becomes True once a stop signal arrives."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""
        self._previous: dict[int, object] = {}
        self._depth = 0  # re-entrant: the CLI installs the handlers early, the round loop enters again

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        self.signal_name = signal.Signals(signum).name

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
