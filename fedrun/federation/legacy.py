"""The manifest of a checkpoint written before fedrun recorded one (``meta/manifest``, fedrun.checkpoint.manifest).

Such a file is checked as every file was then: the datasets it must hold are derived from its own meta (N,
d) and resolved config, as the snapshot wrote them: the algorithm's declaration (server entries ``[d]`` or
scalars, client entries ``[N, d]`` or ``[N]``, or a vector entry in the rows form), the schedule the config
runs (its state, and the client rows it holds uploads in), the delay tracker and, with privacy, the
accountant. Only old files pay for rebuilding the algorithm; a file with a manifest never comes here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedrun.algorithms import get_algorithm
from fedrun.checkpoint.format import rows_path, values_path
from fedrun.checkpoint.manifest import Manifest
from fedrun.checkpoint.reader import CheckpointReader
from fedrun.config import config_from_dict
from fedrun.errors import CheckpointError, ConfigError
from fedrun.federation.delay import DelayTracker
from fedrun.federation.schedule import schedule_type
from fedrun.privacy.mechanism import layout as privacy_layout
from fedrun.protocol import Scalar, Vector


def legacy_manifest(ckpt: CheckpointReader) -> Manifest:
    """The manifest ``ckpt`` would have: :func:`expected_layout` of its meta and config, a vector client entry
    stored in the rows form (``rows`` ``(k,)`` and ``values`` ``(k, d)``) as it is in the file."""
    try:
        layout = expected_layout(ckpt.meta, ckpt.config())
    except CheckpointError as exc:
        raise CheckpointError(f"{ckpt.path}: {exc}") from None
    present = set(ckpt.datasets())
    found: Manifest = {}
    for path, want in layout.items():
        rows, values = rows_path(path), values_path(path)
        if not (path.startswith("clients/") and rows in present and values in present):
            found[path] = want
            continue
        k = ckpt.shape(rows)
        if len(k) != 1 or ckpt.shape(values) != (*k, *want[1:]):
            raise CheckpointError(f"{ckpt.path}: {rows} and {values} have shapes {k} and {ckpt.shape(values)}, "
                                  f"expected (k,) and (k, *{want[1:]})")
        found[rows], found[values] = k, (*k, *want[1:])
    return found


def expected_layout(meta: dict[str, Any], config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every dataset a checkpoint with ``meta`` (N, d) and resolved ``config`` holds, with its shape (a client
    entry as the whole ``[N, ...]`` dataset)."""
    n, d = int(meta["num_clients"]), int(meta["dim"])
    try:
        cfg = config_from_dict(config)
    except ConfigError as exc:
        raise CheckpointError(f"meta/config is not a valid config ({exc})") from None
    decl = get_algorithm(cfg.algorithm.name)(cfg.algorithm.hparams).declare()

    def shape(entry: Vector | Scalar, rows: tuple[int, ...]) -> tuple[int, ...]:
        return (*rows, d) if isinstance(entry, Vector) else rows

    schedule = schedule_type(cfg)
    layout = {f"server/{e.name}": shape(e, ()) for e in decl.server}
    layout.update({f"schedule/{name}": want for name, want in schedule.layout(n).items()})
    clients = (*decl.client, *schedule.held_entries(decl.up))
    layout.update({f"clients/{e.name}": shape(e, (n,)) for e in clients})
    layout.update({f"history/{k}": np.shape(v) for k, v in DelayTracker(n).state_dict().items()})
    layout.update({"random/seed": (), "runtime/strategy": (), "metrics/jsonl": ()})
    if cfg.privacy.mode != "none":
        layout.update(privacy_layout(n, int(meta["round"])))
    return layout
