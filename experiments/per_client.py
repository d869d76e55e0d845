"""Per-client distributions of FedAvg, SCAFFOLD and FedSUM on the embedded MNIST (docs/results_per_client.md).

    nice -n 10 .venv/bin/python experiments/per_client.py [--rounds 60] [--out docs/results/per_client]

50 clients (Dirichlet alpha = 0.3 labels), 20% of each client's examples held out as its test data,
participation ``biased`` (independent Bernoulli, p_i from 0.50 down to 0.30 by client id: the clients
with high ids take part less often), K = 10 local steps of batch 32, lr 0.05, CNN, seed 0, one process
per run. SCAFFOLD takes lr 0.02 (at 0.05 a client's update became non-finite in round 27 on this setup,
exit status 3). Personalization: 5 local steps from the global model (``eval.finetune_steps=5``). Writes
``fedrun report``'s tables and plots of the three runs and ``table.md`` (the last evaluation's per-client
statistics) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py

from fedrun.metrics.per_client import distribution
from fedrun.sweep.report import make_report

ALGORITHMS = ("fedavg", "scaffold", "fedsum")
COMMON = ["data.name=mnist5k", "data.num_clients=50", "data.partition=dirichlet", "data.alpha=0.3",
          "model.name=cnn_mnist", "local.steps=10", "local.batch_size=32", "local.lr=0.05",
          "local.strategy=sequential", "participation.pattern=biased", "data.client_test_fraction=0.2",
          "eval.finetune_steps=5", "run.seed=0"]
PER_ALGORITHM = {"scaffold": ["local.lr=0.02"]}  # diverged at 0.05 (round 27, non-finite upload)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--runs", default="runs/per_client")
    p.add_argument("--out", default="docs/results/per_client")
    args = p.parse_args()
    runs, out = Path(args.runs), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for algorithm in ALGORITHMS:
        run_dir = runs / algorithm
        if not (run_dir / "result.json").is_file():
            subprocess.run([sys.executable, "-m", "fedrun", "train", "--quiet", f"run.dir={run_dir}",
                            f"run.rounds={args.rounds}", f"eval.every={args.rounds // 6}",
                            f"algorithm.name={algorithm}", *COMMON, *PER_ALGORITHM.get(algorithm, [])], check=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    make_report(runs, out)
    lines = ["| algorithm | pooled test acc | client mean (weighted) | unweighted | std | p10 | p50 | p90 | "
             "worst 10% | fine-tuned mean | fine-tuned worst 10% |", "|---|" + "---:|" * 10]
    for algorithm in ALGORITHMS:
        run_dir = runs / algorithm
        result = json.loads((run_dir / "result.json").read_text())
        with h5py.File(run_dir / "clients.h5", "r") as f:
            counts = f["test_examples"][()]
            glob = distribution(f["accuracy"][-1], counts, True)
            tuned = distribution(f["finetuned_accuracy"][-1], counts, True)
        cells = [result["test_accuracy"], glob["mean"], glob["mean_unweighted"], glob["std"], glob["p10"],
                 glob["p50"], glob["p90"], glob["worst10"], tuned["mean"], tuned["worst10"]]
        lines.append(f"| {algorithm} | " + " | ".join(f"{100 * v:.1f}%" if i != 3 else f"{100 * v:.1f} pp"
                                                    for i, v in enumerate(cells)) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
