"""``fedrun compare RUN_A RUN_B``: where two runs part.

Every round's metrics record carries the ``fingerprint`` of the server state (a digest of each entry's
exact bits, x among them; fedrun/metrics/fingerprint.py). The comparison reads both run directories and
prints

* the configs' differences (``config.yaml``; ``run.dir`` and ``run.name`` left out: they name the runs),
* the first round whose fingerprints differ, and which entries,
* for the newest checkpoint round both runs have: every server and client dataset that differs, with
  its largest absolute difference and that relative to the dataset's largest magnitude.

Exit status 0 when the runs are identical (the same rounds, fingerprints and checkpointed state), 1 when they
differ, 2 for bad input (one line). Runs of different lengths whose common rounds agree are reported as such
("identical through round 17"): one is a prefix of the other (a run cut short, or one still going); a run
whose directory is locked by a live process is marked as still in progress. The configs are information only:
a run resumed with an accepted change or on another number of ranks may still be identical.
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fedrun.checkpoint import checkpoint_round, list_checkpoints
from fedrun.checkpoint.chain import Chain
from fedrun.checkpoint.format import CLIENTS, SERVER
from fedrun.errors import DataError
from fedrun.metrics.log import flatten

NAMING = ("run.dir", "run.name")  # config keys that differ between any two runs


def compare_runs(a: Path, b: Path) -> tuple[list[str], bool]:
    """The report's lines and whether the runs are identical."""
    records = {run: _records(run) for run in (a, b)}
    lines = [f"config: {line}" for line in _config_diff(_config(a), _config(b))]
    identical = True
    ra, rb = records[a], records[b]
    for run in (a, b):
        if in_progress(run):
            lines.append(f"{run}: still in progress (a live run holds {run / '.lock'}); compared as far as it got")
    if len(ra) != len(rb):
        identical = False
        lines.append(f"rounds: {a} has {len(ra)}, {b} has {len(rb)}")
    first = next(((x, y) for x, y in zip(ra, rb, strict=False) if x.get("fingerprint") != y.get("fingerprint")),
                 None)
    if first is not None:
        identical = False
        fa, fb = first[0].get("fingerprint") or {}, first[1].get("fingerprint") or {}
        entries = sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))
        lines.append(f"first difference: round {first[0]['round']}: {', '.join(entries)}")
    rounds = [{checkpoint_round(p) for p in list_checkpoints(run)} for run in (a, b)]
    common = sorted(rounds[0] & rounds[1])
    if common:
        differ = _state_diff(_checkpoint(a, common[-1]), _checkpoint(b, common[-1]))
        identical = identical and not differ
        lines.append(f"checkpoint after round {common[-1]}: "
                     + (f"{len(differ)} dataset(s) differ" if differ else "every dataset identical"))
        lines += [f"  {line}" for line in differ]
    common_rounds = min(len(ra), len(rb))
    if identical:
        lines.append("identical")
    elif first is None and len(ra) != len(rb) and common_rounds and not (common and differ):
        shorter = a if len(ra) < len(rb) else b
        through = (ra if len(ra) < len(rb) else rb)[-1].get("round", common_rounds)
        lines.append(f"identical through round {through}: {shorter} is a prefix of the other run "
                     f"({max(len(ra), len(rb))} rounds)")
    else:
        lines.append("the runs differ")
    return lines, identical


def in_progress(run: Path) -> bool:
    """Whether a live fedrun run holds ``run/.lock`` (fedrun.api.lock_run_dir)."""
    lock = run / ".lock"
    if not lock.is_file():
        return False
    try:
        with open(lock) as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def _records(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise DataError(f"{run}: not a run directory (expected {path.name} in it)")
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: expected one JSON object per line ({exc})") from None


def _config(run: Path) -> dict[str, Any]:
    path = run / "config.yaml"
    if not path.is_file():
        return {}
    try:
        return flatten(yaml.safe_load(path.read_text()) or {})
    except yaml.YAMLError as exc:
        raise DataError(f"{path}: not YAML ({str(exc).splitlines()[0]})") from None


def _config_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    keys = sorted(k for k in a.keys() | b.keys() if k not in NAMING and a.get(k, "<unset>") != b.get(k, "<unset>"))
    return [f"{k}: {a.get(k, '<unset>')} -> {b.get(k, '<unset>')}" for k in keys]


def _checkpoint(run: Path, round_: int) -> dict[str, np.ndarray]:
    path = next(p for p in list_checkpoints(run) if checkpoint_round(p) == round_)
    with Chain(path) as chain:  # a client entry of an increment: its chain's state (rows no link stores: NaN)
        r = chain.head
        state = {f"{SERVER}/{name}": np.asarray(r.read(f"{SERVER}/{name}")) for name in r.names(SERVER)}
        clients = r.names(CLIENTS) if CLIENTS in r.names() else []
        state.update({f"{CLIENTS}/{name}": chain.whole(f"{CLIENTS}/{name}") for name in clients})
        return state


def _state_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    """One line per dataset that is missing from one side, shaped differently, or differs in any bit."""
    lines = []
    for key in sorted(a.keys() | b.keys()):
        if key not in a or key not in b:
            lines.append(f"{key}: only in {'the first' if key in a else 'the second'} run")
        elif a[key].dtype != b[key].dtype or a[key].shape != b[key].shape:
            lines.append(f"{key}: {a[key].dtype}{list(a[key].shape)} vs {b[key].dtype}{list(b[key].shape)}")
        elif a[key].tobytes() != b[key].tobytes():
            x, y = a[key].astype(np.float64), b[key].astype(np.float64)
            diff = float(np.nanmax(np.abs(x - y))) if x.size else 0.0
            scale = float(np.nanmax(np.abs(x))) if x.size else 0.0
            rel = f", relative {diff / scale:.3g}" if scale > 0 else ""
            lines.append(f"{key}: max |diff| {diff:.3g}{rel} ({int(np.sum(x != y))} of {x.size} values)")
    return lines
