"""Sweep files: a base config, a grid of dotted overrides, where to put the runs, what to ask Slurm for.

A sweep file (YAML)::

    name: fedsum-vs-fedavg
    root: runs/sweeps/fedsum-vs-fedavg   # sweep directory (default runs/sweeps/<name>)
    base: configs/quickstart.yaml        # or an inline `config:` mapping
    overrides: [run.rounds=50]           # applied to every run, before the grid point
    grid:                                # cartesian product, in this key order
      algorithm.name: [fedavg, fedsum]
      run.seed: [0, 1, 2]
    seed_key: run.seed                   # the axis the report averages over (default run.seed)
    resources: {partition: gpu, time_min: 60, tasks: 2, gpus_per_task: 1, cpus_per_task: 4,
                mem_gb: 32, array_parallelism: 16, signal_delay_s: 90, max_requeues: 3}
    command: [python, -m, fedrun, train] # the program each rank runs (default: this interpreter)

Every grid point becomes a :class:`RunSpec` whose directory ``<root>/<readable>-<hash>`` is a pure
function of the point, so submitting a sweep again finds the same directories.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fedrun.config.yaml12 import YAMLError, parse_yaml
from fedrun.errors import ConfigError, SweepError, brief


@dataclass
class Resources:
    partition: str | None = None
    time_min: int = 60  # Slurm time limit of one job (one run), minutes
    tasks: int = 1  # MPI ranks per run
    gpus_per_task: int = 0
    cpus_per_task: int = 1
    mem_gb: float | None = None  # per job; None: the partition's default
    array_parallelism: int = 64  # at most this many runs at once
    signal_delay_s: int = 90  # SIGUSR1 this long before the time limit: checkpoint, requeue
    max_requeues: int = 3  # requeues after timeouts (preemptions do not count)
    mpi: str = "none"  # srun --mpi=...: none (ranks from Slurm, no MPI), pmi2 for MPICH, pmix for Open MPI
    nodes: int = 1
    extra: dict[str, Any] = field(default_factory=dict)  # more sbatch options, e.g. {account: abc}


@dataclass
class RunSpec:
    """One grid point: its directory and the overrides that make it."""

    name: str  # directory name under the sweep root
    dir: Path
    point: dict[str, Any]  # grid key -> value
    overrides: list[str]  # sweep overrides + grid point + run.dir=...

    def label(self) -> str:
        return " ".join(f"{k}={format_value(v)}" for k, v in self.point.items())


@dataclass
class SweepSpec:
    name: str
    root: Path
    grid: dict[str, list[Any]]
    base: Path | None = None
    config: dict[str, Any] | None = None
    overrides: list[str] = field(default_factory=list)
    seed_key: str = "run.seed"
    resources: Resources = field(default_factory=Resources)
    command: list[str] | None = None
    source: Path | None = None

    def program(self) -> list[str]:
        return list(self.command) if self.command else [sys.executable, "-m", "fedrun", "train"]

    def runs(self) -> list[RunSpec]:
        out = []
        for point in expand_grid(self.grid):
            name = run_name(point)
            run_dir = self.root / name
            overrides = [*self.overrides, *(f"{k}={format_value(v)}" for k, v in point.items()),
                         f"run.dir={run_dir}"]
            out.append(RunSpec(name=name, dir=run_dir, point=point, overrides=overrides))
        return out


def expand_grid(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Cartesian product of the grid's value lists, first key varying slowest; ``{}`` gives one point."""
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def format_value(value: Any) -> str:
    """A value as it must appear on the right of ``key=`` (parsed back as YAML by the config loader)."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
        if "e" in text and "." not in text:  # PyYAML reads 1e-05 as a string, 1.0e-05 as a float
            text = text.replace("e", ".0e", 1)
        return text
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))  # lists, mappings: YAML flow style


def point_hash(point: dict[str, Any]) -> str:
    canon = json.dumps({k: point[k] for k in sorted(point)}, sort_keys=True, default=str)
    return hashlib.sha1(canon.encode()).hexdigest()[:6]


def run_name(point: dict[str, Any], max_len: int = 80) -> str:
    """``fedsum_lr0.1_seed0-1a2b3c``: the last part of each key and its value, then a hash of the point.

    ``*.name`` keys contribute their value only. The hash keeps names unique when two keys share a last
    part or the readable part is cut at ``max_len``.
    """
    parts = []
    for key, value in point.items():
        short = key.rsplit(".", 1)[-1]
        text = format_value(value)
        parts.append(text if short == "name" else f"{short}{text}")
    readable = re.sub(r"[^A-Za-z0-9._+-]+", "-", "_".join(parts))
    readable = readable.strip("-_")[:max_len] or "run"
    return f"{readable}-{point_hash(point)}"


def load_sweep(path: str | Path, root: str | Path | None = None) -> SweepSpec:
    """Read and check a sweep file. Relative ``base`` paths are tried against the current directory,
    then the sweep file's directory; a relative ``root`` is taken against the current directory."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"{path}: sweep file not found")
    try:  # YAML 1.2, bounded, duplicate keys refused: as a config file (fedrun.config.yaml12)
        data = parse_yaml(path.read_text()) or {}
    except YAMLError as exc:
        raise SweepError(f"{path}: not valid YAML ({brief(str(exc).strip().splitlines()[0])[1:-1]})") from None
    except ConfigError as exc:
        raise SweepError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise SweepError(f"{path}: expected a mapping at the top level")
    allowed = {"name", "root", "base", "config", "grid", "overrides", "seed_key", "resources", "command"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise SweepError(f"{path}: {unknown[0]}: unknown key (allowed: {', '.join(sorted(allowed))})")
    name = str(data.get("name") or path.stem)
    base = None
    if data.get("base") is not None:
        base = Path(str(data["base"]))
        if not base.is_absolute() and not base.exists():
            base = path.parent / base
        if not base.is_file():
            raise SweepError(f"{path}: base: config file {data['base']} not found")
    config = data.get("config")
    if config is not None and not isinstance(config, dict):
        raise SweepError(f"{path}: config: expected a mapping")
    if base is not None and config is not None:
        raise SweepError(f"{path}: give either base or config, not both")
    grid = data.get("grid") or {}
    if not isinstance(grid, dict):
        raise SweepError(f"{path}: grid: expected a mapping of dotted keys to lists of values")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"{path}: grid.{key}: expected a non-empty list of values")
        if key == "run.dir":
            raise SweepError(f"{path}: grid.run.dir: run directories are chosen by the sweep")
    overrides = data.get("overrides") or []
    if isinstance(overrides, dict):
        overrides = [f"{k}={format_value(v)}" for k, v in overrides.items()]
    if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
        raise SweepError(f"{path}: overrides: expected a list of section.key=value strings")
    res_raw = data.get("resources") or {}
    if not isinstance(res_raw, dict):
        raise SweepError(f"{path}: resources: expected a mapping")
    res_names = {f.name for f in fields(Resources)}
    bad = sorted(set(res_raw) - res_names)
    if bad:
        raise SweepError(f"{path}: resources.{bad[0]}: unknown key (allowed: {', '.join(sorted(res_names))})")
    resources = Resources(**res_raw)
    for key in ("time_min", "tasks", "cpus_per_task", "array_parallelism", "nodes"):
        value = getattr(resources, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SweepError(f"{path}: resources.{key}: expected an integer >= 1, got {value!r}")
    command = data.get("command")
    if command is not None:
        if isinstance(command, str):
            command = command.split()
        if not isinstance(command, list) or not command:
            raise SweepError(f"{path}: command: expected a list of words")
        command = [str(c) for c in command]
    root_path = Path(root) if root is not None else Path(str(data.get("root") or f"runs/sweeps/{name}"))
    return SweepSpec(name=name, root=root_path, grid=grid, base=base, config=config, overrides=overrides,
                     seed_key=str(data.get("seed_key", "run.seed")), resources=resources,
                     command=command, source=path)
