"""Per-example losses: cross-entropy for classification, 1/2 squared error for regression."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fedrun.training.classes_first import (
    classes_first_cross_entropy,
    classes_first_loss_and_grad,
    exact_for,
    reference_cross_entropy,
    uses_classes_first,
    via_autograd,
)

LossFn = Callable[[Tensor, Tensor], Tensor]


def cross_entropy(outputs: Tensor, targets: Tensor) -> Tensor:
    """``F.cross_entropy(outputs, targets, reduction="none")``, bit for bit; for few classes on a CPU computed
    by :mod:`fedrun.training.classes_first`, which has checked that it gives these bits on this machine."""
    if uses_classes_first(outputs, targets):
        return classes_first_cross_entropy(outputs, targets)
    return reference_cross_entropy(outputs, targets)


def loss_and_grad(loss_fn: LossFn, outputs: Tensor, targets: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """``loss_fn``'s per-example losses and the gradient of ``sum_i weights_i loss_i`` with respect to ``outputs``
    (for an oracle that writes its model's backward itself): autograd's, through the classes-first kernel's own
    backward where :func:`cross_entropy` takes that kernel (the same bits: its self-check compares both)."""
    if loss_fn is cross_entropy and uses_classes_first(outputs, targets):
        return classes_first_loss_and_grad(outputs, targets, weights)
    with torch.enable_grad():
        return via_autograd(loss_fn)(outputs, targets, weights)


def half_squared_error(outputs: Tensor, targets: Tensor) -> Tensor:
    """f_i(x) = 1/(2 m) ||A_i x - b_i||^2 is the mean of this over the client's rows."""
    return 0.5 * (outputs - targets) ** 2


def loss_for(task: str) -> LossFn:
    return cross_entropy if task == "classification" else half_squared_error


def loss_kernel(task: str, dtype: torch.dtype, classes: int, device: torch.device) -> str:
    """runtime.json's ``loss_kernel``: what computes the run's loss (for classification this runs the
    classes-first kernel's self-check, once per process)."""
    if task != "classification":
        return "half squared error"
    if exact_for(dtype, classes, device):
        return "classes-first cross-entropy (checked bit for bit against F.cross_entropy on this CPU)"
    return "F.cross_entropy"
