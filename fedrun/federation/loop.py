"""The numbered round loop of a run: build once, resume, then the rounds, each followed by its observers and
the checkpoint cadence.

    setup, state = build(cfg, world, run_dir)          # fedrun.federation.build
    restore(setup, state, checkpoint)                   # on --resume (fedrun.federation.snapshot)
    for t in range(state.next_round, cfg.run.rounds):
        record = setup.round.run(state, t)              # fedrun.federation.rounds: where a round happens
        halted = observers.on_round_end(record, arrays) # metrics.jsonl, clients.h5, TensorBoard, MLflow, the
                                                        # progress line, the user's callback (fedrun.metrics.observer)
        checkpoints.after_round(t + 1, halted)          # fedrun.federation.cadence; a stop signal ends the run there

A run is exactly its :class:`~fedrun.federation.run_state.RunState` plus its config; a checkpoint saves that.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrun.checkpoint import list_checkpoints
from fedrun.config import Config, config_from_dict
from fedrun.errors import CheckpointError, ConfigError, argument, on_every_rank, writing
from fedrun.federation import resume as resume_policy
from fedrun.federation import snapshot
from fedrun.federation.build import RunState, Setup, build
from fedrun.federation.cadence import Checkpoints
from fedrun.federation.participation.registry import make_participation
from fedrun.federation.rounds import CLIENT_ARRAYS
from fedrun.federation.runtime_log import RuntimeLog
from fedrun.metrics import observer as sinks
from fedrun.metrics.log import MetricsLog, Progress, flatten
from fedrun.metrics.mlflow import MlflowLog
from fedrun.metrics.observer import Observer, Observers, RoundCallback, UserCallback
from fedrun.metrics.per_client import ClientMetricsFile
from fedrun.metrics.tensorboard import TensorBoardLog
from fedrun.privacy.guarantee import noise_source, noise_warning
from fedrun.runtime.signals import StopSignals, shown
from fedrun.runtime.world import World
from fedrun.training.flat_model import module_at


@dataclass
class RunResult:
    """What :func:`train` (and ``fedrun.run``) returns on every rank."""

    x: np.ndarray  # final global model, flat, in the model's parameter order
    metrics: list[dict[str, Any]] = field(default_factory=list)  # per-round records (rank 0)
    config: Config | None = None
    rank: int = 0
    rounds_run: int = 0  # rounds this call ran (0: the run had finished before; nothing was written)
    stopped: bool = False  # the per-round callback (or a sink) stopped the run before run.rounds (it is resumable)
    module: torch.nn.Module | None = field(default=None, repr=False)  # the model's module (layout of x)

    def model(self) -> torch.nn.Module:
        """The trained model as a ``torch.nn.Module`` in eval mode: a copy of the run's module with parameters
        ``x`` (buffers, such as batch-norm running statistics, are this rank's)."""
        if self.module is None:
            raise ValueError("this RunResult holds no model module")
        return module_at(self.module, torch.as_tensor(self.x)).eval()


@dataclass(frozen=True)
class RunOptions:
    """How :func:`train` runs beyond its config: the arguments of ``fedrun.run`` of the same names."""

    progress: bool = True  # rank 0 prints start-up lines and the progress line
    resume: str | None = None  # "auto" (the newest valid checkpoint of the run directory, if any) or a path
    signals: StopSignals | None = None  # stop-signal handlers the caller installed (else: for the rounds only)
    accept_changes: tuple[str, ...] = ()  # trajectory settings a resumed run may change
    callback: RoundCallback | None = None  # rank 0's callback(record) after every round; true stops the run
    observers: tuple[Observer, ...] = ()  # the caller's own sinks, on every rank (after metrics.observers')


def train(cfg: Config, world: World, run_dir: Path | None, options: RunOptions) -> RunResult:
    """Run rounds ``start .. cfg.run.rounds - 1`` and return the final model and metrics.

    A resumed run may change only the settings :mod:`fedrun.federation.resume` accepts, and those in
    ``options.accept_changes``; one that has done ``cfg.run.rounds`` already says so and returns its final
    model, writing nothing. With a run directory, checkpoints follow :mod:`fedrun.federation.cadence` (a
    stop signal raises :class:`RunInterrupted` after one). A run the callback stopped has ``stopped``.
    """
    torch.set_num_threads(cfg.run.threads)
    # nothing in the run directory changes before the inputs are checked: a run that is refused, or that
    # fails to load its data or checkpoint, leaves an earlier run's files as they were
    own = sinks.plugin_observers(cfg.metrics.observers, sinks.observer_types(cfg.metrics.observers),
                                 run_dir if world.is_root else None)
    path, changes = start_point(cfg, world, run_dir, options.resume, options.accept_changes)
    setup, state = build(cfg, world, run_dir)
    resume_s = _restore(setup, state, path, options)
    if path is not None and state.next_round == cfg.run.rounds:
        return _finished_already(setup, state, run_dir or path)
    # an unreachable tracking URI is bad input: refused before anything is written, on every rank
    params = flatten(cfg.to_dict())
    if setup.privacy is not None:  # the sigma in use (calibrated when the config says null)
        params["privacy.noise_multiplier"] = setup.privacy.state.accountant.sigma
    tracker = decided_by_root(world, lambda: MlflowLog(run_dir if cfg.metrics.mlflow else None, cfg.metrics,
                                                       cfg.run.name, params))
    metrics = MetricsLog(run_dir if world.is_root else None, state.metrics)
    _record_start(setup, state, path, changes, metrics)
    runtime = RuntimeLog(setup, state, run_dir, resume_s)
    signals = options.signals or StopSignals()
    observers = Observers(metrics, *_files(setup, state, path is not None), tracker, *own, *options.observers,
                          *_on_screen(setup, state, options, signals))
    signals.starting = False  # from here on a stop signal finishes a round and writes a checkpoint
    checkpoints = Checkpoints(setup, state, runtime, signals, announce=world.is_root and options.progress)
    first = state.next_round
    with signals, checkpoints:
        observers.on_start(runtime.data["provenance"])
        try:
            for t in range(first, cfg.run.rounds):
                if _budget_spent(setup, t, checkpoints, signals):
                    break
                record = setup.round.run(state, t, stop_requested=lambda: signals.requested)
                arrays = record.pop(CLIENT_ARRAYS, None)
                if world.is_root:
                    state.metrics.append(record)
                halted = observers.on_round_end(record, arrays)
                checkpoints.after_round(t + 1, halted)  # a stop signal raises RunInterrupted after the checkpoint
                if halted:
                    who = "the callback" if options.callback is not None else "a metrics sink"
                    _say(setup, signals, f"{who} stopped the run after round {t + 1} ({checkpoints.kept()})")
                    break
        finally:
            observers.on_stop(finished=state.next_round == cfg.run.rounds)
    runtime.finish()
    return _result(setup, state, rounds_run=state.next_round - first, stopped=state.next_round < cfg.run.rounds)


def _restore(setup: Setup, state: RunState, path: Path | None, options: RunOptions) -> float | None:
    """Load the checkpoint ``path`` into ``state`` (None: a fresh run) and say so; the seconds it took."""
    world, cfg = setup.world, setup.cfg
    if path is None:
        if world.is_root and options.progress and options.resume == "auto":
            print(f"fedrun: no checkpoint in {setup.run_dir}; starting a fresh run", flush=True)
        return None
    started = time.perf_counter()
    snapshot.restore(setup, state, path)
    if setup.privacy is not None:  # the restored privacy state against the config that wrote it
        saved = config_from_dict(snapshot.saved_config(path))
        planner = make_participation(saved.participation, setup.num_clients, saved.run.seed, saved.run.rounds)
        setup.privacy.check_source(saved.privacy, saved.run.rounds, planner, str(path))
    seconds = time.perf_counter() - started
    if world.is_root and options.progress and state.next_round < cfg.run.rounds:
        print(f"fedrun: resumed from {path} after round {state.next_round}", flush=True)
    return seconds


def _finished_already(setup: Setup, state: RunState, where: Path) -> RunResult:
    """A resumed run that has done all its rounds: say so, write nothing, return its final model."""
    if setup.world.is_root:
        print(f"fedrun: {where} finished all {setup.cfg.run.rounds} rounds already{_final(state.metrics)}; "
              "nothing to run (raise run.rounds to continue it, or choose another run.dir)", flush=True)
    return _result(setup, state, rounds_run=0)


def _record_start(setup: Setup, state: RunState, path: Path | None, changes: list[resume_policy.Change],
                  metrics: MetricsLog) -> None:
    """Rank 0's first writes to the run directory: a resumed run's metrics.jsonl (the checkpoint's records) and
    its entry in the resume history, then config.yaml."""
    run_dir = setup.run_dir
    if run_dir is None or not setup.world.is_root:
        return
    if path is not None:
        metrics.sync()
        with writing(run_dir / resume_policy.HISTORY):
            resume_policy.record(run_dir, changes, str(path), state.next_round)
        if changes:
            print(f"fedrun: resuming {path.name} with changed settings: {'; '.join(map(str, changes))} "
                  f"(recorded in {resume_policy.HISTORY})", flush=True)
    with writing(run_dir / "config.yaml"):
        (run_dir / "config.yaml").write_text(setup.cfg.to_yaml())


def _files(setup: Setup, state: RunState, resumed: bool) -> tuple[Observer | None, Observer]:
    """Rank 0's files besides metrics.jsonl: clients.h5 (with per-client evaluation) and TensorBoard's events."""
    root_dir = setup.run_dir if setup.world.is_root else None
    evaluated = setup.client_eval
    clients = ClientMetricsFile(root_dir, evaluated.ids, evaluated.counts,
                                state.next_round if resumed else None) if evaluated else None
    return clients, TensorBoardLog(root_dir if setup.cfg.metrics.tensorboard else None, state.next_round + 1)


def _on_screen(setup: Setup, state: RunState, options: RunOptions,
               signals: StopSignals) -> tuple[Observer | None, Observer | None]:
    """The progress line (rank 0 with progress, after its start-up lines) and the user's callback. The
    start-up lines, like the progress line, take a closed stdout (``| head -2``) as a stop request."""
    callback = UserCallback(options.callback, setup.world) if options.callback is not None else None
    if not (setup.world.is_root and options.progress):
        return None, callback
    timings = ", ".join(f"{k} {v:.4f} s" for k, v in setup.strategy_timings.items())
    _say(setup, signals, f"local strategy {state.strategy.name}" + (f" (timed: {timings})" if timings else ""))
    _say(setup, signals, f"client state {setup.store_choice}")
    if setup.privacy is not None:
        _say(setup, signals, setup.privacy.describe())
        _say(setup, signals, f"privacy: {noise_source(setup.privacy)}")
        warning = noise_warning(setup.privacy, setup.dim)
        if warning:
            _say(setup, signals, warning)
    def say(line: str) -> None:  # how far a long evaluation has come (only rank 0 gets here)
        shown(signals, print, f"fedrun: {line}", flush=True)

    # a closure over signals alone: one over setup would be a reference cycle (setup -> evaluation -> say ->
    # setup) that keeps the run's objects, an on-demand dataset's open file among them, alive after the run
    setup.round.evaluation.say = say
    return Progress(setup.cfg.run.rounds, setup.cfg.run.log_every, signals), callback


def _budget_spent(setup: Setup, t: int, checkpoints: Checkpoints, signals: StopSignals) -> bool:
    """Whether the privacy budget refuses round t (the same decision on every rank: the accountant's state is
    replicated); then the run ends after a checkpoint of the rounds done, and says why."""
    over = setup.privacy.over_budget(t) if setup.privacy is not None else None
    if over is not None:
        checkpoints.before_stop(t)
        _say(setup, signals, over)
    return over is not None


def _say(setup: Setup, signals: StopSignals, line: str) -> None:
    """``fedrun: <line>`` on rank 0's stdout (a closed stdout is a stop request, :func:`shown`)."""
    if setup.world.is_root:
        shown(signals, print, f"fedrun: {line}", flush=True)


def _result(setup: Setup, state: RunState, rounds_run: int, stopped: bool = False) -> RunResult:
    x = setup.exchange.global_model().detach().cpu().numpy().copy()
    return RunResult(x=x, metrics=state.metrics if setup.world.is_root else [], config=setup.cfg,
                     rank=setup.world.rank, rounds_run=rounds_run, stopped=stopped, module=setup.learner.model.module)


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
