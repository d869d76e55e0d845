"""Cross-entropy over few classes with the classes first: the bits of ``F.cross_entropy``, at a third of its cost.

Why: PyTorch's CPU log-softmax over a last dimension shorter than a vector register (W2's 10 classes; 16 float
lanes on AVX-512) takes each row alone, a few lanes at a time; on a chunk of 64 clients x 50 examples it costs
six times the model's matrix products (bench/RESULTS.md, issue 47). For such a row the reference computes,
in this order,

    m = max_j x_j,   s = (((e_0 + e_1) + e_2) + ... + e_{K-1}),   e_j = exp(x_j - m),
    log p_j = (x_j - m) - log s,

with the vectorised exp and log, a sum from left to right (the row fits in one partial vector, whose lanes
are added one by one), and the backward ``g_j - exp(log p_j) * sum_k g_k``. PyTorch's log-softmax over the
FIRST dimension of the transposed ``[K, N]`` logits computes exactly that sequence for every column, 16
columns a vector, provided every column falls in a full vector (so ``N`` is padded to :data:`PAD` columns).
Where the reference sums in another order (``K`` at or above the vector width, where it adds whole vectors
and then a tree across lanes, or a CPU whose kernels differ), the bits differ; so the kernel is used only
for a (dtype, classes) pair that :func:`matches_reference` has found bit for bit equal to ``F.cross_entropy``
on this machine (values and gradients, a fixed probe), checked once per process, and never inside
``torch.func`` transforms (vmap, jvp: their batching and forward-mode rules are other kernels).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional as F

IGNORE_INDEX = -100  # F.cross_entropy's default: a row with this target has loss 0 and no gradient
PAD = 16  # the widest CPU vector's float lanes (AVX-512): columns padded to a multiple fill whole vectors
# rows from which it is the faster kernel: its transposing copies and padding cost a fixed ~0.13 ms, so a client's
# batch of 50 takes 141 us against F.cross_entropy's 51, 512 rows 161 against 155, 1,024 187 against 272 and
# 3,200 (a chunk of 64 clients x 50) 287 against 763 (forward and backward, float32, 10 classes, one thread, this
# project's AVX-512 CPU); below it the sequential strategies' per-client calls (W1) were 7 % slower in the oracle
MIN_ROWS = 1024
PROBE_ROWS = (1, 50, 3300)  # rows of the probes: one, a client's batch, more than one of log-softmax's column blocks
PROBE_SPREADS = (1e-3, 1.0, 30.0, 300.0)  # logits' scales, row by row: near ties to exp underflow


def classes_first_cross_entropy(outputs: Tensor, targets: Tensor) -> Tensor:
    """``-log softmax(outputs)[i, targets_i]`` per row of ``outputs`` [N, K] (0 where ``targets_i`` is -100),
    computed on ``outputs.T`` [K, N] padded with zero columns to a multiple of :data:`PAD` (the module docstring
    says when it is exact); differentiable (:class:`ClassesFirstCrossEntropy`)."""
    return ClassesFirstCrossEntropy.apply(outputs, targets)


def classes_first_loss_and_grad(outputs: Tensor, targets: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """The losses of :func:`classes_first_cross_entropy` and the gradient of ``sum_i weights_i loss_i`` with
    respect to ``outputs``, without autograd: the same two steps as its backward, for a caller that writes its
    own backward (fedrun.training.gradients, the written-out linear models)."""
    losses, log_p = _forward(outputs, targets)
    return losses, _backward(log_p, targets, weights, outputs.shape[0])


def _forward(outputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """The losses [N] and the padded classes-first log-probabilities [K, N + pad]."""
    rows, classes = outputs.shape
    by_class = outputs.new_empty(classes, rows + -rows % PAD)
    transpose_into(by_class[:, :rows], outputs)
    by_class[:, rows:] = 0
    log_p = torch.log_softmax(by_class, 0)
    return F.nll_loss(log_p[:, :rows].t(), targets, reduction="none"), log_p


def _backward(log_p: Tensor, targets: Tensor, grad: Tensor, rows: int) -> Tensor:
    """``d sum_i grad_i loss_i / d outputs`` as a contiguous ``[N, K]``: nll_loss's gradient (``-grad_i`` at
    ``[targets_i, i]``, nothing for an ignored target) in the padded classes-first layout, log-softmax's own
    backward kernel on it, and back to rows first, the layout ``F.cross_entropy``'s backward gives: the layer
    below sums it over the rows (a bias's gradient), and a sum's order follows its operand's layout (measured:
    the MNIST CNN's last bias gradient differs when it is handed the transposed view)."""
    kept = targets != IGNORE_INDEX
    grad_log_p = torch.zeros_like(log_p)
    grad_log_p[:, :rows].scatter_(0, torch.where(kept, targets, 0).unsqueeze(0),
                                  torch.where(kept, -grad, 0).unsqueeze(0))
    grad_by_class = torch.ops.aten._log_softmax_backward_data(grad_log_p, log_p, 0, log_p.dtype)
    grad = grad_by_class.new_empty(rows, grad_by_class.shape[0])
    transpose_into(grad, grad_by_class[:, :rows])
    return grad


def transpose_into(out: Tensor, a: Tensor) -> None:
    """``out <- a.T`` for CPU matrices: numpy's transposing copy, 2-3x torch's for these narrow shapes (W2's
    3,200 x 10 logits: 15 us against 41, and back 25 against 44); a copy, so the same values either way."""
    np.copyto(out.numpy(), a.detach().numpy().T)


class ClassesFirstCrossEntropy(torch.autograd.Function):
    """:func:`_forward` with :func:`_backward` as its gradient (one node: the layout's copies, the log-softmax
    and the loss's gather, each with its own backward, cost the batched oracle a tenth of its step)."""

    @staticmethod
    def forward(ctx, outputs: Tensor, targets: Tensor) -> Tensor:
        losses, log_p = _forward(outputs, targets)
        ctx.save_for_backward(log_p, targets)
        return losses

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        log_p, targets = ctx.saved_tensors
        return _backward(log_p, targets, grad, targets.shape[0]), None


def reference_cross_entropy(outputs: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(outputs, targets, reduction="none")


def same_bits(a: Tensor, b: Tensor) -> bool:
    """Equal shapes, dtypes and bytes (so -0.0 differs from 0.0, unlike ``torch.equal``); CPU tensors."""
    return a.shape == b.shape and a.dtype == b.dtype and a.numpy().tobytes() == b.numpy().tobytes()


LossAndGrad = Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]  # (logits, targets, w) -> (losses, grad)


def via_autograd(loss: Callable[[Tensor, Tensor], Tensor]) -> LossAndGrad:
    """``loss``'s values and autograd's gradient of ``sum_i w_i loss_i`` with respect to the logits."""
    def loss_and_grad(logits: Tensor, targets: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
        x = logits.clone().requires_grad_(True)
        value = loss(x, targets)
        return value.detach(), torch.autograd.grad((value * weights).sum(), x)[0]

    return loss_and_grad


def matches_reference(candidate: LossAndGrad, dtype: torch.dtype, classes: int) -> bool:
    """Whether ``candidate`` gives ``F.cross_entropy``'s bits (reduction none) on this CPU for ``classes``
    classes in ``dtype``: the losses and the gradient of ``sum_i w_i loss_i`` with respect to the logits, for
    random weights ``w`` and logits of :data:`PROBE_SPREADS` scales, on probes of :data:`PROBE_ROWS` rows (one
    target of each longer probe ignored)."""
    gen = torch.Generator().manual_seed(0)
    reference = via_autograd(reference_cross_entropy)
    with torch.inference_mode(False), torch.enable_grad():  # whatever mode the first caller is in
        for rows in PROBE_ROWS:
            spread = torch.tensor(PROBE_SPREADS, dtype=dtype).repeat(-(-rows // len(PROBE_SPREADS)))[:rows, None]
            logits = torch.randn(rows, classes, generator=gen, dtype=dtype) * spread
            targets = torch.randint(0, classes, (rows,), generator=gen)
            if rows > 1:
                targets[rows // 2] = IGNORE_INDEX
            weights = torch.rand(rows, generator=gen, dtype=dtype)
            (value, grad), (value_c, grad_c) = (f(logits, targets, weights) for f in (reference, candidate))
            if not (same_bits(value, value_c) and same_bits(grad, grad_c)):
                return False
    return True


@cache
def exact_here(dtype: torch.dtype, classes: int) -> bool:
    """:func:`classes_first_cross_entropy` (through autograd) and :func:`classes_first_loss_and_grad` pass
    :func:`matches_reference` for this dtype and class count (checked once per process; fewer than :data:`PAD`
    classes only: above, every CPU kernel adds a tree)."""
    return classes < PAD and all(matches_reference(candidate, dtype, classes) for candidate in
                                 (via_autograd(classes_first_cross_entropy), classes_first_loss_and_grad))


def exact_for(dtype: torch.dtype, classes: int, device: torch.device) -> bool:
    """Whether logits of ``classes`` classes in ``dtype`` on ``device`` may take the classes-first kernel: a
    CPU, float32 or float64, and a (dtype, classes) that passed :func:`exact_here`."""
    return device.type == "cpu" and dtype in (torch.float32, torch.float64) and exact_here(dtype, classes)


def uses_classes_first(outputs: Tensor, targets: Tensor) -> bool:
    """Whether :func:`fedrun.training.losses.cross_entropy` takes the classes-first kernel: logits ``[N, K]``
    with at least :data:`MIN_ROWS` rows that :func:`exact_for` admits, class indices (not probabilities) as
    targets, outside ``torch.func`` transforms."""
    return (outputs.dim() == 2 and outputs.shape[0] >= MIN_ROWS and not targets.is_floating_point()
            and not torch._C._are_functorch_transforms_active()
            and exact_for(outputs.dtype, outputs.shape[1], outputs.device))
