"""Choosing the local-training strategy by timing it (issue: speed).

``local.strategy: auto`` times a few local steps of every applicable strategy on this rank's own
clients and model at start-up and keeps the fastest. Measured here on CPU (one thread): vmap over a
block loses to the sequential loop for the FedSUM CNNs and wins by far for linear models and small
MLPs; channels_last makes the FedSUM CNNs' steps 1.15-1.4x faster at batch 10-32; on a GPU the
balance moves towards vmap. Models that draw random numbers (dropout) need per-client random streams,
which only the sequential strategies (``sequential``, ``channels_last``) provide.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from fedrun.config import LocalConfig
from fedrun.data.client_block import ClientBlock
from fedrun.errors import ConfigError
from fedrun.protocol import LocalPlan
from fedrun.training.flat_model import FlatModel
from fedrun.training.gradients import local_oracle
from fedrun.training.local import run_local
from fedrun.training.losses import LossFn

STRATEGIES = ("sequential", "channels_last", "vmap")
MAX_TIMED_CLIENTS = 8  # enough to see vmap's batching gain; bounds the start-up cost


def applicable_strategies(model: FlatModel, block: ClientBlock, random_model: bool) -> list[str]:
    """The strategies that can train this model on this data: vmap not with dropout, channels_last
    only for image inputs and convolution kernels."""
    out = ["sequential"]
    if model.has_conv_kernels and len(block.input_shape) == 3:
        out.append("channels_last")
    if not random_model:
        out.append("vmap")
    return out


def check_strategy(requested: str, model: FlatModel, block: ClientBlock, random_model: bool, model_name: str) -> None:
    """A forced ``local.strategy`` must apply to the model (a one-line ConfigError otherwise)."""
    if requested == "auto" or requested in applicable_strategies(model, block, random_model):
        return
    if requested == "vmap":
        raise ConfigError(f"local.strategy=vmap: model {model_name} uses dropout, whose per-client random "
                          "streams need local.strategy=sequential or channels_last")
    raise ConfigError(f"local.strategy={requested}: model {model_name} has no 2-D convolution on image inputs; "
                      "expected sequential or vmap")


def time_strategies(model: FlatModel, loss_fn: LossFn, block: ClientBlock, x0: torch.Tensor, cfg: LocalConfig,
                    clients: int, seed: int, strategies: list[str], steps: int = 2, repeats: int = 3,
                    budget_s: float = 2.0) -> dict[str, float]:
    """Best seconds for ``steps`` local steps of ``clients`` block clients, per strategy (a strategy torch
    cannot run on this model is left out). After one warm-up each, the strategies are timed in turns,
    up to ``repeats`` turns while a turn takes less than ``budget_s``, so that a burst of load on a
    shared machine hits every strategy alike rather than deciding the choice."""
    local = np.arange(min(block.num_clients, max(1, clients), MAX_TIMED_CLIENTS))
    batches = block.batches(local, seed, 0, cfg.batch_size, steps, None, cfg.shuffle)
    plan = LocalPlan(start=x0.expand(len(local), -1))
    active = batches.sizes > 0
    runs = {}
    for name in strategies:
        oracle, group = local_oracle(name, model, loss_fn, batches, local + block.first, seed, 0, False)
        try:
            run_local(plan, oracle, active, 0.0, cfg, group)  # warm-up (vmap traces its batching rules)
        except (RuntimeError, NotImplementedError):  # a model torch.func cannot batch
            continue
        runs[name] = (oracle, group)
    timings = {name: float("inf") for name in runs}
    for _ in range(repeats):
        turn = time.perf_counter()
        for name, (oracle, group) in runs.items():
            start = time.perf_counter()
            run_local(plan, oracle, active, 0.0, cfg, group)
            if x0.is_cuda:
                torch.cuda.synchronize()
            timings[name] = min(timings[name], time.perf_counter() - start)
        if time.perf_counter() - turn > budget_s:
            break
    return timings
