"""Validate every task of a sweep exactly as ``fedrun train`` would, before anything is queued.

For each task: the base config (file or inline mapping) with the sweep's overrides and the grid point
applied, type-checked and range-checked by :mod:`fedrun.config` (unknown keys, bad values), then the
dataset loaded and the model run on one example (:func:`fedrun.preflight.check_model_fits_data`). A bad
task becomes one line naming its array index, the override responsible and the field::

    array index 1 (lrabc_seed0-6ac1d2): local.lr=abc: local.lr: expected a number, got 'abc'

Datasets are loaded once per distinct ``data`` section (the seed changes which examples go where, not
their shapes), so a grid over seeds and learning rates costs one load.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from fedrun.sweep.spec import RunSpec

if TYPE_CHECKING:
    from fedrun.sweep.spec import SweepSpec


_FIELD = re.compile(r"^([A-Za-z_][\w.]*)(?:\[\d+\])*\s*[:=]")


def validate_runs(spec: SweepSpec, runs: list[RunSpec], progress: Callable[[str], Any] | None = None) -> list[str]:
    """One line per invalid task of ``runs`` (in array order: index i is array element i), else [].
    ``progress(line)``: told before each model/data check (each loads a dataset: seconds to minutes)."""
    from fedrun.config import apply_override, config_from_dict, load_config
    from fedrun.errors import ConfigError, DataError
    from fedrun.preflight import check_model_fits_data

    checked: dict[str, str | None] = {}  # model + data section -> problem (None: fits)
    problems = []
    for index, run in enumerate(runs):
        overrides = [o for o in run.overrides if not o.startswith("run.dir=")]
        try:
            if spec.config is not None:
                data = copy.deepcopy(spec.config)
                for item in overrides:
                    apply_override(data, item)
                cfg = config_from_dict(data)
            else:
                cfg = load_config(spec.base, overrides)
        except ConfigError as exc:
            problems.append(_line(index, run, overrides, str(exc)))
            continue
        key = json.dumps([cfg.model.name, asdict(cfg.data)], sort_keys=True, default=str)
        if key not in checked:
            if progress is not None:
                progress(f"fedrun sweep: checking run {index + 1}/{len(runs)} ({run.name}): model "
                         f"{cfg.model.name} on data {cfg.data.name}")
            try:
                check_model_fits_data(cfg)
                checked[key] = None
            except (ConfigError, DataError) as exc:
                checked[key] = str(exc).strip().splitlines()[0]
        if checked[key] is not None:
            problems.append(_line(index, run, overrides, checked[key], sections=("model", "data")))
    return problems


def _line(index: int, run: RunSpec, overrides: list[str], message: str,
          sections: tuple[str, ...] = ()) -> str:
    """``array index I (NAME): OVERRIDE: MESSAGE``; OVERRIDE is the task's override that sets the field
    the message names (for a model/data mismatch: those of the model and data sections), or
    ``base config`` when no override touches it."""
    message = message.strip().splitlines()[0] if message.strip() else "invalid"
    match = _FIELD.match(message)
    field = match.group(1) if match else ""
    blame = [o for o in overrides if _touches(o.split("=", 1)[0].strip(), field)]
    if sections:
        blame = [o for o in overrides if o.split("=", 1)[0].strip().split(".")[0] in sections] or blame
    # the grid point's own overrides are listed last in run.overrides and are the likelier culprits
    point = {f"{k}=" for k in run.point}
    blame.sort(key=lambda o: not any(o.startswith(p) for p in point))
    source = " ".join(blame) if blame else "base config"
    return f"array index {index} ({run.name}): {source}: {message}"


def _touches(key: str, field: str) -> bool:
    return bool(field) and (key == field or field.startswith(key + ".") or key.startswith(field + "."))

