"""When a run writes its checkpoint, the step of the round loop that follows a round's observers.

A checkpoint is written (on every rank together: :func:`fedrun.federation.snapshot.save` is collective)

* after round r when ``checkpoint.every`` > 0 and r % every = 0, and after the last round;
* after the round in which ``checkpoint.every_s`` > 0 seconds have passed on rank 0's clock since the
  newest checkpoint (or since the rounds began): rank 0 asks its clock when it publishes the round's
  downlink and the answer travels in that broadcast, so every rank decides alike. The default, 600 s,
  bounds what a launcher that kills the ranks outright (docs/reliability.md) can lose; a run shorter
  than that writes no extra checkpoint;
* after the round in which a stop signal arrived, which then ends the run with :class:`RunInterrupted`
  (exit status 75: resume it);
* after the round an observer stopped the run in (the user's callback), and before a round the privacy
  budget refuses, unless the newest checkpoint is of that round already.

Every write is recorded in runtime.json. Ctrl-C twice (KeyboardInterrupt) writes nothing more and leaves no
half-written checkpoint behind. Without a run directory nothing is written and a stop signal is not acted
on here.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedrun.checkpoint.files import remove_stale_temporaries
from fedrun.errors import RunInterrupted, argument
from fedrun.federation import snapshot
from fedrun.federation.build import RunState, Setup
from fedrun.federation.exchange import STOP_SIGNAL
from fedrun.federation.runtime_log import RuntimeLog
from fedrun.runtime.signals import StopSignals, shown


@dataclass
class SaveClock:
    """``checkpoint.every_s``: due when that many seconds have passed since ``since`` (the newest checkpoint,
    or the start of the rounds) on this process's monotonic clock."""

    every_s: float
    since: float = field(default_factory=time.monotonic)

    def due(self) -> bool:
        return time.monotonic() - self.since >= self.every_s


class Checkpoints:
    """The checkpoint cadence of one run (see the module docstring); a context manager around the rounds, for
    the cleanup after Ctrl-C twice. ``announce``: this is rank 0 with progress lines (a slow write says so)."""

    def __init__(self, setup: Setup, state: RunState, runtime: RuntimeLog, signals: StopSignals,
                 announce: bool) -> None:
        self.setup, self.state, self.runtime, self.signals, self.announce = setup, state, runtime, signals, announce
        self.run_dir, self.every, self.rounds = setup.run_dir, setup.cfg.checkpoint.every, setup.cfg.run.rounds
        self.saved = state.next_round  # the rounds done at the newest checkpoint (a resumed run starts at one)
        self.path: Path | None = None  # the newest checkpoint this process wrote (rank 0)
        self.clock = SaveClock(setup.cfg.checkpoint.every_s)  # rank 0's clock decides
        if self.run_dir is not None and self.clock.every_s > 0 and setup.world.is_root:
            # the clock's own method: a closure over self would be a reference cycle (setup -> exchange ->
            # closure -> self -> setup) keeping the run's objects, and its open files, alive after the run
            setup.exchange.save_due = self.clock.due

    def after_round(self, done: int, halted: bool) -> None:
        """After round ``done`` (counting from 1) and its observers; ``halted``: they stopped the run."""
        exchange = self.setup.exchange
        stop = exchange.stop_code() == STOP_SIGNAL
        due = stop or halted or done == self.rounds or (self.every > 0 and done % self.every == 0) or \
            exchange.save_requested()
        if self.run_dir is None or not due:
            return
        self.write(done)
        if stop:
            raise RunInterrupted(f"stopped by {_stopped_by(self.signals.signal_name, done)}; checkpoint "
                                 f"{self.path}; resume with {argument('resume', 'auto')}")

    def before_stop(self, done: int) -> None:
        """The run stops after round ``done`` without running another (the privacy budget is spent)."""
        if self.run_dir is not None and self.saved != done:
            self.write(done)

    def write(self, done: int) -> None:
        started = time.perf_counter()
        with SlowWriteNotice(done, self.announce, self.signals):
            self.path = snapshot.save(self.setup, self.state)
        self.saved, self.clock.since = done, time.monotonic()
        self.runtime.checkpoint_written(done, self.path, time.perf_counter() - started)

    def kept(self) -> str:
        """What a stopped run left: ``checkpoint PATH; resume with --resume auto``, or that nothing was written."""
        if self.run_dir is None:
            return "no run directory, nothing written"
        return f"checkpoint {self.path}; resume with {argument('resume', 'auto')}"

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if kind is KeyboardInterrupt and self.run_dir is not None and self.setup.world.is_root:
            remove_stale_temporaries(self.run_dir)  # Ctrl-C twice: no half-written checkpoint left behind


def _stopped_by(name: str, done: int) -> str:
    """``a signal after round 12``, or for a request that is not a signal ``a closed stdout after round 12``;
    ``name``: rank 0's :attr:`StopSignals.signal_name` (empty when another rank had the signal)."""
    return f"{name if name and not name.startswith('SIG') else 'a signal'} after round {done}"


class SlowWriteNotice:
    """Around a checkpoint write on rank 0 with progress lines: if it is not done after ``AFTER_S`` seconds, a
    line says that it is being written, and when it is done, how long it took (a large in-memory state can
    take half a minute; the run should not look hung)."""

    AFTER_S = 3.0

    def __init__(self, next_round: int, enabled: bool, signals: StopSignals) -> None:
        self.next_round, self.enabled, self.signals = next_round, enabled, signals
        self.fired = threading.Event()
        self.timer: threading.Timer | None = None

    def _notice(self) -> None:
        self.fired.set()
        shown(self.signals, print, f"fedrun: writing the checkpoint after round {self.next_round} (started "
                                   f"{self.AFTER_S:g} s ago) ...", flush=True)

    def __enter__(self) -> SlowWriteNotice:
        self.started = time.perf_counter()
        if self.enabled:
            self.timer = threading.Timer(self.AFTER_S, self._notice)
            self.timer.daemon = True
            self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.fired.is_set() and exc[0] is None:
            seconds = time.perf_counter() - self.started
            shown(self.signals, print, f"fedrun: checkpoint after round {self.next_round} written in {seconds:.1f} s",
                  flush=True)
