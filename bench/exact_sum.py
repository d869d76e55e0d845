"""The exact sum's cost per round against the float sum it replaced, on W1's and W2's upload shapes.

    .venv/bin/python bench/exact_sum.py [--repeats 20]

One process, one thread, no collective (bench/run.py measures whole rounds on 1 and 2 ranks side by side
with a baseline checkout): per rank and round, the float path summed a rank's C uploads ``[C, d]`` with
``sum(dim=0)``; the exact path takes the exponents, encodes the C rows into float64 limbs and decodes the
total once (fedrun/runtime/exact_sum.py). Timed in turns, best of ``--repeats``; float32 uploads.
"""

from __future__ import annotations

import argparse
import time

import torch
import workloads

from fedrun.models import build_model
from fedrun.runtime import exact_sum


def best(fn, repeats: int) -> float:
    out = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - start)
    return out


def exact(rows: torch.Tensor, terms: int) -> torch.Tensor:
    exps = exact_sum.exponents(rows)
    return exact_sum.decode(exact_sum.encode_sum(rows, exps, terms), exps, terms, rows.dtype)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(1)
    print("| workload | d | clients per rank | float sum ms | exact sum ms | difference ms |")
    print("|---|---|---|---|---|---|")
    for name in ("W1", "W2"):
        wl = workloads.get_workload(name)
        model = {"cifar10_cnn": "cnn_cifar10", "logistic": "logistic"}[wl.model]
        dim = sum(q.numel() for q in build_model(model, wl.input_shape, wl.num_classes).parameters())
        for ranks in (1, 2):
            rows = torch.randn(wl.cohort // ranks, dim) * 1e-2
            fast, slow = float("inf"), float("inf")
            for _ in range(3):  # in turns
                fast = min(fast, best(lambda r=rows: r.sum(dim=0), args.repeats))
                slow = min(slow, best(lambda r=rows, n=wl.cohort: exact(r, n), args.repeats))
            print(f"| {name} | {dim} | {len(rows)} | {fast * 1e3:.2f} | {slow * 1e3:.2f} | "
                  f"{(slow - fast) * 1e3:.2f} |")


if __name__ == "__main__":
    main()
