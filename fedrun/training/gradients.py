"""Gradient oracles: minibatch gradients of C clients at C points, ``g, loss = oracle(x, k)``.

Two strategies compute the same arithmetic:

* ``sequential``: one client after another (functional_call + autograd.grad on a flat view), the
  cost model of a plain PyTorch loop; required for models that draw random numbers (dropout),
  whose generator is re-seeded from (seed, round, client, step) before every client's step.
* ``vmap``: the whole block in one batched call (torch.func.vmap of grad over the client dimension),
  which turns C small models into one batched kernel; padded slots are masked out of the loss.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor
from torch.func import functional_call, grad_and_value, vmap

from fedrun.data.client_block import Batches, ClientBlock, hash_keys
from fedrun.training.flat_model import FlatModel
from fedrun.training.losses import LossFn

Oracle = Callable[[Tensor, int], tuple[Tensor, Tensor]]


def sequential_oracle(model: FlatModel, loss_fn: LossFn, block: ClientBlock, batches: Batches,
                      client_ids: np.ndarray, seed: int, round_: int, reseed: bool) -> Oracle:
    sizes = batches.sizes.cpu().numpy()

    def oracle(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
        g = torch.zeros_like(x)
        loss = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
        for c in range(x.shape[0]):
            b = int(sizes[c, k])
            if b == 0:
                continue
            idx = batches.index[c, k, :b]
            if reseed:
                torch.manual_seed(int(hash_keys(seed, round_, client_ids[c], k) >> np.uint64(1)))
            xc = x[c].detach().requires_grad_(True)
            value = loss_fn(model.forward(xc, block.x[idx]), block.y[idx]).mean()
            (g[c],) = torch.autograd.grad(value, xc)
            loss[c] = value.detach()
        return g, loss

    return oracle


def vmap_oracle(model: FlatModel, loss_fn: LossFn, block: ClientBlock, batches: Batches) -> Oracle:
    def client_loss(xc: Tensor, inputs: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
        per_example = loss_fn(functional_call(model.module, model.params(xc), (inputs,)), targets)
        weights = mask.to(per_example.dtype)
        return (per_example * weights).sum() / weights.sum().clamp_min(1)

    batched = vmap(grad_and_value(client_loss))

    def oracle(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
        idx = batches.index[:, k]
        return batched(x, block.x[idx], block.y[idx], batches.mask[:, k])

    return oracle
