"""Per-round metrics (``metrics.jsonl``) and the progress line, rank 0's first and last observers of a round
(:mod:`fedrun.metrics.observer`).

Metrics files are standard JSON: a non-finite number (a NaN loss) is written as ``null``."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from fedrun.errors import writing
from fedrun.metrics.observer import Arrays, Observer
from fedrun.runtime.signals import StopSignals, shown


def standard(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, Inf) replaced by None, recursively: standard JSON has no
    NaN or Infinity, and readers other than Python's (jq, JavaScript, pandas' strict mode) refuse them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: standard(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [standard(v) for v in value]
    return value


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"local": {"lr": 0.1}}`` -> ``{"local.lr": 0.1}`` (lists are values): a config or provenance record
    as the dotted keys that overrides, the resume policy and MLflow's parameters and tags use."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def json_line(record: dict[str, Any]) -> str:
    """One record as a line of standard JSON (non-finite numbers are null)."""
    return json.dumps(standard(record), allow_nan=False) + "\n"


class MetricsLog(Observer):
    """``<run_dir>/metrics.jsonl``: one JSON object per round, kept equal to the run's ``records`` (the run
    state's list, which the loop extends by one record a round).

    The file is rewritten at the first :meth:`sync`, not before: a run that fails to start leaves an
    earlier run's metrics.jsonl alone; later syncs append the new records."""

    def __init__(self, run_dir: Path | None, records: list[dict[str, Any]]) -> None:
        self.path = None if run_dir is None else run_dir / "metrics.jsonl"
        self.records = records
        self._written: int | None = None  # records in the file, None before the first sync

    def sync(self) -> None:
        """Make the file hold exactly the records (a resumed run's checkpoint records, then one more per round)."""
        if self.path is None:
            return
        records = self.records
        with writing(self.path):
            if self._written is None or self._written > len(records):
                self.path.write_text("".join(map(json_line, records)))
            else:
                with self.path.open("a") as fh:
                    fh.writelines(map(json_line, records[self._written:]))
        self._written = len(records)

    def on_round_end(self, record: dict[str, Any], arrays: Arrays) -> None:
        self.sync()


class Progress(Observer):
    """``round 12/100 | loss 0.5321 | acc 81.20% | 0.214 s/round | ETA 0:00:18`` every ``every`` rounds, at
    an evaluation and after the last round; a closed stdout is a stop request (:func:`shown`)."""

    def __init__(self, total_rounds: int, every: int, signals: StopSignals, stream: TextIO | None = None) -> None:
        self.total = total_rounds
        self.every = every
        self.signals = signals
        self.stream = stream or sys.stdout
        self.start = time.perf_counter()
        self.done_here = 0

    def on_round_end(self, record: dict[str, Any], arrays: Arrays) -> None:
        shown(self.signals, self.update, record)

    def update(self, entry: dict[str, Any]) -> None:
        self.done_here += 1
        t = entry["round"]  # counts from 1
        if t % self.every and t != self.total and "test_accuracy" not in entry:
            return
        per_round = (time.perf_counter() - self.start) / self.done_here
        eta = per_round * (self.total - t)
        parts = [f"round {t}/{self.total}", f"loss {number(entry['train_loss'])}"]
        if "test_accuracy" in entry:
            parts.append(f"test acc {100 * entry['test_accuracy']:.2f}%")
        elif "test_loss" in entry:
            parts.append(f"test loss {number(entry['test_loss'])}")
        if "epsilon" in entry:  # a private run: the privacy spent so far
            eps = entry["epsilon"]
            parts.append(f"epsilon {'inf' if eps is None or not math.isfinite(eps) else f'{eps:.4g}'}")
        parts += [f"{per_round:.3f} s/round", f"ETA {_hms(eta)}"]
        print(" | ".join(parts), file=self.stream, flush=True)


def number(value: float | None) -> str:
    """A loss for the progress line: 4 decimals in the usual range, else 4 significant digits with an
    exponent (``1.2e+296``, not a 300-digit integer); ``inf``, ``nan``; ``-`` for None."""
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.4f}" if value == 0 or 1e-3 <= abs(value) < 1e6 else f"{value:.4g}"


def _hms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
