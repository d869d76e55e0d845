"""Every file under configs/ loads with fedrun.load_config; every grid point of a sweep file does too.

A sweep file (read by ``python -m fedrun sweep``) is a mapping with ``grid`` and ``base`` (or an inline
``config``); its ``overrides`` and each grid point's ``key=value`` pairs are applied to the base, as the
sweep tool does. The check needs no data files: configs are validated, not run.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml

from fedrun import load_config
from fedrun.config import apply_override, config_from_dict

REPO = Path(__file__).resolve().parents[1]
FILES = sorted(p for p in (REPO / "configs").rglob("*") if p.suffix in (".yaml", ".yml"))


def is_sweep(data: dict) -> bool:
    return "grid" in data


def override_value(value) -> str:
    """``key=value`` text that the config loader parses back (YAML) to ``value``."""
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        text = repr(value)
        return text.replace("e", ".0e", 1) if "e" in text and "." not in text else text
    return json.dumps(value)


def grid_points(grid: dict) -> list[dict]:
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def test_there_are_configs_and_sweeps():
    sweeps = [p for p in FILES if is_sweep(yaml.safe_load(p.read_text()) or {})]
    assert len(FILES) - len(sweeps) >= 8 and len(sweeps) >= 8


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(REPO / "configs")) for p in FILES])
def test_config_file_loads(path):
    data = yaml.safe_load(path.read_text()) or {}
    if not is_sweep(data):
        load_config(path)
        return
    for key in ("name", "grid"):
        assert key in data, f"{path}: sweep file without {key!r}"
    assert ("base" in data) != ("config" in data), f"{path}: a sweep needs base or config"
    if "base" in data:
        base = REPO / data["base"]
        assert base.is_file(), f"{path}: base {data['base']} not found"
        base_data = yaml.safe_load(base.read_text()) or {}
    else:
        base_data = data["config"]
    assert set(data.get("resources", {})) <= {
        "partition", "time_min", "tasks", "gpus_per_task", "cpus_per_task", "mem_gb", "array_parallelism",
        "signal_delay_s", "max_requeues", "mpi", "nodes", "extra"}
    points = grid_points(data["grid"])
    assert points
    for point in points:
        cfg_data = json.loads(json.dumps(base_data))
        for item in [*data.get("overrides", []), *(f"{k}={override_value(v)}" for k, v in point.items())]:
            apply_override(cfg_data, item)
        cfg = config_from_dict(cfg_data)
        for key, value in point.items():  # the point really reached the config
            section, _, field = key.partition(".")
            got = cfg.algorithm.name if key == "algorithm.name" else None
            if section == "algorithm" and field != "name":
                got = getattr(cfg.algorithm.hparams, field)
            elif section != "algorithm":
                obj = cfg
                for part in key.split("."):
                    obj = getattr(obj, part)
                got = obj
            assert got == value, f"{path}: {key} should be {value!r}, got {got!r}"
