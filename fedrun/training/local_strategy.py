"""A local-training strategy as an object: built once, when the run starts, for the run's model, loss and device.

``local.strategy`` (or ``auto``'s rule, or ``fastest``'s timing: :mod:`fedrun.training.strategy`) names one of
:data:`STRATEGIES`; the run builds it once (:func:`local_strategy`) and every round asks it to train a group of
clients on their minibatches (:meth:`LocalStrategy.train`). The oracle (:mod:`fedrun.training.gradients`) and
how the solver groups rows for it (:mod:`fedrun.training.local`) are the strategy's own, so no round looks at
the strategy's name:

* :class:`Sequential` and :class:`ChannelsLast`: one client per oracle call (NHWC convolutions for the latter);
* :class:`Vmap`: the whole group in one batched call;
* :class:`Batched`: fixed-size padded chunks (:class:`~fedrun.training.gradients.Chunks`), exact for the
  models of :data:`fedrun.training.strategy.EXACT_BATCHED`.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from fedrun.config import LocalConfig
from fedrun.data.client_block import Batches
from fedrun.protocol import LocalPlan, LocalResult
from fedrun.training.dropout import DropoutSeeds
from fedrun.training.flat_model import FlatModel
from fedrun.training.gradients import (
    Chunks,
    Oracle,
    chunk_size,
    chunked_oracle,
    fitted_chunks,
    sequential_oracle,
    vmap_oracle,
)
from fedrun.training.local import run_chunked, run_local
from fedrun.training.losses import LossFn


class LocalStrategy:
    """How a group of clients is trained: the oracle of their minibatch gradients and the solver around it."""

    name: ClassVar[str]
    group_size: ClassVar[int | None] = 1  # rows per oracle call (None: the whole group)

    def __init__(self, model: FlatModel, loss_fn: LossFn, device: torch.device) -> None:
        self.model, self.loss_fn, self.device = model, loss_fn, device

    def oracle(self, batches: Batches, seeds: DropoutSeeds | None = None) -> Oracle:
        """``g, loss = oracle(x, rows, k)`` for these clients' ``batches`` (``seeds``: a dropout model's streams)."""
        raise NotImplementedError

    def solve(self, plan: LocalPlan, oracle: Oracle, step_active: np.ndarray, lr: float,
              cfg: LocalConfig) -> LocalResult:
        """The K local steps of ``plan`` with ``oracle`` (``step_active`` [C, K] bool on the host)."""
        return run_local(plan, oracle, step_active, lr, cfg, self.group_size)

    def train(self, plan: LocalPlan, batches: Batches, lr: float, cfg: LocalConfig,
              seeds: DropoutSeeds | None = None) -> LocalResult:
        """The local steps of ``plan``'s clients on their ``batches`` (a client takes step k when it has examples)."""
        return self.solve(plan, self.oracle(batches, seeds), np.asarray(batches.sizes) > 0, lr, cfg)


class Sequential(LocalStrategy):
    name = "sequential"

    def oracle(self, batches: Batches, seeds: DropoutSeeds | None = None) -> Oracle:
        return sequential_oracle(self.model, self.loss_fn, batches, seeds)


class ChannelsLast(Sequential):
    name = "channels_last"

    def __init__(self, model: FlatModel, loss_fn: LossFn, device: torch.device) -> None:
        super().__init__(FlatModel(model.module, channels_last=True), loss_fn, device)


class Vmap(LocalStrategy):
    name = "vmap"
    group_size = None

    def oracle(self, batches: Batches, seeds: DropoutSeeds | None = None) -> Oracle:
        return vmap_oracle(self.model, self.loss_fn, batches, seeds)


class Batched(LocalStrategy):
    name = "batched"

    def __init__(self, model: FlatModel, loss_fn: LossFn, device: torch.device) -> None:
        super().__init__(model, loss_fn, device)
        # fixed chunks: the same shapes on every rank; fitted on the first oracle's examples where exact
        self.chunks = Chunks.of(chunk_size(device, model.dim), model.dim)
        self.fitting_checked = False

    def oracle(self, batches: Batches, seeds: DropoutSeeds | None = None) -> Oracle:
        if not self.fitting_checked:  # on the first block's examples: fitted chunks where this machine allows
            self.fitting_checked = True
            self.chunks = fitted_chunks(self.model, self.loss_fn, batches, self.chunks) or self.chunks
        return chunked_oracle(self.model, self.loss_fn, batches, self.chunks, seeds)

    def solve(self, plan: LocalPlan, oracle: Oracle, step_active: np.ndarray, lr: float,
              cfg: LocalConfig) -> LocalResult:
        return run_chunked(plan, oracle, step_active, lr, cfg, self.chunks)


STRATEGIES: dict[str, type[LocalStrategy]] = {cls.name: cls for cls in (Sequential, ChannelsLast, Vmap, Batched)}


def local_strategy(name: str, model: FlatModel, loss_fn: LossFn, device: torch.device) -> LocalStrategy:
    """The strategy ``name`` for this model, loss and device (a name outside :data:`STRATEGIES`: ValueError)."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown local strategy {name!r}; expected one of {', '.join(STRATEGIES)}")
    return STRATEGIES[name](model, loss_fn, device)
