"""The resume policy: which settings may differ between a checkpoint and the run that resumes it.

A run is its trajectory x_0, x_1, ..., x_T: a function of the settings that define it (data, partition,
seed, dtype, model, algorithm and its hyperparameters, local training, participation, asynchrony, and
any later key such as a plugin's digest). Those may not change on resume, or the resumed run silently
continues a different run (a new ``run.seed`` regenerates the data). Settings that only say how long,
where and how visibly the run goes (more rounds, evaluation, logging, checkpoint cadence, threads,
timeouts) may change; they are accepted and printed.

The comparison is :func:`compare` over two resolved config dicts, key by dotted key, so a new section
or key is a trajectory key unless it is listed in :data:`CHANGEABLE`. A user who means a trajectory
change names the keys (``--accept-changes KEY[,KEY...]``); every accepted change is appended to
``config_history.jsonl`` in the run directory (:func:`record`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fedrun.errors import ConfigError, argument
from fedrun.metrics.log import flatten

HISTORY = "config_history.jsonl"

# dotted keys (or "section." prefixes) that do not change the trajectory
CHANGEABLE = (
    "run.name", "run.dir", "run.rounds", "run.device", "run.threads", "run.timeout_s", "run.log_every",
    "run.placement",  # which rank trains whom: the order of float sums, as a different number of ranks
    "local.strategy",  # a resumed run keeps its checkpoint's strategy (docs/engine.md)
    "eval.", "checkpoint.", "metrics.",
    "state.",  # where the client state lives, not what it is
)
_ABSENT = "<absent>"


@dataclass(frozen=True)
class Change:
    key: str  # dotted key, e.g. "local.lr"
    old: Any  # the checkpoint's value (``<absent>`` when the key did not exist)
    new: Any

    def __str__(self) -> str:
        return f"{self.key} {_show(self.old)} -> {_show(self.new)}"


def _show(value: Any) -> str:
    return value if value == _ABSENT else json.dumps(value)


def changeable(key: str) -> bool:
    return any(key == c or (c.endswith(".") and key.startswith(c)) for c in CHANGEABLE)


def compare(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """Every dotted key whose value differs between two resolved config dicts, sorted by key."""
    a, b = flatten(old), flatten(new)
    return [Change(k, a.get(k, _ABSENT), b.get(k, _ABSENT)) for k in sorted(set(a) | set(b))
            if a.get(k, _ABSENT) != b.get(k, _ABSENT)]


def check(old: dict[str, Any], new: dict[str, Any], accepted: tuple[str, ...], checkpoint: str) -> list[Change]:
    """The changes between a checkpoint's config ``old`` and this run's ``new`` that the policy accepts.

    Raises :class:`ConfigError` (exit status 2, nothing written) listing every trajectory change that is not
    named in ``accepted``, with both values; ``accepted`` keys must be keys of the config."""
    changes = compare(old, new)
    known = set(flatten(old)) | set(flatten(new))
    for key in accepted:
        if key not in known:
            raise ConfigError(f"{argument('accept_changes')}: {key!r} is not a config key (expected section.key, "
                              "e.g. local.lr)")
    refused = [c for c in changes if not changeable(c.key) and c.key not in accepted]
    if refused:
        keys = tuple(c.key for c in refused)
        raise ConfigError(f"{argument('resume')}: checkpoint {checkpoint} was written with other settings that "
                          f"define the trajectory: {'; '.join(map(str, refused))}; resume with the checkpoint's "
                          f"values, or accept the change with {argument('accept_changes', keys)}")
    return changes


def record(run_dir: Path, changes: list[Change], checkpoint: str, next_round: int) -> None:
    """Append the accepted ``changes`` to ``run_dir/config_history.jsonl`` (nothing when there are none)."""
    if not changes:
        return
    entry = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"), "checkpoint": checkpoint,
             "after_round": next_round, "changes": {c.key: [c.old, c.new] for c in changes},
             "trajectory": [c.key for c in changes if not changeable(c.key)]}
    with (run_dir / HISTORY).open("a") as fh:
        fh.write(json.dumps(entry) + "\n")
