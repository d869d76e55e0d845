"""The ``batched`` strategy against one client at a time, side by side in one run (bench/README.md).

    python bench/batched.py [--models cnn_femnist lstm_shakespeare_unrolled logistic] [--reps 3] [--device cpu]

For each model: one rank's block of clients (``--clients``; by default one full chunk of the model's
batched calls on the device, so that batched pays for no padding clients), with LEAF-like shapes: FEMNIST
1x28x28 and 62 classes, Shakespeare sequences of 80 characters and 81 classes, W2's 32 features and 10
classes, K local steps of batch B, trained by the solver with each strategy in turns (``--reps`` turns
after a warm-up), so that a burst of load on a shared machine hits every strategy alike. Prints the
median seconds per client and local step of each strategy, the ratio sequential / batched (target >= 3x
for cnn_femnist and lstm_shakespeare_unrolled), what ``auto`` takes for the model on the device, and
checks chunk-position invariance: the last client trained alone equals the same client at the first, a
middle and the last real position of a chunk (``exact`` column).

The ``kernels`` column bounds what any batching over clients can gain: one more run of each strategy under
torch.profiler gives the seconds per client spent in matrix products and convolutions (the self time of
mm, addmm, bmm, baddbmm and the convolution kernels). Every client has its own weights, so batching
clients never merges two clients' products into one larger product; it can only remove the rest of
sequential's time. Hence ``bound = sequential / min(kernel seconds per client of either strategy)`` is an
upper bound on the ratio sequential / batched; when it is under 3 the target cannot be met on the device
by any batched strategy.
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
from fedrun.models import build_model, uses_randomness  # noqa: E402
from fedrun.protocol import LocalPlan  # noqa: E402
from fedrun.training.dropout import DropoutSeeds  # noqa: E402
from fedrun.training.flat_model import FlatModel  # noqa: E402
from fedrun.training.gradients import Chunks, chunk_size  # noqa: E402
from fedrun.training.local_strategy import Batched, local_strategy  # noqa: E402
from fedrun.training.losses import cross_entropy  # noqa: E402
from fedrun.training.strategy import reproducible_strategy  # noqa: E402

# the matrix-product and convolution kernels whose self time batching over clients cannot shrink
KERNELS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mkldnn_convolution",
                     "aten::convolution_backward", "aten::_slow_conv2d_forward", "aten::_slow_conv2d_backward",
                     "aten::cudnn_convolution", "aten::_convolution"})

# each model's input shape and classes (LEAF-like for the LEAF models, the FedSUM paper's for its CNNs), for
# every model bench/batched.py and bench/gpu.py may name
SHAPES = {"cnn_femnist": ((1, 28, 28), 62), "lstm_shakespeare_unrolled": ((80,), 81), "logistic": ((32,), 10),
          "cnn_mnist": ((1, 28, 28), 10), "cnn_svhn": ((3, 32, 32), 10), "cnn_cifar10": ((3, 32, 32), 10),
          "resnet18": ((3, 32, 32), 10)}


class SyntheticBlock:
    """``clients`` clients of ``examples`` random examples each for model ``name`` on ``device``."""

    def __init__(self, name: str, clients: int, examples: int, steps: int, batch: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        torch.manual_seed(0)
        shape, classes = SHAPES[name]
        self.input_shape = shape
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
        sizes = np.full((len(rows), self.steps), self.batch)
        batches = Batches(index=self.index[rows_t], mask=torch.ones_like(self.index[rows_t], dtype=torch.bool),
                          sizes=sizes, steps=np.full(len(rows), self.steps), x=self.x, y=self.y, slots=self.batch)
        # a model with dropout draws client c's masks from its own stream (round 0), whatever the strategy
        seeds = DropoutSeeds(np.asarray(rows), 0, 0) if uses_randomness(self.model.module) else None
        plan = LocalPlan(start=self.x0.expand(len(rows), -1))
        out = local_strategy(strategy, self.model, cross_entropy, self.x0.device).train(
            plan, batches, 0.05, LocalConfig(steps=self.steps, batch_size=self.batch), seeds).x_end
        if out.is_cuda:
            torch.cuda.synchronize()
        return out

    def exact(self) -> bool:
        """The last client alone against the same client first, in the middle and last of a chunk."""
        clients = self.index.shape[0]
        target = clients - 1
        chunks = Batched(self.model, cross_entropy, self.x0.device).chunks
        others = [c for c in range(clients) if c != target][:chunks.real - 1]
        alone = self.train("batched", [target])[0]
        places = [[target, *others], [*others[:len(others) // 2], target, *others[len(others) // 2:]],
                  [*others, target]]
        return all(torch.equal(self.train("batched", rows)[rows.index(target)], alone) for rows in places)

    def _one(self, client: int) -> Batches:
        index = self.index[client:client + 1]
        return Batches(index=index, mask=torch.ones_like(index, dtype=torch.bool), sizes=np.ones((1, self.steps)),
                       steps=np.ones(1), x=self.x, y=self.y, slots=self.batch)


def kernel_seconds(block: SyntheticBlock, strategy: str, rows: list[int]) -> float:
    """Seconds of one training of ``rows`` spent in :data:`KERNELS` (self time, by torch.profiler)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if block.x0.is_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        block.train(strategy, rows)
    cuda = block.x0.is_cuda
    return sum((e.self_device_time_total if cuda else e.self_cpu_time_total)
               for e in prof.key_averages() if e.key in KERNELS) / 1e6


def full_chunk(name: str, device: torch.device) -> int:
    """The clients of one full chunk of the batched strategy for model ``name`` on ``device``."""
    shape, classes = SHAPES[name]
    dim = FlatModel(build_model(name, shape, classes)).dim
    return Chunks.of(chunk_size(device, dim), dim).real


def compare(name: str, clients: int, steps: int, batch: int, reps: int, device: torch.device,
            strategies: tuple[str, ...] = ("sequential", "batched"), dtype: torch.dtype = torch.float32,
            kernels: bool = False) -> dict[str, float | bool | str]:
    """Median seconds per strategy of one block's local training, timed in turns, and the invariance check;
    with ``kernels`` also each strategy's kernel seconds per client and local step and the bound."""
    block = SyntheticBlock(name, clients, max(batch * steps, 1), steps, batch, dtype, device)
    rows = list(range(clients))
    for strategy in strategies if reps > 1 else ():  # warm-up (one turn alone: a check of the script)
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
        if kernels:
            per_step = clients * steps
            out.update({f"{s}_kernel_s": kernel_seconds(block, s, rows) / per_step for s in ("sequential", "batched")})
            out["bound"] = statistics.median(times["sequential"]) / per_step / min(
                out["sequential_kernel_s"], out["batched_kernel_s"])
    out["auto"] = reproducible_strategy(block.model, block, name, device)[0]
    out["exact"] = block.exact()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["cnn_femnist", "lstm_shakespeare_unrolled", "logistic"])
    p.add_argument("--clients", type=int, default=0, help="clients of the block (0: one full chunk of the model)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    print("| model | d | clients | sequential ms | batched ms | sequential / batched | kernels ms (seq / batched) "
          "| bound | auto | exact |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models:
        clients = args.clients or full_chunk(name, device)
        r = compare(name, clients, args.steps, args.batch, args.reps, device, kernels=True)
        per = 1e3 / (clients * args.steps)  # ms per client and local step
        print(f"| {name} | {r['dim']:,} | {clients} | {r['sequential_s'] * per:.2f} | {r['batched_s'] * per:.2f} | "
              f"{r['sequential_over_batched']:.2f}x | {r['sequential_kernel_s'] * 1e3:.2f} / "
              f"{r['batched_kernel_s'] * 1e3:.2f} | {r['bound']:.2f}x | {r['auto']} | {r['exact']} |", flush=True)


if __name__ == "__main__":
    main()
