"""Central differential privacy on W1 (bench/README.md): a DP round against a plain FedAvg round, side by side.

    python bench/privacy.py [--rounds 12] [--reps 2] [--ranks 2]

W1 (the FedSUM CIFAR CNN, d = 250,218 floats, 50 of 1000 clients per round from the shared cohort trace) runs
under ``fedrun train`` with the same data, cohorts, batches and initial weights for every variant
(:func:`gathered.run`):

* ``fedavg``: no privacy;
* ``fedavg + central DP``: every upload clipped to C = 1 on its rank, N(0, sigma^2 C^2) added once to the sum
  on rank 0, epsilon accounted every round (the trace pattern: no amplification, the worst client's
  composition; docs/privacy.md);
* ``fedavg + central DP, adaptive clip``: the same with adaptive clipping to the median upload norm (one
  more small reduce and broadcast a round).

The variants run interleaved, ``--reps`` times each. Printed: median s/round over rounds 4..end (the median
over repetitions, and its min-max) and the ratio to fedavg measured in the same session. Target (issue 32):
W1 with central DP within 1.05x of W1 without.

On a loaded machine two whole runs differ by more than what DP adds, so the script also times that work
alone, in this process, on W1's shapes (:func:`added_work`): the joint clip of a rank's 25 uploads of d
floats, rank 0's noise on the [d] sum, and the accountant's round (record + epsilon, the trace pattern's
unamplified composition over N = 1000 clients); their sum over the plain round's median is the cost ratio
the whole runs cannot resolve.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch
import workloads
from gathered import run

from fedrun.privacy.accountant import Accountant
from fedrun.privacy.mechanism import clip_uploads, gaussian_like, generator

W1_DIM = 250_218  # the FedSUM CIFAR CNN

DP = ["privacy.mode=central", "privacy.noise_multiplier=1.0", "privacy.clip=1.0"]
VARIANTS = {
    "fedavg": ["algorithm.name=fedavg"],
    "fedavg + central DP": ["algorithm.name=fedavg", *DP],
    "fedavg + central DP, adaptive clip": ["algorithm.name=fedavg", *DP, "privacy.adaptive_quantile=0.5"],
}


def added_work(ranks: int, reps: int = 20) -> dict[str, float]:
    """Seconds per round of what central DP adds on W1 (median of ``reps``): one rank's clip, rank 0's noise,
    the accountant's round."""
    torch.set_num_threads(1)
    up = {"delta": torch.randn(50 // ranks, W1_DIM)}
    total = {"delta": torch.zeros(W1_DIM)}
    acc = Accountant("rdp", 1e-5, "none", 1000, 50, 1.0)
    rng = np.random.default_rng(0)

    def timed(fn) -> float:
        out = []
        for t in range(reps):
            started = time.perf_counter()
            fn(t)
            out.append(time.perf_counter() - started)
        return statistics.median(out)

    def account(t: int) -> None:
        acc.record(1.0, rng.choice(1000, 50, replace=False))
        acc.epsilon()

    return {"clip (one rank)": timed(lambda t: clip_uploads(up, ["delta"], 1.0)),
            "noise (rank 0)": timed(lambda t: gaussian_like(total, ["delta"], 1.0, generator(torch.device("cpu"), 0,
                                                                                              t, 1))),
            "accountant": timed(account)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--ranks", type=int, default=2)
    args = p.parse_args()
    wl = workloads.get_workload("W1", rounds=args.rounds)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for rep in range(args.reps):
        for name, variant in VARIANTS.items():
            times[name].append(run(variant, wl, args.ranks)[0])
            print(f"rep {rep + 1}: {name}: {times[name][-1]:.4f} s/round", file=sys.stderr, flush=True)
    base = statistics.median(times["fedavg"])
    print(f"W1, {args.ranks} ranks, {args.rounds} rounds, {args.reps} repetitions interleaved\n")
    print("| variant | median s/round | min-max | ratio to fedavg |")
    print("|---|---|---|---|")
    for name, t in times.items():
        median = statistics.median(t)
        print(f"| {name} | {median:.4f} | {min(t):.4f}-{max(t):.4f} | {median / base:.3f} |")
    parts = added_work(args.ranks)
    print("\n| what central DP adds per round | seconds |\n|---|---|")
    for name, seconds in parts.items():
        print(f"| {name} | {seconds:.5f} |")
    added = sum(parts.values())
    print(f"| total | {added:.5f} |\n\nadded work / plain round: {added:.4f} / {base:.4f} s -> ratio "
          f"{(base + added) / base:.4f} (target <= 1.05)")


if __name__ == "__main__":
    main()
