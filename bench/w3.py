"""W3 (bench/README.md, "Workloads"): SCAFFOLD with a state vector per client, N = 1000, 5% participation.

    python bench/w3.py [--rounds 100] [--ranks 2]

Runs the workload uninterrupted with a checkpoint every 10 rounds, then again to rounds/2 and resumed
from that checkpoint to the end, and prints one JSON line: checkpoint size, write seconds (median and
range), resume read seconds, every rank's peak RSS against its data + model + client-state bytes, and
whether the resumed run's final checkpoint equals the uninterrupted one bit for bit.
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

import h5py
import numpy as np
import workloads
from fedrun_side import REPO, prepare


def train(args: list[str], ranks: int) -> None:
    launcher = [shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec", "-n", str(ranks)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    subprocess.run([*launcher, sys.executable, "-m", "fedrun", "train", "--quiet", *args], check=True, env=env,
                   cwd=REPO, stdout=sys.stderr)


def final_checkpoint(run_dir: Path) -> dict[str, np.ndarray]:
    with h5py.File(sorted(run_dir.glob("ckpt_*.h5"))[-1], "r") as f:
        return {f"{g}/{n}": f[g][n][()] for g in ("server", "clients") for n in f[g]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--ranks", type=int, default=2)
    args = p.parse_args()
    wl = workloads.get_workload("W1", rounds=args.rounds, eval_every=args.rounds)
    npz, trace = prepare(wl, "dirichlet")
    root = Path(tempfile.mkdtemp(prefix="fedrun_w3_"))
    common = [
        f"run.seed={workloads.MODEL_SEED}", "data.name=arrays", f"data.root={npz}", "data.partition=natural",
        f"data.num_clients={wl.num_clients}", "model.name=cnn_cifar10", f"local.steps={wl.local_steps}",
        f"local.batch_size={wl.local_batch}", f"local.lr={wl.local_lr}", "local.shuffle=false",
        "local.strategy=sequential", "participation.pattern=trace", f"participation.trace={trace}",
        "algorithm.name=scaffold", f"eval.every={args.rounds}", "checkpoint.every=10", "checkpoint.keep=2",
    ]
    whole, cut = root / "whole", root / "cut"
    train([*common, f"run.dir={whole}", f"run.rounds={args.rounds}"], args.ranks)
    train([*common, f"run.dir={cut}", f"run.rounds={args.rounds // 2}"], args.ranks)
    train([*common, f"run.dir={cut}", f"run.rounds={args.rounds}", "--resume", "auto"], args.ranks)
    runtime = json.loads((whole / "runtime.json").read_text())
    resumed = json.loads((cut / "runtime.json").read_text())
    a, b = final_checkpoint(whole), final_checkpoint(cut)
    identical = a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    writes = [c["write_s"] for c in runtime["checkpoints"]]
    example_bytes = 4 * int(np.prod(wl.input_shape))
    budgets = []
    for first, stop in runtime["blocks"]:
        clients = stop - first
        budgets.append((clients * wl.examples_per_client * example_bytes  # the rank's data
                        + runtime["dim"] * 4  # the model
                        + clients * runtime["dim"] * 4) / 2**20)  # SCAFFOLD's c_i rows
    print(json.dumps({
        "workload": "W3", "rounds": args.rounds, "ranks": args.ranks,
        "checkpoint_bytes": runtime["checkpoints"][-1]["bytes"],
        "checkpoint_write_s_median": statistics.median(writes), "checkpoint_write_s_range": [min(writes), max(writes)],
        "resume_read_s": resumed["resume_read_s"],
        "peak_rss_mib_per_rank": runtime["peak_rss_mib_per_rank"],
        "budget_mib_per_rank (data+model+client state)": [round(b, 1) for b in budgets],
        "rss_over_budget": [round(r / b, 2) for r, b in zip(runtime["peak_rss_mib_per_rank"], budgets, strict=True)],
        "resume_bit_identical": identical,
    }))
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
