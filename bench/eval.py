"""Per-client evaluation against a pooled evaluation, and its split over ranks (docs/evaluation.md).

    .venv/bin/python bench/eval.py [--workload W1] [--repeats 3]

W1 data (1000 clients x 50 examples, the CIFAR-10-shaped CNN) with ``data.client_test_fraction=0.2``:
10 test examples per client, 10,000 in all, ``eval.batch_size=1000``. Printed side by side in one run:

1. per-client evaluation of all N clients (``ClientEval.evaluate``: the fixed batches, the reduce, rank 0's
   per-client sums and statistics) against a pooled evaluation of the same 10,000 examples
   (``evaluate_examples``, what ``test_accuracy`` costs before its exact sum), in this process, timed in turns (best of
   ``--repeats``); target <= 1.3x;
2. the per-client evaluation on 2 ranks against 1 rank (``mpiexec``, the slowest rank's time from a
   barrier to the end of the reduce, best of ``--repeats``); target <= 0.6x.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import workloads  # noqa: E402
from fedrun_side import prepare  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def setup_for(workload: str):
    """The built run (no training) of the workload with per-client test data, on this process's world."""
    from fedrun.config import load_config
    from fedrun.federation.build import build
    from fedrun.runtime.world import init_world

    wl = workloads.get_workload(workload)
    arrays, _ = prepare(wl, "dirichlet")
    model = {"cifar10_cnn": "cnn_cifar10", "logistic": "logistic"}[wl.model]
    cfg = load_config(None, ["data.name=arrays", f"data.root={arrays}", "data.partition=natural",
                             f"data.num_clients={wl.num_clients}", f"model.name={model}", "run.device=cpu",
                             "local.strategy=sequential", "data.client_test_fraction=0.2", "eval.batch_size=1000",
                             "run.placement=blocks"])
    world = init_world("cpu")
    setup, state = build(cfg, world, None)
    return setup, state, world


def time_client_eval(setup, state, world) -> float:
    x = setup.exchange.global_model()
    world.barrier()
    start = time.perf_counter()
    setup.client_eval.evaluate(x, 0, state.strategy)
    return time.perf_counter() - start


def worker(args: argparse.Namespace) -> None:
    """One rank of the ranks comparison: prints the slowest rank's best time (rank 0)."""
    import torch

    torch.set_num_threads(1)
    setup, state, world = setup_for(args.workload)
    best = min(max(world.allgather_object(time_client_eval(setup, state, world))) for _ in range(args.repeats))
    if world.is_root:
        print(f"RESULT {best:.6f}", flush=True)
    world.close()


def on_ranks(ranks: int, args: argparse.Namespace) -> float:
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
    out = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, __file__, "--worker", "--workload",
                          args.workload, "--repeats", str(args.repeats)], capture_output=True, text=True,
                         check=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("RESULT")))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="W1", choices=["W1", "W2"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    import torch

    from fedrun.training.evaluate import evaluate_examples

    torch.set_num_threads(1)
    setup, state, world = setup_for(args.workload)
    ce, x = setup.client_eval, setup.exchange.global_model()
    test_x, test_y = (torch.from_numpy(a).to(x.device) for a in ce.source.load_test(ce.ids))  # the same examples
    test_x = test_x.to(x.dtype) if test_x.is_floating_point() else test_x
    pooled, per_client = float("inf"), float("inf")
    for _ in range(args.repeats):  # in turns, so that load on the machine hits both alike
        start = time.perf_counter()
        learner = setup.learner
        evaluate_examples(learner.model, learner.loss_fn, x, test_x, test_y, setup.cfg.eval.batch_size)
        pooled = min(pooled, time.perf_counter() - start)
        per_client = min(per_client, time_client_eval(setup, state, world))
    world.close()
    one, two = on_ranks(1, args), on_ranks(2, args)
    print(f"workload {args.workload}: {ce.num_clients} clients, {ce.total} test examples, eval.batch_size "
          f"{setup.cfg.eval.batch_size}, best of {args.repeats}, one thread per rank")
    print("| measurement | seconds | ratio | target |")
    print("|---|---:|---:|---|")
    print(f"| pooled evaluation of the same examples (1 rank) | {pooled:.3f} | 1.00 | |")
    ratio = per_client / pooled
    print(f"| per-client evaluation of all N clients (1 rank) | {per_client:.3f} | {ratio:.2f} | <= 1.3 |")
    print(f"| per-client evaluation, 1 rank (mpiexec) | {one:.3f} | 1.00 | |")
    print(f"| per-client evaluation, 2 ranks (mpiexec) | {two:.3f} | {two / one:.2f} | <= 0.6 |")


if __name__ == "__main__":
    main()
