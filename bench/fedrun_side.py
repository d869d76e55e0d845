"""fedrun on a benchmark workload, printing the same JSON result line as the other systems.

    python bench/fedrun_side.py --workload W1 --ranks 2 [--strategy auto|fastest|sequential|channels_last|vmap|batched]

The workload's arrays go to fedrun as an ``arrays`` .npz (clients = the ``groups`` natural partition),
the shared cohort schedule as a participation trace, batches in stored order (``local.shuffle=false``)
and the model seeded with ``workloads.MODEL_SEED``: fedrun does the same arithmetic as the bare loop.
Per-round times are fedrun's own ``wall_s`` records (rounds 4..end, evaluation rounds included).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import workloads
from common import base_parser, overrides, result_line

REPO = Path(__file__).resolve().parents[1]


def prepare(wl: workloads.Workload, partition: str) -> tuple[Path, Path]:
    """The workload as a directory of .npy arrays (memory-mapped by fedrun, so each rank reads only its
    clients' rows) and its cohort schedule as a boolean [T, N] trace (cached)."""
    import numpy as np

    tag = f"fedrun_{wl.name}_{partition}_{wl.rounds}_{wl.cohort}"
    arrays, trace = workloads.CACHE_DIR / tag, workloads.CACHE_DIR / f"{tag}_trace.npy"
    if not trace.exists():
        arrays.mkdir(parents=True, exist_ok=True)
        for name, value in workloads.load_arrays(wl, partition).items():
            np.save(arrays / f"{name}.npy", value)
        np.save(arrays / "groups.npy", np.repeat(np.arange(wl.num_clients), wl.examples_per_client))
        active = np.zeros((wl.rounds, wl.num_clients), dtype=bool)
        np.put_along_axis(active, workloads.cohort_schedule(wl), True, axis=1)
        np.save(trace, active)
    return arrays, trace


def fedrun_overrides(wl: workloads.Workload, arrays: Path, trace: Path, strategy: str) -> list[str]:
    """The ``section.key=value`` settings of fedrun's run of ``wl`` (run.dir aside): the workload's arrays as a
    natural partition, its cohort trace, batches in stored order, the shared model seed."""
    model = {"cifar10_cnn": "cnn_cifar10", "logistic": "logistic"}[wl.model]
    return [
        f"run.rounds={wl.rounds}", f"run.seed={workloads.MODEL_SEED}", "data.name=arrays", f"data.root={arrays}",
        "data.partition=natural", f"data.num_clients={wl.num_clients}", f"model.name={model}",
        f"local.steps={wl.local_steps}", f"local.batch_size={wl.local_batch}", f"local.lr={wl.local_lr}",
        "local.shuffle=false", f"local.strategy={strategy}", "participation.pattern=trace",
        f"participation.trace={trace}", f"algorithm.global_lr={wl.server_lr}", f"eval.every={wl.eval_every}",
        "checkpoint.every=0",
    ]


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--strategy", default="auto",
                   choices=["auto", "fastest", "sequential", "channels_last", "vmap", "batched"])
    args = p.parse_args()
    wl = workloads.get_workload(args.workload, **overrides(args))
    npz, trace = prepare(wl, args.partition)
    run_dir = Path(tempfile.mkdtemp(prefix="fedrun_bench_"))
    cfg = [f"run.dir={run_dir}", *fedrun_overrides(wl, npz, trace, args.strategy)]
    launcher = [] if args.ranks == 1 else [shutil.which("mpiexec", path=str(Path(sys.executable).parent))
                                           or "mpiexec", "-n", str(args.ranks)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    subprocess.run([*launcher, sys.executable, "-m", "fedrun", "train", "--quiet", *cfg], check=True, env=env,
                   cwd=REPO, stdout=sys.stderr)
    total = time.perf_counter() - start
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    accuracy = {r["round"]: r["test_accuracy"] for r in records if "test_accuracy" in r}
    runtime = json.loads((run_dir / "runtime.json").read_text())  # what auto chose
    print(result_line(f"fedrun-{args.ranks}rank", wl.name, args.partition, [r["wall_s"] for r in records], total,
                      accuracy[max(accuracy)], accuracy, strategy=runtime["local_strategy"],
                      placement=runtime["placement"]))
    shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
