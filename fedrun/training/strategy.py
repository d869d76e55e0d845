"""Choosing the local-training strategy by timing it (issue: speed).

``local.strategy: auto`` times a few local steps of every applicable strategy on this rank's own
clients and model at start-up and keeps the fastest. Measured here on CPU, vmap over a block loses
to the sequential loop for the FedSUM CNNs and wins by far for linear models and small MLPs; on a GPU
the balance moves towards vmap. Models that draw random numbers (dropout) need per-client random
streams and use the sequential strategy only.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from fedrun.algorithms.base import LocalPlan
from fedrun.config import LocalConfig
from fedrun.data.client_block import ClientBlock
from fedrun.training.flat_model import FlatModel
from fedrun.training.gradients import sequential_oracle, vmap_oracle
from fedrun.training.local import run_local
from fedrun.training.losses import LossFn

STRATEGIES = ("sequential", "vmap")
MAX_TIMED_CLIENTS = 8  # enough to see vmap's batching gain; bounds the start-up cost


def time_strategies(model: FlatModel, loss_fn: LossFn, block: ClientBlock, x0: torch.Tensor, cfg: LocalConfig,
                    clients: int, seed: int, steps: int = 2, repeats: int = 1) -> dict[str, float]:
    """Best-of-``repeats`` seconds for ``steps`` local steps of ``clients`` block clients, per strategy."""
    local = np.arange(min(block.num_clients, max(1, clients), MAX_TIMED_CLIENTS))
    batches = block.batches(local, seed, 0, cfg.batch_size, steps, None, cfg.shuffle)
    plan = LocalPlan(start=x0.expand(len(local), -1))
    active = batches.sizes > 0
    timings = {}
    for name in STRATEGIES:
        if name == "vmap":
            oracle, group = vmap_oracle(model, loss_fn, block, batches), None
        else:
            oracle, group = sequential_oracle(model, loss_fn, block, batches, local + block.first, seed, 0, False), 1
        try:
            run_local(plan, oracle, active, 0.0, cfg, group)  # warm-up (vmap traces its batching rules)
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                run_local(plan, oracle, active, 0.0, cfg, group)
                if x0.is_cuda:
                    torch.cuda.synchronize()
                best = min(best, time.perf_counter() - start)
            timings[name] = best
        except (RuntimeError, NotImplementedError):  # a model torch.func cannot batch
            continue
    return timings
