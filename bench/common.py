"""Helpers shared by the bench systems (bare loop, Flower, pfl): threads, timing, the JSON result line.

Imports numpy and the standard library only at module level; torch is imported inside functions, so
this module works in every peer's virtual environment.

The result line every system prints (one line, JSON, on stdout, prefixed by nothing):

    {"system": str, "workload": "W1"|"W2", "partition": "dirichlet"|"iid", "rounds": int,
     "s_per_round_median": float, "s_per_round_min": float, "s_per_round_max": float,
     "total_s": float, "final_accuracy": float, ...extra keys...}

``s_per_round_*`` are over rounds 4..end (1-based; all rounds if there are fewer than 4); a round's time
includes the central evaluation when that round has one (every system evaluates on the same rounds).
``total_s`` is wall time from process start (before the heavy imports) to the end of the last round,
i.e. with start-up. A collector should take the LAST line of stdout that parses as JSON and has a
"system" key; the extra keys (round_times_s, accuracy_by_round, notes) are informational.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

PROCESS_START = time.perf_counter()  # as early as possible: importers should import this module first
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_thread() -> None:
    """OMP_NUM_THREADS=1 for this process and its children, and one torch thread."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    import torch

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or parallel work has started
        pass


def repo_root_on_path() -> str:
    if _REPO_ROOT not in sys.path:
        sys.path.insert(0, _REPO_ROOT)
    return _REPO_ROOT


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--workload", default="W1", choices=["W1", "W2"])
    p.add_argument("--partition", default="dirichlet", choices=["dirichlet", "iid"])
    p.add_argument("--rounds", type=int, default=None, help="override the workload's number of rounds")
    p.add_argument("--eval-every", type=int, default=None, help="override the workload's eval_every")
    return p


def overrides(args: argparse.Namespace) -> dict:
    out = {}
    if args.rounds is not None:
        out["rounds"] = args.rounds
    if args.eval_every is not None:
        out["eval_every"] = args.eval_every
    return out


def is_eval_round(rnd: int, rounds: int, eval_every: int) -> bool:
    """Central evaluation after round ``rnd`` (1-based): every ``eval_every`` rounds and after the last."""
    return rnd % eval_every == 0 or rnd == rounds


def summarize_round_times(round_times: list[float]) -> dict:
    steady = round_times[3:] if len(round_times) >= 4 else round_times
    return {
        "s_per_round_median": statistics.median(steady),
        "s_per_round_min": min(steady),
        "s_per_round_max": max(steady),
    }


def result_line(
    system: str, workload: str, partition: str, round_times: list[float], total_s: float,
    final_accuracy: float, accuracy_by_round: dict[int, float] | None = None, **extra,
) -> str:
    rec = {
        "system": system,
        "workload": workload,
        "partition": partition,
        "rounds": len(round_times),
        **summarize_round_times(round_times),
        "total_s": total_s,
        "final_accuracy": float(final_accuracy),
        "round_times_s": [round(t, 6) for t in round_times],
        "accuracy_by_round": {str(k): v for k, v in (accuracy_by_round or {}).items()},
        **extra,
    }
    return json.dumps(rec)


def evaluate(model, x, y, batch: int = 500) -> float:
    """Accuracy of ``model`` on numpy arrays ``x, y``."""
    import numpy as np
    import torch

    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(y), batch):
            xb = torch.from_numpy(np.array(x[i:i + batch]))
            pred = model(xb).argmax(1).numpy()
            correct += int((pred == np.asarray(y[i:i + batch])).sum())
    model.train()
    return correct / len(y)
