"""The Python API for notebooks and tests: ``fedrun.run(config) -> RunResult``."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

from fedrun.config import Config, apply_override, config_from_dict, load_config
from fedrun.errors import RunInterrupted, exit_code, one_line
from fedrun.federation.loop import RunResult, train
from fedrun.runtime.signals import StopSignals
from fedrun.runtime.world import World, init_world


def run(config: Config | dict | str | Path, overrides: list[str] | tuple[str, ...] = (),
        world: World | None = None, progress: bool = False, write_files: bool = True,
        resume: str | None = None, signals: StopSignals | None = None) -> RunResult:
    """Run one experiment in this process (single rank, or this rank of an MPI launch).

    ``config`` is a :class:`Config`, a dict of sections, or a YAML path. On rank 0 the result holds
    the final global model as a flat numpy array and the per-round metrics; other ranks get the model
    and no metrics. With ``write_files`` the run directory receives config.yaml, metrics.jsonl,
    checkpoints and, at the end, result.json. ``resume``: "auto" or a checkpoint path.
    """
    if isinstance(config, (str, Path)):
        cfg = load_config(config, overrides)
    else:
        data = config.to_dict() if isinstance(config, Config) else copy.deepcopy(config)
        for item in overrides:
            apply_override(data, item)
        cfg = config_from_dict(data)
    owns_world = world is None
    world = world or init_world(cfg.run.device, cfg.run.timeout_s)
    try:
        run_dir = None
        if write_files:
            run_dir = cfg.run_dir()
            if world.is_root:
                run_dir.mkdir(parents=True, exist_ok=True)
                (run_dir / "config.yaml").write_text(cfg.to_yaml())
        if progress and world.is_root:
            print(f"fedrun: {cfg.algorithm.name} on {cfg.data.name}, {cfg.data.num_clients} clients, "
                  f"{world.size} rank(s) on {world.device}, run dir {run_dir}", flush=True)
        result = train(cfg, world, run_dir, progress=progress, resume=resume, signals=signals)
        if run_dir is not None and world.is_root:
            write_result(run_dir, result.metrics)
    except BaseException as exc:
        if isinstance(exc, RunInterrupted) and owns_world:
            world.close()  # every rank stopped after the same round and checkpoint
        elif owns_world and world.size > 1 and not isinstance(exc, (SystemExit, KeyboardInterrupt)):
            # one rank failed: end the whole job now, naming the rank, rather than let peers hang
            print(f"fedrun[rank {world.rank}]: error: {one_line(exc)}", file=sys.stderr, flush=True)
            world.abort(exit_code(exc))
        raise
    if owns_world:
        world.close()
    return result


def write_result(run_dir: Path, metrics: list[dict]) -> None:
    """``result.json``: the last round's record with the latest test metrics (marks a finished run)."""
    final = dict(metrics[-1]) if metrics else {}
    for entry in reversed(metrics):
        if "test_loss" in entry:
            final.update({k: v for k, v in entry.items() if k.startswith("test_")})
            break
    (run_dir / "result.json").write_text(json.dumps(final, indent=1) + "\n")
