"""The numbered round loop of a run: build once, resume, then rounds, checkpoints and stop signals.

    setup, state = build(cfg, world, run_dir)          # fedrun.federation.build
    restore(setup, state, checkpoint)                   # on --resume (fedrun.federation.snapshot)
    for t in range(state.next_round, cfg.run.rounds):
        entry = run_round(setup, state, t)              # fedrun.federation.rounds: where a round happens
        ... metrics, progress, checkpoint every checkpoint.every rounds, at the end and on a signal

A run is exactly its :class:`~fedrun.federation.build.RunState` plus its config; a checkpoint saves that.
"""

from __future__ import annotations

import json
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrun.checkpoint import list_checkpoints
from fedrun.checkpoint.files import remove_stale_temporaries
from fedrun.config import Config
from fedrun.errors import CheckpointError, ConfigError, RunInterrupted, argument, on_every_rank, writing
from fedrun.federation import resume as resume_policy
from fedrun.federation import snapshot
from fedrun.federation.build import RunState, Setup, build
from fedrun.federation.exchange import STOP_SIGNAL
from fedrun.federation.rounds import CLIENT_ARRAYS, run_round
from fedrun.metrics.log import MetricsLog, Progress
from fedrun.metrics.mlflow import MlflowLog
from fedrun.metrics.per_client import ClientMetricsFile
from fedrun.metrics.tensorboard import TensorBoardLog
from fedrun.runtime.provenance import provenance
from fedrun.runtime.signals import StopSignals, shown
from fedrun.runtime.world import World
from fedrun.training.flat_model import module_at

RoundCallback = Callable[[dict[str, Any]], Any]  # a round's record -> true to stop the run


@dataclass
class RunResult:
    """What :func:`train` (and ``fedrun.run``) returns on every rank."""

    x: np.ndarray  # final global model, flat, in the model's parameter order
    metrics: list[dict[str, Any]] = field(default_factory=list)  # per-round records (rank 0)
    config: Config | None = None
    rank: int = 0
    rounds_run: int = 0  # rounds this call ran (0: the run had finished before; nothing was written)
    stopped: bool = False  # the per-round callback stopped the run before run.rounds (it is resumable)
    module: torch.nn.Module | None = field(default=None, repr=False)  # the model's module (layout of x)

    def model(self) -> torch.nn.Module:
        """The trained model as a ``torch.nn.Module`` in eval mode: a copy of the run's module with parameters
        ``x`` (buffers, such as batch-norm running statistics, are this rank's)."""
        if self.module is None:
            raise ValueError("this RunResult holds no model module")
        return module_at(self.module, torch.as_tensor(self.x)).eval()


def train(cfg: Config, world: World, run_dir: Path | None, progress: bool = True,
          resume: str | None = None, signals: StopSignals | None = None,
          accept_changes: tuple[str, ...] = (), callback: RoundCallback | None = None) -> RunResult:
    """Run rounds ``start .. cfg.run.rounds - 1`` and return the final model and metrics.

    With a run directory, a checkpoint is written every ``checkpoint.every`` rounds, at the end, and
    when a stop signal arrives (then :class:`RunInterrupted` is raised after the checkpoint).
    ``resume``: ``"auto"`` (newest valid checkpoint of the run directory, if any) or a file path.
    ``signals``: stop-signal handlers installed by the caller (else installed for the rounds only).
    A resumed run may change only the settings :mod:`fedrun.federation.resume` accepts, and those in
    ``accept_changes``. ``callback(record)`` is called on rank 0 after every round with the round's
    metrics record; a true return value stops the run there (after a checkpoint, when there is a run
    directory; the result then has ``stopped``). A resumed run that has done ``cfg.run.rounds`` already
    says so and returns its final model, writing nothing.
    """
    torch.set_num_threads(cfg.run.threads)
    # nothing in the run directory changes before the inputs are checked: a run that is refused, or that
    # fails to load its data or checkpoint, leaves an earlier run's files as they were
    path, changes = start_point(cfg, world, run_dir, resume, accept_changes)
    if world.is_root and progress and resume == "auto" and path is None:
        print(f"fedrun: no checkpoint in {run_dir}; starting a fresh run", flush=True)
    setup, state = build(cfg, world, run_dir)
    metrics = MetricsLog(run_dir if world.is_root else None)
    resume_s, resumed = None, None
    if path is not None:
        started = time.perf_counter()
        snapshot.restore(setup, state, path)
        resumed = state.next_round
        resume_s = time.perf_counter() - started
        if state.next_round == cfg.run.rounds:  # a finished run: say so, write nothing
            if world.is_root:
                print(f"fedrun: {run_dir or path} finished all {cfg.run.rounds} rounds already{_final(state.metrics)}; "
                      "nothing to run (raise run.rounds to continue it, or choose another run.dir)", flush=True)
            return _result(setup, state, cfg, rounds_run=0)
        if world.is_root and progress:
            print(f"fedrun: resumed from {path} after round {state.next_round}", flush=True)
    # an unreachable tracking URI is bad input: refused before anything is written, on every rank
    tracker = decided_by_root(world, lambda: MlflowLog(run_dir if cfg.metrics.mlflow else None, cfg.metrics,
                                                       cfg.run.name, resume_policy.flatten(cfg.to_dict())))
    if run_dir is not None and world.is_root:
        if path is not None:
            metrics.sync(state.metrics)
            with writing(run_dir / resume_policy.HISTORY):
                resume_policy.record(run_dir, changes, str(path), state.next_round)
            if changes:
                print(f"fedrun: resuming {path.name} with changed settings: {'; '.join(map(str, changes))} "
                      f"(recorded in {resume_policy.HISTORY})", flush=True)
        with writing(run_dir / "config.yaml"):
            (run_dir / "config.yaml").write_text(cfg.to_yaml())
    runtime = RuntimeLog(setup, state, run_dir, resume_s)
    root_dir = run_dir if world.is_root else None
    clients = ClientMetricsFile(root_dir, setup.client_eval.ids, setup.client_eval.counts,
                                resumed) if setup.client_eval else None
    board = TensorBoardLog(root_dir if cfg.metrics.tensorboard else None, state.next_round + 1)
    if signals is not None:
        signals.starting = False  # from here on a stop signal finishes a round and writes a checkpoint
    if tracker is not None:
        tracker.log_provenance(runtime.data["provenance"], resume_policy.flatten(runtime.data["provenance"]))
    if world.is_root and progress:
        timings = ", ".join(f"{k} {v:.4f} s" for k, v in setup.strategy_timings.items())
        print(f"fedrun: local strategy {state.strategy}" + (f" (timed: {timings})" if timings else ""), flush=True)
        print(f"fedrun: client state {setup.store_choice}", flush=True)
        if setup.privacy is not None:
            print(f"fedrun: {setup.privacy.describe()}", flush=True)
    bar = Progress(cfg.run.rounds, cfg.run.log_every) if (progress and world.is_root) else None
    every = cfg.checkpoint.every
    halted, first = False, state.next_round
    saved = first  # the rounds done at the newest checkpoint (a resumed run starts at one)
    with signals or StopSignals() as signals:
        try:
            for t in range(state.next_round, cfg.run.rounds):
                over = setup.privacy.over_budget(t) if setup.privacy is not None else None
                if over is not None:  # the same decision on every rank (the accountant's state is replicated)
                    if run_dir is not None and saved != t:
                        path = snapshot.save(setup, state)
                        runtime.checkpoint_written(t, path, 0.0)
                    if world.is_root:
                        shown(signals, print, f"fedrun: {over}", flush=True)
                    break
                entry = run_round(setup, state, t, stop_requested=lambda: signals.requested)
                arrays = entry.pop(CLIENT_ARRAYS, None)
                if world.is_root:
                    state.metrics.append(entry)
                    metrics.sync(state.metrics)
                    if clients is not None and arrays:
                        clients.append(entry["round"], arrays)
                    board.write(entry, arrays)
                    if tracker is not None:
                        tracker.write(entry, arrays)
                    if bar is not None:
                        shown(signals, bar.update, entry)
                if callback is not None:  # rank 0 asks it, every rank learns the answer
                    halted = world.broadcast_object(bool(callback(dict(entry))) if world.is_root else None)
                stop = setup.exchange.stop_code() == STOP_SIGNAL
                last = t + 1 == cfg.run.rounds
                if run_dir is not None and (stop or halted or last or (every > 0 and (t + 1) % every == 0)):
                    started = time.perf_counter()
                    with SlowWriteNotice(t + 1, world.is_root and progress, signals):
                        path = snapshot.save(setup, state)
                    saved = t + 1
                    runtime.checkpoint_written(t + 1, path, time.perf_counter() - started)
                    if stop:
                        raise RunInterrupted(f"stopped by {_stopped_by(signals.signal_name, t + 1)}; checkpoint "
                                             f"{path}; resume with {argument('resume', 'auto')}")
                if halted:
                    if world.is_root:
                        kept = f"checkpoint {path}; resume with {argument('resume', 'auto')}" if run_dir else \
                            "no run directory, nothing written"
                        shown(signals, print, f"fedrun: the callback stopped the run after round {t + 1} ({kept})",
                              flush=True)
                    break
        except KeyboardInterrupt:  # Ctrl-C twice: no new checkpoint, and no half-written one left behind
            if run_dir is not None and world.is_root:
                remove_stale_temporaries(run_dir)
            raise
        finally:
            if tracker is not None:
                tracker.close(finished=state.next_round == cfg.run.rounds)
    board.close()
    runtime.finish()
    return _result(setup, state, cfg, rounds_run=state.next_round - first,
                   stopped=state.next_round < cfg.run.rounds)  # by the callback


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


def _result(setup: Setup, state: RunState, cfg: Config, rounds_run: int, stopped: bool = False) -> RunResult:
    x = setup.exchange.global_model().detach().cpu().numpy().copy()
    return RunResult(x=x, metrics=state.metrics if setup.world.is_root else [], config=cfg, rank=setup.world.rank,
                     rounds_run=rounds_run, stopped=stopped, module=setup.learner.model.module)


def _final(metrics: list[dict[str, Any]]) -> str:
    """`` (test accuracy 91.20%)`` from the newest evaluated record, or nothing."""
    for entry in reversed(metrics):
        if "test_accuracy" in entry:
            return f" (test accuracy {100 * entry['test_accuracy']:.2f}%)"
    return ""


def start_point(cfg: Config, world: World, run_dir: Path | None, resume: str | None,
                accept_changes: tuple[str, ...]) -> tuple[Path | None, list[resume_policy.Change]]:
    """The checkpoint to resume from (None: a fresh run) and the setting changes the resume policy accepts
    (rank 0's list; decided by rank 0, :func:`decided_by_root`).

    A fresh run refuses a run directory that holds checkpoints; a resume refuses ``run.rounds`` below the
    rounds its checkpoint has done, and the changes the policy refuses."""

    def decide() -> tuple[Path | None, list[resume_policy.Change]]:
        if resume is None:
            if run_dir is not None and list_checkpoints(run_dir):
                raise ConfigError(f"run.dir={run_dir}: holds checkpoints of an earlier run; resume it with "
                                  f"{argument('resume', 'auto')} or choose another run.dir")
            return None, []
        found = snapshot.locate(run_dir, resume)
        if found is None:
            return None, []
        done = snapshot.rounds_done(found)
        if cfg.run.rounds < done:
            raise ConfigError(f"run.rounds: expected an integer >= {done} (checkpoint {found.name} has done "
                              f"{done} rounds; a resumed run cannot be shorter), got {cfg.run.rounds}")
        return found, resume_policy.check(snapshot.saved_config(found), cfg.to_dict(), accept_changes, found.name)

    decided = decided_by_root(world, decide)
    found = world.broadcast_object(decided[0] if world.is_root else None)
    return found, decided[1] if world.is_root else []


def decided_by_root(world: World, decide: Callable[[], Any]) -> Any:
    """``decide()`` on rank 0 (None elsewhere). A :class:`ConfigError` or :class:`CheckpointError` it raises is
    raised on every rank after a broadcast, so that a refusal is one line (reported once) and every rank
    leaves together."""
    value, failure = None, None
    if world.is_root:
        try:
            value = decide()
        except (ConfigError, CheckpointError) as exc:
            failure = (type(exc), str(exc))
    failure = world.broadcast_object(failure)
    if failure is not None:
        raise on_every_rank(failure[0](failure[1]))
    return value


class RuntimeLog:
    """``runtime.json`` in the run directory: provenance (versions, git commit, hosts, Slurm ids, command
    line, start time; :func:`fedrun.runtime.provenance.provenance`), ranks, device, placement and blocks,
    the local strategy and its timings, checkpoint write times and sizes, and every rank's peak resident
    memory at the end."""

    def __init__(self, setup: Setup, state: RunState, run_dir: Path | None, resume_s: float | None) -> None:
        self.world, self.clients = setup.world, state.clients
        self.path = None if run_dir is None or not self.world.is_root else run_dir / "runtime.json"
        self.data: dict[str, Any] = {
            "provenance": provenance(self.world),  # collective: the ranks' host names
            "ranks": self.world.size, "device": str(self.world.device), "backend": self.world.backend,
            "launcher": self.world.launcher, "network": self.world.network,
            "placement": setup.placement.mode, "blocks": setup.placement.blocks, "dim": setup.dim,
            "client_state_bytes_per_rank": state.clients.nbytes, "client_store": setup.store_choice,
            "local_strategy": state.strategy, "strategy_timings_s": setup.strategy_timings,
            "start_round": state.next_round, "resume_read_s": resume_s, "checkpoints": [],
        }
        self._write()

    def checkpoint_written(self, next_round: int, path: Path | None, seconds: float) -> None:
        size = path.stat().st_size if path is not None and path.exists() else None
        self.data["checkpoints"].append({"round": next_round, "write_s": round(seconds, 4), "bytes": size})
        self._write()

    def finish(self) -> None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB -> MiB on Linux
        self.data["peak_rss_mib_per_rank"] = self.world.allgather_object(round(peak, 1))
        self.data["client_state_disk_bytes_per_rank"] = self.world.allgather_object(self.clients.disk_bytes)
        self._write()

    def _write(self) -> None:
        if self.path is not None:
            with writing(self.path):
                self.path.write_text(json.dumps(self.data, indent=1) + "\n")
