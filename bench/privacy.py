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
"""

from __future__ import annotations

import argparse
import statistics
import sys

import workloads
from gathered import run

DP = ["privacy.mode=central", "privacy.noise_multiplier=1.0", "privacy.clip=1.0"]
VARIANTS = {
    "fedavg": ["algorithm.name=fedavg"],
    "fedavg + central DP": ["algorithm.name=fedavg", *DP],
    "fedavg + central DP, adaptive clip": ["algorithm.name=fedavg", *DP, "privacy.adaptive_quantile=0.5"],
}


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


if __name__ == "__main__":
    main()
