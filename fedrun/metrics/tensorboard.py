"""TensorBoard event files (``metrics.tensorboard: true``) under ``<run_dir>/tensorboard``, rank 0 only.

Every numeric field of a metrics.jsonl record becomes a scalar (tag = the field name, step = the round r,
counting from 1), and each per-client array of an evaluation a histogram (``clients/<name>``). Events are
written with the ``tensorboard`` package's own writer (``pip install fedrun[tensorboard]``; ``make``
installs it). A resumed run starts its event file with TensorBoard's purge marker at its first round, so
readers drop what an interrupted run wrote for the rounds it redoes: no step appears twice.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from fedrun.errors import ConfigError
from fedrun.metrics.observer import Arrays, Observer


class TensorBoardLog(Observer):
    def __init__(self, run_dir: Path | None, first_round: int) -> None:
        """``first_round``: the first round (from 1) this process writes."""
        self.writer = None
        if run_dir is None:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("metrics.tensorboard: expected the tensorboard package to be installed "
                              "(pip install 'fedrun[tensorboard]'), or metrics.tensorboard=false") from None
        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=first_round)

    def on_round_end(self, entry: dict[str, Any], arrays: Arrays) -> None:
        if self.writer is None:
            return
        step = int(entry["round"])
        for key, value in entry.items():
            if key != "round" and isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(key, value, step)
        for name, values in (arrays or {}).items():
            finite = values[np.isfinite(values)]
            if len(finite):
                self.writer.add_histogram(f"clients/{name}", finite, step)
        self.writer.flush()

    def on_stop(self, finished: bool) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
