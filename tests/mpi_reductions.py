"""Run on real ranks by tests/test_exact_sum.py: fedrun.runtime.flat's reductions, each by both of its paths (the
gather and local combine that small buffers take, and the collective that large ones take), on per-rank integer
buffers. Rank 0 writes OUT.npz: for each path the root's sum, every rank's all-reduced sum and max."""

from __future__ import annotations

import sys

import numpy as np
import torch

from fedrun.runtime import flat
from fedrun.runtime.world import init_world


def buffers(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s int64 terms and int8 values (the limbs and exponents the exchange reduces)."""
    rng = np.random.default_rng(rank)
    return (torch.as_tensor(rng.integers(-2**50, 2**50, 700)), torch.as_tensor(rng.integers(-100, 100, 330),
                                                                                 dtype=torch.int8))


def main(out: str) -> None:
    world = init_world("cpu")
    results = {}
    for path, limit in (("gathered", flat.GATHER_BYTES), ("collective", 0)):
        flat.GATHER_BYTES = limit
        terms, values = buffers(world.rank)
        root = flat.reduce_to_root(world, terms.clone())
        summed, largest = flat.all_reduce(world, terms.clone(), "sum"), flat.all_reduce(world, values.clone(), "max")
        everyone = world.allgather_object((summed.numpy(), largest.numpy()))
        if world.is_root:
            results[f"{path}_root"] = root.numpy()
            results[f"{path}_sum"] = np.stack([s for s, _ in everyone])
            results[f"{path}_max"] = np.stack([m for _, m in everyone])
    if world.is_root:
        np.savez(out, **results)
    world.close()


if __name__ == "__main__":
    main(sys.argv[1])
