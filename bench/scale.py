"""Cross-device scale (docs/scale.md): SCAFFOLD and FedSUM at N = 1,000,000 and N = 1,000 clients, side by side.

    python bench/scale.py [--rounds 20] [--ranks 2] [--cohort 100]

Synthetic(1, 1) of the FedProx paper generated per client on demand (``data.name=synthetic_fedprox``), an
MLP 60-1600-10 (d = 113,610), ``--cohort`` clients a round drawn uniformly, ``--ranks`` ranks, the client
state on disk (``state.store=disk``, the scratch directory under the system's temporary directory), a
checkpoint every 10 rounds (and at the end; from the second on they are increments, docs/checkpoint.md).
Prints one table: per-round time (median over rounds 2..), the last checkpoint's write seconds and bytes
(with the default 20 rounds: the increment of rounds 11-20), start-up (launch to the first round, imports
and MPI included), peak RSS per rank, the client state's bytes on disk per rank against the distinct rows
the run touched, and the ratios N = 10^6 over N = 10^3. Every file it writes is removed at the end.
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def mlp(input_shape: tuple[int, ...], num_classes: int):
    """60-1600-10 with ReLU: d = 60 x 1600 + 1600 + 1600 x 10 + 10 = 113,610 (model.name=bench.scale:mlp)."""
    import math

    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 1600), nn.ReLU(), nn.Linear(1600, num_classes))


def one_run(root: Path, algorithm: str, n: int, args: argparse.Namespace) -> dict:
    run_dir, scratch = root / f"{algorithm}_{n}", root / f"scratch_{algorithm}_{n}"
    cmd = [shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec", "-n", str(args.ranks),
           sys.executable, "-m", "fedrun", "train", "--quiet", f"run.dir={run_dir}", f"run.rounds={args.rounds}",
           "data.name=synthetic_fedprox", f"data.num_clients={n}", "data.synthetic_fedprox.alpha=1",
           "data.synthetic_fedprox.beta=1", "model.name=bench.scale:mlp", "local.steps=2", "local.batch_size=32",
           "local.lr=0.01", "local.strategy=sequential", "participation.pattern=uniform",
           f"participation.clients_per_round={args.cohort}", f"algorithm.name={algorithm}", "eval.every=0",
           "eval.clients=100", "checkpoint.every=10", "checkpoint.keep=1", "state.store=disk", f"state.dir={scratch}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=REPO, stdout=sys.stderr)
    total = time.perf_counter() - started
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    runtime = json.loads((run_dir / "runtime.json").read_text())
    walls = [r["wall_s"] for r in records]
    ckpt = runtime["checkpoints"][-1]
    touched = min(n, args.rounds * args.cohort)
    return {"s_round": statistics.median(walls[1:] or walls), "ckpt_s": ckpt["write_s"], "ckpt_bytes": ckpt["bytes"],
            "startup_s": total - sum(walls) - sum(c["write_s"] for c in runtime["checkpoints"]),
            "rss_mib": max(runtime["peak_rss_mib_per_rank"]),
            "disk_mib": max(runtime["client_state_disk_bytes_per_rank"]) / 2**20,
            "rows_touched_max": touched}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--cohort", type=int, default=100)
    p.add_argument("--algorithms", nargs="+", default=["scaffold", "fedsum"])
    p.add_argument("--sizes", nargs=2, type=int, default=[1_000, 1_000_000])
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fedrun_scale_"))
    small, large = args.sizes
    rows = []
    try:
        for algorithm in args.algorithms:
            a, b = one_run(root, algorithm, small, args), one_run(root, algorithm, large, args)
            rows.append((algorithm, a, b))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    head = (f"{'algorithm':<9} {'N':>9} {'s/round':>8} {'ckpt s':>7} {'ckpt MiB':>9} {'start-up s':>10} "
            f"{'peak RSS MiB':>12} {'state on disk MiB':>17} {'rows touched <=':>15}")
    print(f"rounds {args.rounds}, cohort {args.cohort}, {args.ranks} ranks, d = 113,610 (MLP 60-1600-10)")
    print(head)
    for algorithm, a, b in rows:
        for n, r in ((small, a), (large, b)):
            print(f"{algorithm:<9} {n:>9,} {r['s_round']:>8.3f} {r['ckpt_s']:>7.2f} {r['ckpt_bytes'] / 2**20:>9.1f} "
                  f"{r['startup_s']:>10.1f} {r['rss_mib']:>12.0f} {r['disk_mib']:>17.1f} {r['rows_touched_max']:>15,}")
        print(f"{algorithm:<9} {'ratio':>9} {b['s_round'] / a['s_round']:>7.2f}x {b['ckpt_s'] / a['ckpt_s']:>6.2f}x "
              f"{b['ckpt_bytes'] / a['ckpt_bytes']:>8.2f}x   (targets: s/round <= 1.25x, checkpoint <= 2x, "
              f"start-up < 30 s, RSS <= 2048 MiB)")


if __name__ == "__main__":
    main()
