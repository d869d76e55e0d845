"""Gathered uploads on W1 (bench/README.md): a gathered round against a summed round, side by side.

    python bench/gathered.py [--rounds 12] [--reps 2] [--ranks 2]

W1 (the FedSUM CIFAR CNN, d = 250,218 floats, a cohort of 50 of 1000 clients per round) runs under
``fedrun train`` on 2 ranks with the same data, cohorts, batches and initial weights for every variant:

* ``fedavg``: the summed upload (each rank reduces one [d] sum);
* ``fedtrimmedavg beta=0``: the same arithmetic (the mean of the deltas) on GATHERED uploads: each rank
  writes its clients' rows into a [50, d] region and the reduce carries 50 x d floats; the rule sorts;
* ``fedmedian``, ``krum`` (f = 5, m = 1): the robust rules on the same gathered uploads.

The variants run interleaved, ``--reps`` times each. Printed: median s/round over rounds 4..end (the
median over repetitions, and its min-max), the ratio to fedavg measured in the same session, and rank
0's peak resident memory (runtime.json's ``peak_rss_mib_per_rank``) against fedavg's. Target
(issue 14): a gathered round costs at most 1.3x a summed round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import workloads
from fedrun_side import REPO, prepare

VARIANTS = {
    "fedavg (summed)": ["algorithm.name=fedavg"],
    "fedtrimmedavg beta=0 (gathered mean)": ["algorithm.name=fedtrimmedavg", "algorithm.beta=0"],
    "fedmedian (gathered)": ["algorithm.name=fedmedian"],
    "krum f=5 (gathered)": ["algorithm.name=krum", "algorithm.num_malicious=5"],
}


def run(variant: list[str], wl: workloads.Workload, ranks: int) -> tuple[float, float, float]:
    """One run: (median s/round over rounds 4..end, rank 0's peak RSS in MiB, final test accuracy)."""
    npz, trace = prepare(wl, "dirichlet")
    run_dir = Path(tempfile.mkdtemp(prefix="fedrun_gathered_"))
    cfg = [
        f"run.dir={run_dir}", f"run.rounds={wl.rounds}", f"run.seed={workloads.MODEL_SEED}", "data.name=arrays",
        f"data.root={npz}", "data.partition=natural", f"data.num_clients={wl.num_clients}", "model.name=cnn_cifar10",
        f"local.steps={wl.local_steps}", f"local.batch_size={wl.local_batch}", f"local.lr={wl.local_lr}",
        "local.shuffle=false", "local.strategy=channels_last", "participation.pattern=trace",
        f"participation.trace={trace}", f"eval.every={wl.rounds}", "checkpoint.every=0", *variant,
    ]
    launcher = [shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec", "-n", str(ranks)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    subprocess.run([*launcher, sys.executable, "-m", "fedrun", "train", "--quiet", *cfg], check=True, env=env,
                   cwd=REPO, stdout=sys.stderr)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    runtime = json.loads((run_dir / "runtime.json").read_text())
    shutil.rmtree(run_dir, ignore_errors=True)
    times = [r["wall_s"] for r in records[3:]] or [r["wall_s"] for r in records]
    return statistics.median(times), runtime["peak_rss_mib_per_rank"][0], records[-1]["test_accuracy"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--ranks", type=int, default=2)
    args = p.parse_args()
    wl = workloads.get_workload("W1", rounds=args.rounds)
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in VARIANTS}
    for rep in range(args.reps):
        for name, variant in VARIANTS.items():
            results[name].append(run(variant, wl, args.ranks))
            print(f"rep {rep + 1}: {name}: {results[name][-1][0]:.4f} s/round", file=sys.stderr, flush=True)
    base = statistics.median(r[0] for r in results["fedavg (summed)"])
    base_rss = statistics.median(r[1] for r in results["fedavg (summed)"])
    print(f"W1, {args.ranks} ranks, {args.rounds} rounds, {args.reps} repetitions interleaved\n")
    print("| variant | median s/round | min-max | ratio to fedavg | rank 0 peak RSS MiB | vs fedavg | final acc |")
    print("|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        times = [r[0] for r in runs]
        rss = statistics.median(r[1] for r in runs)
        median = statistics.median(times)
        print(f"| {name} | {median:.4f} | {min(times):.4f}-{max(times):.4f} | {median / base:.2f} | {rss:.0f} | "
              f"{rss - base_rss:+.0f} | {runs[-1][2]:.3f} |")


if __name__ == "__main__":
    main()
