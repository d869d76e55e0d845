"""Per-client evaluation results: their distribution over clients, and ``clients.h5`` in the run directory.

For one evaluation with per-client accuracies a_i (or losses l_i) on m_i test examples each, over the
clients with m_i > 0:

    mean             sum_i m_i a_i / sum_i m_i        (example-weighted: the accuracy over all their examples)
    mean_unweighted  (1/n) sum_i a_i                  (every client counts once)
    std              sqrt((1/n) sum_i (a_i - mean_unweighted)^2)
    p10, p50, p90    percentiles over clients (linear interpolation, numpy's default)
    worst10          mean over the ceil(n / 10) worst clients (lowest accuracy, highest loss)

``clients.h5`` layout (one row per evaluation, appended as the run goes; docs/evaluation.md):

    round                    int64 [E]      the evaluation's round r (counts from 1)
    client                   int64 [S]      the evaluated clients' ids (all N, or the eval.clients sample)
    test_examples            int64 [S]      m_i
    accuracy, loss           float64 [E, S] the global model's per-client figures (NaN where m_i = 0)
    finetuned_accuracy, finetuned_loss      the same after eval.finetune_steps local steps (when > 0)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from fedrun.metrics.observer import Arrays, Observer

STATS = ("mean", "mean_unweighted", "std", "p10", "p50", "p90", "worst10")


def distribution(values: np.ndarray, weights: np.ndarray, higher_is_better: bool) -> dict[str, float]:
    """The statistics of :data:`STATS` of per-client ``values`` (clients with ``weights`` > 0 only)."""
    keep = weights > 0
    v, w = values[keep].astype(np.float64), weights[keep].astype(np.float64)
    if not len(v):
        return {}
    worst = np.sort(v) if higher_is_better else -np.sort(-v)
    p10, p50, p90 = np.percentile(v, [10, 50, 90])
    return {"mean": float((w * v).sum() / w.sum()), "mean_unweighted": float(v.mean()), "std": float(v.std()),
            "p10": float(p10), "p50": float(p50), "p90": float(p90),
            "worst10": float(worst[:math.ceil(len(v) / 10)].mean())}


def summary(arrays: dict[str, np.ndarray], counts: np.ndarray) -> dict[str, float]:
    """Metrics-record fields ``client_accuracy_mean``, ``finetuned_loss_p90``, ... of one evaluation's
    per-client ``arrays`` (keys of the clients.h5 layout)."""
    out = {}
    for name, values in arrays.items():
        prefix = "finetuned" if name.startswith("finetuned_") else "client"
        kind = name.removeprefix("finetuned_")
        for stat, value in distribution(values, counts, kind == "accuracy").items():
            out[f"{prefix}_{kind}_{stat}"] = value
    return out


class ClientMetricsFile(Observer):
    """``<run_dir>/clients.h5``: the per-client arrays of every evaluation (rank 0 writes it; an observer of
    the rounds, :mod:`fedrun.metrics.observer`).

    Like metrics.jsonl it is rewritten at the first append of a new run; a resumed run first drops the
    evaluations after its checkpoint's round (a killed run may have written them), so the file holds
    each evaluated round once."""

    def __init__(self, run_dir: Path | None, ids: np.ndarray, counts: np.ndarray, resumed_round: int | None) -> None:
        self.path = None if run_dir is None else run_dir / "clients.h5"
        self.ids, self.counts = ids, counts
        self.resumed_round = resumed_round  # None: a new run
        self._started = False

    def on_round_end(self, record: dict[str, Any], arrays: Arrays) -> None:
        if arrays:
            self.append(record["round"], arrays)

    def append(self, round_: int, arrays: dict[str, np.ndarray]) -> None:
        if self.path is None:
            return
        fresh = not self._started and (self.resumed_round is None or not self.path.exists())
        with h5py.File(self.path, "w" if fresh else "a") as f:
            if fresh:
                f.create_dataset("round", shape=(0,), maxshape=(None,), dtype=np.int64)
                f.create_dataset("client", data=self.ids.astype(np.int64))
                f.create_dataset("test_examples", data=self.counts.astype(np.int64))
            elif not self._started:
                keep = int((f["round"][()] <= self.resumed_round).sum())
                for name in ("round", *arrays):
                    if name in f:
                        f[name].resize(keep, axis=0)
            self._started = True
            rows = f["round"].shape[0]
            f["round"].resize(rows + 1, axis=0)
            f["round"][rows] = round_
            for name, values in arrays.items():
                if name not in f:
                    f.create_dataset(name, shape=(rows, len(values)), maxshape=(None, len(values)),
                                     dtype=np.float64, fillvalue=np.nan)
                f[name].resize(rows + 1, axis=0)
                f[name][rows] = values
