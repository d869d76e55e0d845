"""The Python API for notebooks and tests: ``fedrun.run(config) -> RunResult``."""

from __future__ import annotations

import copy
import fcntl
import json
import os
import signal
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import IO

from fedrun.config import Config, apply_overrides, config_from_dict, load_config
from fedrun.errors import DISK_ERRORS, EXIT_BAD_INPUT, ConfigError, RunFailure, exit_code, writing
from fedrun.federation.loop import RunOptions, RunResult, train
from fedrun.metrics.log import standard
from fedrun.metrics.observer import Observer, RoundCallback
from fedrun.preflight import check_sinks, check_threads
from fedrun.runtime.failures import FailureGuard
from fedrun.runtime.signals import StopSignals
from fedrun.runtime.world import World, init_world


def run(config: Config | dict | str | Path, overrides: list[str] | tuple[str, ...] = (),
        world: World | None = None, progress: bool = False, write_files: bool = True,
        resume: str | None = None, signals: StopSignals | None = None,
        accept_changes: tuple[str, ...] = (), callback: RoundCallback | None = None,
        observers: list[Observer] | tuple[Observer, ...] = ()) -> RunResult:
    """Run one experiment in this process (single rank, or this rank of an MPI launch) and return its result.

    ``config``: a :class:`Config`, a dict of sections, or a YAML path; ``overrides``: ``section.key=value``
    strings applied on top, as on the command line. ``progress``: print rank 0's progress line (round,
    loss, test accuracy, s/round, ETA) and start-up lines to stdout, as ``fedrun train`` does (off by default
    for notebooks). ``write_files``: fill the run directory (config.yaml, metrics.jsonl, checkpoints, and at
    the end result.json); False writes nothing. ``resume``: "auto" (newest valid checkpoint of run.dir, else
    a fresh run) or a checkpoint path; ``accept_changes``: trajectory settings allowed to differ from the
    checkpoint's (docs/reliability.md). ``callback(record)``: called on rank 0 after every round with the
    round's metrics record (a dict, as in metrics.jsonl); return True to stop the run after that round
    (a checkpoint is written, result.json is not: resume it later). ``observers``: sinks of your own,
    :class:`fedrun.metrics.observer.Observer` instances called on this rank after the built-in sinks (every
    rank of a launch passes its own; docs/extending.md, "A metrics sink"). ``world``, ``signals``: a World and
    stop-signal handlers the caller owns (the CLI); by default they are made here.

    The :class:`RunResult` holds, on every rank, the final global model ``x`` (a flat numpy vector in the
    model's parameter order) and ``model()`` (the trained ``torch.nn.Module``); on rank 0 also ``metrics``,
    the per-round records. A stop signal (SIGTERM, SIGUSR1, Ctrl-C) ends the run after a checkpoint with
    :class:`fedrun.errors.RunInterrupted`. A failure on one rank of several ends the whole job with one
    line naming it (:class:`fedrun.runtime.failures.FailureGuard`).
    """
    cfg = _resolved(config, overrides)
    check_threads(cfg.run)  # before the rendezvous: every rank refuses it alike, rank 0 says so
    check_sinks(cfg.metrics, cfg.run_dir() if write_files else None)  # and before anything is written
    owns_world = world is None
    world = world or init_world(cfg.run.device, cfg.run.timeout_s)
    if signals is not None:
        signals.reinstall()  # MPI's initialisation may have taken SIGHUP (UCX's debug signal)
    with FailureGuard(world, owns_world):
        run_dir = cfg.run_dir() if write_files else None
        lock: AbstractContextManager = lock_run_dir(run_dir) if run_dir is not None and world.is_root else nullcontext()
        with lock:  # a refused run leaves no run directory or lock behind
            if progress and world.is_root:
                print(f"fedrun: {cfg.algorithm.name} on {cfg.data.name}, {cfg.data.num_clients} clients, "
                      f"{world.size} rank(s) on {world.device}, run dir {run_dir}", flush=True)
            result = train(cfg, world, run_dir, RunOptions(progress=progress, resume=resume, signals=signals,
                                                           accept_changes=tuple(accept_changes), callback=callback,
                                                           observers=tuple(observers)))
            if run_dir is not None and world.is_root and result.rounds_run > 0 and not result.stopped:
                write_result(run_dir, result.metrics)
    if owns_world:
        world.close()
    return result


def _resolved(config: Config | dict | str | Path, overrides: list[str] | tuple[str, ...]) -> Config:
    """The run's config: ``config`` (a YAML path, a dict of sections or a Config, left unchanged) with ``overrides``."""
    if isinstance(config, (str, Path)):
        return load_config(config, overrides)
    if not isinstance(config, (Config, dict)):
        raise TypeError(f"fedrun.run: config must be a Config, a dict of sections ({{}}: every default) or a YAML "
                        f"path, not {type(config).__name__}")
    data = config.to_dict() if isinstance(config, Config) else copy.deepcopy(config)
    apply_overrides(data, overrides)
    return config_from_dict(data)


class RunDirLock:
    """The held lock of a run directory and what taking it created (the directories, the lock file), so that
    a refused run can leave nothing behind: :meth:`release` with ``refused`` removes what it created. As a
    context manager it releases on exit, as refused when bad input (exit status 2) leaves it."""

    def __init__(self, fh: IO[str], created: list[Path]) -> None:
        self.fh, self.created = fh, created

    def __enter__(self) -> RunDirLock:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, *rest: object) -> None:
        self.release(refused=exc is not None and exit_code(exc) == EXIT_BAD_INPUT)

    def release(self, refused: bool = False) -> None:
        """Release the lock; after a refusal also remove the lock file and the directories it created (a
        directory only while empty: another process may have put something there meanwhile)."""
        try:
            if refused:
                for path in reversed(self.created):
                    path.unlink() if path.name == ".lock" else path.rmdir()
        except OSError:
            pass
        self.fh.close()


def lock_run_dir(run_dir: Path) -> RunDirLock:
    """Create ``run_dir`` and hold an exclusive lock on ``run_dir/.lock`` (released when the returned lock
    is released or the process ends), so that two live runs never share a run directory."""
    created = [p for p in (run_dir, *run_dir.parents) if not p.exists()][::-1]
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not (run_dir / ".lock").exists():
            created.append(run_dir / ".lock")
        fh = open(run_dir / ".lock", "a+")  # noqa: SIM115 - held for the whole run
    except OSError as exc:
        if exc.errno in DISK_ERRORS:  # the file system fails, not the path: a runtime failure
            raise RunFailure(f"cannot write {run_dir / '.lock'}: {exc.strerror}") from None
        raise ConfigError(f"run.dir={run_dir}: cannot create the run directory or its lock file "
                          f"({exc.strerror or exc})") from None
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        holder = fh.read().split()
        if not _ended_stale_holder(run_dir, holder) or not _locked_within(fh, STALE_WAIT_S):
            fh.close()
            raise ConfigError(f"run.dir={run_dir}: in use by another live run (pid {holder[0] if holder else '?'}); "
                              "wait for it to end or choose another run.dir") from None
    try:
        with writing(run_dir / ".lock"):
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()} {os.getppid()}\n")  # this process and its launcher (or shell)
            fh.flush()
    except RunFailure:
        RunDirLock(fh, created).release(refused=True)
        raise
    return RunDirLock(fh, created)


STALE_WAIT_S = 5.0  # how long a lock of an ended stale holder may take to be released


def _ended_stale_holder(run_dir: Path, holder: list[str]) -> bool:
    """Whether the lock's holder (``holder``: the lock file's ``PID PARENT``) was proven stale and ended: a
    fedrun process that is stopped (SIGSTOP) and whose parent is no longer the launcher or shell it was
    started by (that ended: the process was re-parented). Such a rank is left behind by a job that ended,
    and would hold the run directory for ever; it is ended with SIGKILL, and one line says so. A running
    holder is a live run, whatever its parent (an orphaned rank may still be writing its checkpoint)."""
    if len(holder) != 2 or not all(part.isdigit() for part in holder):
        return False
    pid, parent = int(holder[0]), int(holder[1])
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, IndexError):
        return False  # gone: a lock still held is some other process's (a forked child's): a live run
    if stat[0] not in ("T", "t") or int(stat[1]) == parent or b"fedrun" not in command:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return False
    print(f"fedrun: {run_dir / '.lock'}: held by pid {pid}, a stopped fedrun process whose launcher (pid "
          f"{parent}) has ended; ended it", flush=True)
    return True


def _locked_within(fh: IO[str], seconds: float) -> bool:
    """Take the exclusive lock of ``fh`` within ``seconds`` (its holder is being ended)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)


def write_result(run_dir: Path, metrics: list[dict]) -> None:
    """``result.json``: the last round's record with the latest test metrics (marks a finished run)."""
    final = dict(metrics[-1]) if metrics else {}
    for entry in reversed(metrics):
        if "test_loss" in entry:
            final.update({k: v for k, v in entry.items() if k.startswith("test_")})
            break
    with writing(run_dir / "result.json"):
        (run_dir / "result.json").write_text(json.dumps(standard(final), indent=1, allow_nan=False) + "\n")
