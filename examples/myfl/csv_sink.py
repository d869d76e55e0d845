"""A metrics sink: every round's record as a row of ``<run.dir>/rounds.csv``.

fedrun constructs it as ``CsvSink(run_dir)`` on every rank (``run_dir`` is None except on rank 0 of a run
that writes files) and calls its hooks after the built-in sinks. A resumed run repeats the rounds after
its checkpoint, so the first round it reports drops the rows from that round on.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from fedrun.metrics.observer import Observer

COLUMNS = ("round", "train_loss", "test_accuracy", "active_clients")


class CsvSink(Observer):
    def __init__(self, run_dir: Path | None) -> None:
        self.path = None if run_dir is None else Path(run_dir) / "rounds.csv"
        self.first = True

    def on_round_end(self, record: dict[str, Any], arrays: Any) -> None:
        if self.path is None:
            return
        if self.first:  # a fresh run, or a resume: keep the rows of the rounds before this one
            kept = []
            if self.path.exists():
                with self.path.open(newline="") as fh:
                    kept = [row for row in csv.DictReader(fh) if int(row["round"]) < record["round"]]
            with self.path.open("w", newline="") as fh:
                writer = csv.DictWriter(fh, COLUMNS)
                writer.writeheader()
                writer.writerows(kept)
            self.first = False
        with self.path.open("a", newline="") as fh:
            csv.writer(fh).writerow([record.get(column, "") for column in COLUMNS])
