"""Per-round metrics (``metrics.jsonl``), the resolved config, and the progress line (rank 0 only).

Metrics files are standard JSON: a non-finite number (a NaN loss) is written as ``null``."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO


def json_line(record: dict[str, Any]) -> str:
    """``record`` as one line of standard JSON (no ``NaN``/``Infinity`` tokens: non-finite numbers are null)."""
    clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
    return json.dumps(clean, allow_nan=False)


class MetricsLog:
    """``<run_dir>/metrics.jsonl``: one JSON object per round, kept equal to the run's records.

    The file is rewritten at the first :meth:`sync`, not before: a run that fails to start leaves an
    earlier run's metrics.jsonl alone; later syncs append the new records."""

    def __init__(self, run_dir: Path | None) -> None:
        self.path = None if run_dir is None else run_dir / "metrics.jsonl"
        self._written: int | None = None  # records in the file, None before the first sync

    def sync(self, records: list[dict[str, Any]]) -> None:
        """Make the file hold exactly ``records`` (a resumed run's checkpoint records, then one more per round)."""
        if self.path is None:
            return
        if self._written is None or self._written > len(records):
            self.path.write_text("".join(json_line(r) + "\n" for r in records))
        else:
            with self.path.open("a") as fh:
                fh.writelines(json_line(r) + "\n" for r in records[self._written:])
        self._written = len(records)


class Progress:
    """``round 12/100 | loss 0.5321 | acc 81.20% | 0.214 s/round | ETA 0:00:18``."""

    def __init__(self, total_rounds: int, every: int, stream: TextIO | None = None) -> None:
        self.total = total_rounds
        self.every = every
        self.stream = stream or sys.stdout
        self.start = time.perf_counter()
        self.done_here = 0

    def update(self, entry: dict[str, Any]) -> None:
        self.done_here += 1
        t = entry["round"]  # counts from 1
        if t % self.every and t != self.total and "test_accuracy" not in entry:
            return
        per_round = (time.perf_counter() - self.start) / self.done_here
        eta = per_round * (self.total - t)
        parts = [f"round {t}/{self.total}", f"loss {entry['train_loss']:.4f}"]
        if "test_accuracy" in entry:
            parts.append(f"test acc {100 * entry['test_accuracy']:.2f}%")
        elif "test_loss" in entry:
            parts.append(f"test loss {entry['test_loss']:.4g}")
        parts += [f"{per_round:.3f} s/round", f"ETA {_hms(eta)}"]
        print(" | ".join(parts), file=self.stream, flush=True)


def _hms(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
