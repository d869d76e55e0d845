"""Evaluation of a model on test examples, per example in fixed batches (summed exactly by the callers)."""

from __future__ import annotations

import torch
from torch import Tensor

from fedrun.training.flat_model import FlatModel
from fedrun.training.losses import LossFn


@torch.no_grad()
def evaluate_examples(model: FlatModel, loss_fn: LossFn, x: Tensor, inputs: Tensor, targets: Tensor,
                      batch_size: int) -> Tensor:
    """``[n, 2]``: the loss of model ``x`` on each example and whether it is classified correctly (0 for
    regression: float targets; class labels are integers), in batches of ``batch_size`` consecutive
    examples. A convolution's result for one
    example can depend on the other examples of its batch (kernel choice by batch size), so callers fix
    the batches to make results reproducible."""
    classification = not targets.is_floating_point()
    model.module.eval()
    out = torch.zeros(len(targets), 2, dtype=x.dtype, device=x.device)
    for start in range(0, len(targets), batch_size):
        xb, yb = inputs[start:start + batch_size], targets[start:start + batch_size]
        outputs = model.forward(x, xb)
        out[start:start + len(yb), 0] = loss_fn(outputs, yb)
        if classification:
            out[start:start + len(yb), 1] = (outputs.argmax(dim=1) == yb).to(x.dtype)
    model.module.train()
    return out
