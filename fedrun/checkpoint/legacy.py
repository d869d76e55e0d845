"""The manifest of a checkpoint written before fedrun recorded one (``meta/manifest``, fedrun.checkpoint.manifest).

Such a file is checked as every file was then: the datasets it must hold are derived from its own meta (N,
d, round) and resolved config, as the run wrote them. What each part held follows from the config
(:class:`OldParts`, in the part's own names: the algorithm's server and client entries, the rows the
schedule holds uploads in, the schedule's and the delay tracker's state, the accountant's with privacy);
the caller that knows the parts derives it (fedrun.federation.snapshot), and this module lays it out in the
file's groups. Only old files pay for rebuilding the algorithm; a file with a manifest never comes here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedrun.checkpoint.format import (
    CLIENTS,
    HISTORY,
    METRICS,
    PRIVACY,
    RANDOM,
    RUNTIME,
    SCHEDULE,
    SERVER,
    rows_path,
    values_path,
)
from fedrun.checkpoint.manifest import Legacy, Manifest
from fedrun.checkpoint.reader import CheckpointReader
from fedrun.errors import CheckpointError

Shapes = dict[str, tuple[int, ...]]  # name in the part's group -> shape


@dataclass(frozen=True)
class OldParts:
    """What a file written before the manifest holds, part by part: each dataset's name in its group and its
    shape (a client entry: one row's)."""

    server: Shapes  # the server entries, [d] or scalars
    clients: Shapes  # the client entries and the rows the schedule holds uploads in, [d] or scalars a row
    schedule: Shapes  # the datasets the schedule's state always holds
    history: Shapes  # the delay tracker's state
    privacy: Shapes  # the accountant's state (empty without privacy)


# (N, d, rounds done, resolved config) -> what the file's parts held; a config that is no valid config raises
# CheckpointError("meta/config is not a valid config (...)")
Describe = Callable[[int, int, int, dict[str, Any]], OldParts]


def legacy(describe: Describe) -> Legacy:
    """The derived manifest of a file without one (fedrun.checkpoint.manifest's ``legacy``), from ``describe``."""
    return lambda ckpt: legacy_manifest(ckpt, describe)


def legacy_manifest(ckpt: CheckpointReader, describe: Describe) -> Manifest:
    """The manifest ``ckpt`` would have: :func:`expected_layout` of its meta and config, a vector client entry
    stored in the rows form (``rows`` ``(k,)`` and ``values`` ``(k, d)``) as it is in the file."""
    try:
        layout = expected_layout(ckpt.meta, ckpt.config(), describe)
    except CheckpointError as exc:
        raise CheckpointError(f"{ckpt.path}: {exc}") from None
    present = set(ckpt.datasets())
    found: Manifest = {}
    for path, want in layout.items():
        rows, values = rows_path(path), values_path(path)
        if not (path.startswith(f"{CLIENTS}/") and rows in present and values in present):
            found[path] = want
            continue
        k = ckpt.shape(rows)
        if len(k) != 1 or ckpt.shape(values) != (*k, *want[1:]):
            raise CheckpointError(f"{ckpt.path}: {rows} and {values} have shapes {k} and {ckpt.shape(values)}, "
                                  f"expected (k,) and (k, *{want[1:]})")
        found[rows], found[values] = k, (*k, *want[1:])
    return found


def expected_layout(meta: dict[str, Any], config: dict[str, Any], describe: Describe) -> Manifest:
    """Every dataset a checkpoint with ``meta`` (N, d, round) and resolved ``config`` holds, with its shape (a
    client entry as the whole ``[N, ...]`` dataset)."""
    n = int(meta["num_clients"])
    parts = describe(n, int(meta["dim"]), int(meta["round"]), config)
    layout = {f"{SERVER}/{name}": shape for name, shape in parts.server.items()}
    layout.update({f"{SCHEDULE}/{name}": shape for name, shape in parts.schedule.items()})
    layout.update({f"{CLIENTS}/{name}": (n, *row) for name, row in parts.clients.items()})
    layout.update({f"{HISTORY}/{name}": shape for name, shape in parts.history.items()})
    layout.update({f"{RANDOM}/seed": (), f"{RUNTIME}/strategy": (), f"{METRICS}/jsonl": ()})
    layout.update({f"{PRIVACY}/{name}": shape for name, shape in parts.privacy.items()})
    return layout
