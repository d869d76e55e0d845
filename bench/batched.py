"""The ``batched`` strategy against one client at a time, side by side in one run (bench/README.md).

    python bench/batched.py [--models cnn_femnist lstm_shakespeare_unrolled logistic] [--reps 3] [--device cpu]

For each model: one rank's block of clients (``--clients``, LEAF-like shapes: FEMNIST 1x28x28 and 62
classes, Shakespeare sequences of 80 characters and 81 classes, W2's 32 features and 10 classes), K local
steps of batch B, trained by the solver with each strategy in turns (``--reps`` turns after a warm-up),
so that a burst of load on a shared machine hits every strategy alike. Prints the median seconds of a
block's local training per strategy and the ratio sequential / batched (target >= 3x for cnn_femnist and
lstm_shakespeare_unrolled), and checks chunk-position invariance: the last client trained alone equals
the same client at the first, a middle and the last real position of a chunk (``exact`` column).
``bench/gpu.py`` calls :func:`compare` on a CUDA device.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedrun.config import LocalConfig  # noqa: E402
from fedrun.data.client_block import Batches  # noqa: E402
from fedrun.models import build_model  # noqa: E402
from fedrun.protocol import LocalPlan  # noqa: E402
from fedrun.training.flat_model import FlatModel  # noqa: E402
from fedrun.training.gradients import Chunks, local_oracle  # noqa: E402
from fedrun.training.local import run_local  # noqa: E402
from fedrun.training.losses import cross_entropy  # noqa: E402

SHAPES = {"cnn_femnist": ((1, 28, 28), 62), "lstm_shakespeare_unrolled": ((80,), 81), "logistic": ((32,), 10),
          "cnn_cifar10": ((3, 32, 32), 10), "resnet18": ((3, 32, 32), 10)}


class SyntheticBlock:
    """``clients`` clients of ``examples`` random examples each for model ``name`` on ``device``."""

    def __init__(self, name: str, clients: int, examples: int, steps: int, batch: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        torch.manual_seed(0)
        shape, classes = SHAPES[name]
        self.model = FlatModel(build_model(name, shape, classes).to(device=device, dtype=dtype))
        self.x0 = self.model.initial_vector(dtype, device)
        count = clients * examples
        self.x = torch.randint(0, classes, (count, *shape), device=device) if name.startswith("lstm") else \
            torch.randn(count, *shape, dtype=dtype, device=device)
        self.y = torch.randint(0, classes, (count,), device=device)
        rng = torch.Generator().manual_seed(1)
        self.index = torch.stack([torch.randint(c * examples, (c + 1) * examples, (steps, batch), generator=rng)
                                  for c in range(clients)]).to(device)
        self.steps, self.batch = steps, batch

    def train(self, strategy: str, rows: list[int]) -> torch.Tensor:
        rows_t = torch.as_tensor(rows, device=self.index.device)
        sizes = torch.full((len(rows), self.steps), self.batch, device=self.index.device)
        batches = Batches(index=self.index[rows_t], mask=torch.ones_like(self.index[rows_t], dtype=torch.bool),
                          sizes=sizes, steps=np.full(len(rows), self.steps), x=self.x, y=self.y, slots=self.batch)
        oracle, group = local_oracle(strategy, self.model, cross_entropy, batches, np.asarray(rows), 0, 0, False)
        plan = LocalPlan(start=self.x0.expand(len(rows), -1))
        out = run_local(plan, oracle, sizes > 0, 0.05, LocalConfig(steps=self.steps, batch_size=self.batch),
                        group).x_end
        if out.is_cuda:
            torch.cuda.synchronize()
        return out

    def exact(self) -> bool:
        """The last client alone against the same client first, in the middle and last of a chunk."""
        clients = self.index.shape[0]
        target = clients - 1
        chunks = local_oracle("batched", self.model, cross_entropy, self._one(target), np.array([target]), 0, 0,
                              False)[1]
        assert isinstance(chunks, Chunks)
        others = [c for c in range(clients) if c != target][:chunks.real - 1]
        alone = self.train("batched", [target])[0]
        places = [[target, *others], [*others[:len(others) // 2], target, *others[len(others) // 2:]],
                  [*others, target]]
        return all(torch.equal(self.train("batched", rows)[rows.index(target)], alone) for rows in places)

    def _one(self, client: int) -> Batches:
        index = self.index[client:client + 1]
        return Batches(index=index, mask=torch.ones_like(index, dtype=torch.bool), sizes=index[:, :, 0] * 0 + 1,
                       steps=np.ones(1), x=self.x, y=self.y, slots=self.batch)


def compare(name: str, clients: int, steps: int, batch: int, reps: int, device: torch.device,
            strategies: tuple[str, ...] = ("sequential", "batched"), dtype: torch.dtype = torch.float32,
            ) -> dict[str, float | bool | str]:
    """Median seconds per strategy of one block's local training, timed in turns, and the invariance check."""
    block = SyntheticBlock(name, clients, max(batch * steps, 1), steps, batch, dtype, device)
    rows = list(range(clients))
    for strategy in strategies:  # warm-up
        block.train(strategy, rows)
    times: dict[str, list[float]] = {s: [] for s in strategies}
    for _ in range(reps):
        for strategy in strategies:
            start = time.perf_counter()
            block.train(strategy, rows)
            times[strategy].append(time.perf_counter() - start)
    out: dict[str, float | bool | str] = {"model": name, "clients": clients, "dim": block.model.dim}
    out.update({f"{s}_s": statistics.median(v) for s, v in times.items()})
    if "sequential" in strategies and "batched" in strategies:
        out["sequential_over_batched"] = statistics.median(times["sequential"]) / statistics.median(times["batched"])
    out["exact"] = block.exact()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["cnn_femnist", "lstm_shakespeare_unrolled", "logistic"])
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    torch.set_num_threads(1)
    print("| model | d | clients | sequential s | batched s | sequential / batched | exact |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        r = compare(name, args.clients, args.steps, args.batch, args.reps, torch.device(args.device))
        print(f"| {name} | {r['dim']:,} | {r['clients']} | {r['sequential_s']:.3f} | {r['batched_s']:.3f} | "
              f"{r['sequential_over_batched']:.2f}x | {r['exact']} |", flush=True)


if __name__ == "__main__":
    main()
