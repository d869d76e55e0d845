"""Choosing the local-training strategy.

Which strategies give which bits (measured on this repository's CPU, float32, one client trained alone,
in a group of 2 and of 4; docs/design.md):

* ``sequential`` and ``channels_last`` train one client at a time: a client's result is the same bits
  alone or next to any other clients, so the run is the same on any number of ranks and placements;
* they are not mutually exact for models with convolutions (NHWC kernels sum in another order: 3e-8
  apart after 10 steps of the MNIST CNN); without convolutions channels_last does not apply;
* ``vmap`` batches a rank's clients into one call, whose kernels depend on the batch: a client's result
  changes with the clients batched with it (5.6e-5 for the CIFAR-10 CNN, 1.9e-9 for logistic
  regression), hence with the number of ranks;
* ``batched`` is vmap on fixed-size padded chunks (fedrun.training.gradients.Chunks), exact for the
  verified models of :data:`EXACT_BATCHED`.

``local.strategy: auto`` (the default) takes the fastest exact strategy of the model on the device by a
fixed rule (:func:`reproducible_strategy`; no timing, so every rank and run agrees). ``local.strategy:
fastest`` times a few local steps of every applicable strategy but batched on this rank's own clients
and model at start-up and keeps the fastest, at the price of runs whose last bits depend on that choice
and, with vmap, on the number of ranks. Models that draw random numbers (dropout) need per-client random
streams: the sequential strategies re-seed per client and step, ``batched`` draws each client's masks from
that same stream outside its batched call (fedrun.training.dropout); ``vmap`` is refused for them.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from fedrun.config import LocalConfig
from fedrun.data.client_block import ClientBlock
from fedrun.errors import ConfigError
from fedrun.protocol import LocalPlan
from fedrun.training.dropout import unbatchable_dropout
from fedrun.training.flat_model import FlatModel
from fedrun.training.local_strategy import local_strategy
from fedrun.training.losses import LossFn

MAX_TIMED_CLIENTS = 8  # enough to see vmap's batching gain; bounds the start-up cost
# built-in models whose batched training is verified exact (tests/test_batched_exact.py: a client alone equals
# the same client at every tested position of a chunk, float32 and float64); any other model, plugins
# included, is never batched by auto
EXACT_BATCHED = frozenset({"linear", "logistic", "cnn_mnist", "cnn_femnist", "cnn_cifar10", "cnn_svhn",
                           "lstm_shakespeare_unrolled", "resnet18"})
# parameters up to which auto batches a model without convolutions on a CPU (W2's logistic regression, 330:
# batched 6.3x the bare loop; the Shakespeare LSTM, 820,185: no faster than sequential, bench/RESULTS.md)
CPU_BATCHED_DIM = 1 << 16


def applicable_strategies(model: FlatModel, block: ClientBlock, random_model: bool) -> list[str]:
    """The strategies that can train this model on this data: vmap not with dropout (batched draws each
    client's masks from its own stream, fedrun.training.dropout), channels_last only for image inputs and
    convolution kernels."""
    out = ["sequential"]
    if model.has_conv_kernels and len(block.input_shape) == 3:
        out.append("channels_last")
    return out + (["batched"] if random_model else ["vmap", "batched"])


def reproducible_strategy(model: FlatModel, block: ClientBlock, model_name: str,
                          device: torch.device) -> tuple[str, str]:
    """``auto``'s choice, the fastest exact strategy for this model on this device, by rule (no timing), and
    why (runtime.json's ``strategy_reason``): ``batched`` for a model of :data:`EXACT_BATCHED` on a GPU, and
    on a CPU when it has no convolution and at most :data:`CPU_BATCHED_DIM` parameters; otherwise
    channels_last where it applies, else sequential. On a CPU, batching pays only where a client's step
    costs less than a call: every client has its own weights, so a batched call runs the same matrix
    products as the loop, one per client, and the larger models spend most of a step in them
    (bench/batched.py's bound: the LEAF CNN and LSTM cannot be 3x faster batched on a CPU); vmap also turns
    C convolutions into one grouped convolution, which oneDNN runs slower than C plain ones."""
    verified = model_name in EXACT_BATCHED
    small = not model.has_conv_kernels and model.dim <= CPU_BATCHED_DIM
    if verified and device.type == "cuda":
        return "batched", f"{model_name}'s batched block is verified exact; on a GPU one call per chunk pays"
    if verified and small:
        return "batched", (f"{model_name}'s batched block is verified exact, and with no convolution and "
                           f"{model.dim} <= {CPU_BATCHED_DIM} parameters a CPU step costs less than a call")
    why = (f"{model_name}'s batched block is not verified exact" if not verified else
           "on a CPU a batched call runs the same per-client products as the loop: batching pays only for small "
           "dense models")
    if "channels_last" in applicable_strategies(model, block, True):
        return "channels_last", f"{why}; the exact one-client loop with NHWC convolutions"
    return "sequential", f"{why}; the exact one-client loop"


def check_strategy(requested: str, model: FlatModel, block: ClientBlock, random_model: bool, model_name: str) -> None:
    """A forced ``local.strategy`` must apply to the model (a one-line ConfigError otherwise)."""
    layer = unbatchable_dropout(model.module) if requested == "batched" else None
    if layer is not None:
        raise ConfigError(f"local.strategy=batched: model {model_name} has dropout layer {layer}; a batched block "
                          "takes Dropout, Dropout1d, Dropout2d or Dropout3d (expected local.strategy=sequential)")
    if requested in ("auto", "fastest") or requested in applicable_strategies(model, block, random_model):
        return
    if requested == "vmap":
        raise ConfigError(f"local.strategy=vmap: model {model_name} uses dropout, whose per-client random "
                          "streams need local.strategy=sequential, channels_last or batched")
    raise ConfigError(f"local.strategy={requested}: model {model_name} has no 2-D convolution on image inputs; "
                      "expected sequential, vmap or batched")


TIMED_STEPS, TIMED_TURNS, TURN_BUDGET_S = 2, 3, 2.0  # local steps per timing, turns at most, seconds a turn


def time_strategies(model: FlatModel, loss_fn: LossFn, block: ClientBlock, x0: torch.Tensor, cfg: LocalConfig,
                    clients: int, seed: int, strategies: list[str]) -> dict[str, float]:
    """Best seconds for ``TIMED_STEPS`` local steps of ``clients`` block clients, per strategy (a strategy
    torch cannot run on this model is left out). After one warm-up each, the strategies are timed in turns,
    up to ``TIMED_TURNS`` turns while a turn takes less than ``TURN_BUDGET_S``, so that a burst of load on a
    shared machine hits every strategy alike rather than deciding the choice. ``batched`` is not timed:
    vmap runs the same calls without its padding rows (``fastest`` is for trading exactness for speed)."""
    strategies = [name for name in strategies if name != "batched"]
    local = np.arange(min(block.num_clients, max(1, clients), MAX_TIMED_CLIENTS))
    batches = block.batches(local, seed, 0, cfg.batch_size, TIMED_STEPS, None, cfg.shuffle)
    plan = LocalPlan(start=x0.expand(len(local), -1))
    active = batches.sizes > 0
    runs = {}
    for name in strategies:
        strategy = local_strategy(name, model, loss_fn, x0.device)
        oracle = strategy.oracle(batches)
        try:
            strategy.solve(plan, oracle, active, 0.0, cfg)  # warm-up (vmap traces its batching rules)
        except (RuntimeError, NotImplementedError):  # a model torch.func cannot batch
            continue
        runs[name] = (strategy, oracle)
    timings = {name: float("inf") for name in runs}
    for _ in range(TIMED_TURNS):
        turn = time.perf_counter()
        for name, (strategy, oracle) in runs.items():
            start = time.perf_counter()
            strategy.solve(plan, oracle, active, 0.0, cfg)
            if x0.is_cuda:
                torch.cuda.synchronize()
            timings[name] = min(timings[name], time.perf_counter() - start)
        if time.perf_counter() - turn > TURN_BUDGET_S:
            break
    return timings
