"""The Python API for notebooks and tests: ``fedrun.run(config) -> RunResult``."""

from __future__ import annotations

import copy
from pathlib import Path

from fedrun.config import Config, apply_override, config_from_dict, load_config
from fedrun.federation.loop import RunResult, train
from fedrun.runtime.world import World, init_world


def run(config: Config | dict | str | Path, overrides: list[str] | tuple[str, ...] = (),
        world: World | None = None, progress: bool = False, write_files: bool = True) -> RunResult:
    """Run one experiment in this process (single rank, or this rank of an MPI launch).

    ``config`` is a :class:`Config`, a dict of sections, or a YAML path. On rank 0 the result holds
    the final global model as a flat numpy array and the per-round metrics; other ranks get the model
    and no metrics. With ``write_files`` the run directory receives config.yaml and metrics.jsonl.
    """
    if isinstance(config, (str, Path)):
        cfg = load_config(config, overrides)
    else:
        data = config.to_dict() if isinstance(config, Config) else copy.deepcopy(config)
        for item in overrides:
            apply_override(data, item)
        cfg = config_from_dict(data)
    world = world or init_world(cfg.run.device, cfg.run.timeout_s)
    run_dir = None
    if write_files:
        run_dir = cfg.run_dir()
        if world.is_root:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(cfg.to_yaml())
    return train(cfg, world, run_dir, progress=progress)

