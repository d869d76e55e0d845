"""The classes-first cross-entropy (fedrun/training/classes_first.py) against F.cross_entropy, on W2's shapes.

    .venv/bin/python bench/cross_entropy.py [--repeats 40]

First which (dtype, classes) pass the kernel's self-check under each of PyTorch's CPU kernel families
(``ATEN_CPU_CAPABILITY``, one child process each; a family the CPU lacks falls back to the best it has, as
the header line says). Then, one process, one thread, the two kernels in turns: CPU seconds (less disturbed
by other processes than wall time) of the loss's forward, of its forward and backward, on a chunk of 64
clients x 50 examples x 10 classes, float32, and of the ``batched`` strategy's oracle on that chunk of
W2's logistic regression (the matrix products included); min and median of ``--repeats``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
import torch
import workloads

from fedrun.data.client_block import Batches
from fedrun.models import build_model
from fedrun.training.classes_first import classes_first_cross_entropy, exact_here, reference_cross_entropy
from fedrun.training.flat_model import FlatModel
from fedrun.training.local_strategy import Batched

CAPABILITIES = ("avx512", "avx2", "default")
KERNELS = {"F.cross_entropy": reference_cross_entropy, "classes-first": classes_first_cross_entropy}


def exact_classes() -> None:
    print(f"  {torch.backends.cpu.get_cpu_capability():8s}", end="")
    for dtype in (torch.float32, torch.float64):
        passing = [k for k in range(2, 17) if exact_here(dtype, k)]
        print(f"  {str(dtype)[6:]}: {f'{passing[0]}-{passing[-1]}' if passing else 'none'} classes", end="")
    print()


def cpu_ms(fn, calls: int = 20) -> float:
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--exact-only", action="store_true", help=argparse.SUPPRESS)  # the child processes
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.exact_only:
        exact_classes()
        return
    print("which (dtype, classes) pass the self-check, by ATEN_CPU_CAPABILITY:")
    for capability in CAPABILITIES:
        subprocess.run([sys.executable, __file__, "--exact-only"], check=True,
                       env={**os.environ, "ATEN_CPU_CAPABILITY": capability})

    w2 = workloads.get_workload("W2")
    clients, slots, classes = 64, w2.local_batch, w2.num_classes
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(clients * slots, classes, generator=gen)
    targets = torch.randint(0, classes, (clients * slots,), generator=gen)
    weights = torch.rand(clients * slots, generator=gen)

    def forward(loss):
        return lambda: loss(logits, targets)

    def both(loss):
        def step():
            x = logits.detach().requires_grad_(True)
            torch.autograd.grad((loss(x, targets) * weights).sum(), x)
        return step

    model = FlatModel(build_model(w2.model, w2.input_shape, classes))
    x_data = torch.randn(clients * slots, *w2.input_shape, generator=gen)
    batches = Batches(index=torch.arange(clients * slots).view(clients, 1, slots),
                      mask=torch.ones(clients, 1, slots, dtype=torch.bool), sizes=np.full((clients, 1), slots),
                      steps=np.ones(clients, dtype=np.int64), x=x_data, y=targets, slots=slots)
    x = model.initial_vector(torch.float32, torch.device("cpu")).expand(clients, -1).clone()

    def oracle(loss):
        call = Batched(model, loss, torch.device("cpu")).oracle(batches)
        return lambda: call(x, slice(0, clients), 0)

    cases = {(what, name): make(loss) for what, make in (("loss, forward", forward), ("loss, forward and backward",
                                                                                     both), ("W2 oracle, one chunk",
                                                                                             oracle))
             for name, loss in KERNELS.items()}
    times: dict[tuple[str, str], list[float]] = {key: [] for key in cases}
    for _ in range(args.repeats):
        for key, fn in cases.items():
            times[key].append(cpu_ms(fn))
    print(f"\nCPU ms, {clients} clients x {slots} examples x {classes} classes, float32 (min / median of "
          f"{args.repeats}); load average {os.getloadavg()[0]:.2f}")
    print(f"| what | {' | '.join(KERNELS)} |\n|---|---|---|")
    for what in dict.fromkeys(what for what, _ in cases):
        cells = [f"{min(times[what, name]):.3f} / {np.median(times[what, name]):.3f}" for name in KERNELS]
        print(f"| {what} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
