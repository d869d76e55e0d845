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

import torch
from torch import Tensor
from torch.nn import functional as F

PAD = 16  # the widest CPU vector's float lanes (AVX-512): columns padded to a multiple fill whole vectors
# rows from which it is the faster kernel: its transposing copies and padding cost a fixed ~0.13 ms, so a client's
# batch of 50 takes 141 us against F.cross_entropy's 51, 512 rows 161 against 155, 1,024 187 against 272 and
# 3,200 (a chunk of 64 clients x 50) 287 against 763 (forward and backward, float32, 10 classes, one thread, this
# project's AVX-512 CPU); below it the sequential strategies' per-client calls (W1) were 7 % slower in the oracle
MIN_ROWS = 1024
PROBE_ROWS = (1, 50, 3300)  # rows of the probes: one, a client's batch, more than one of log-softmax's column blocks
PROBE_SPREADS = (1e-3, 1.0, 30.0, 300.0)  # logits' scales, row by row: near ties to exp underflow


def classes_first_cross_entropy(outputs: Tensor, targets: Tensor) -> Tensor:
    """``-log softmax(outputs)[i, targets_i]`` per row of ``outputs`` [N, K], computed on ``outputs.T`` [K, N]
    padded with zero columns to a multiple of :data:`PAD` (the module docstring says when it is exact)."""
    rows = outputs.shape[0]
    log_p = torch.log_softmax(ClassesFirst.apply(outputs), 0)
    return F.nll_loss(log_p[:, :rows].t(), targets, reduction="none")


class ClassesFirst(torch.autograd.Function):
    """``[N, K]`` -> ``[K, N + pad]``, contiguous, zero-padded to a multiple of :data:`PAD` columns; its
    backward hands on a contiguous ``[N, K]`` gradient, the layout ``F.cross_entropy``'s backward gives: the
    layer below sums it over the rows (a bias's gradient), and a sum's order follows its operand's layout
    (measured: the MNIST CNN's last bias gradient differs when it is handed the transposed view)."""

    @staticmethod
    def forward(outputs: Tensor) -> Tensor:
        rows, classes = outputs.shape
        by_class = outputs.new_empty(classes, rows + -rows % PAD)
        by_class[:, :rows] = outputs.t()
        by_class[:, rows:] = 0
        return by_class

    @staticmethod
    def setup_context(ctx, inputs: tuple[Tensor], output: Tensor) -> None:
        ctx.rows = inputs[0].shape[0]

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad[:, :ctx.rows].t().contiguous()


def reference_cross_entropy(outputs: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(outputs, targets, reduction="none")


def same_bits(a: Tensor, b: Tensor) -> bool:
    """Equal shapes, dtypes and bytes (so -0.0 differs from 0.0, unlike ``torch.equal``); CPU tensors."""
    return a.shape == b.shape and a.dtype == b.dtype and a.numpy().tobytes() == b.numpy().tobytes()


def matches_reference(candidate: Callable[[Tensor, Tensor], Tensor], dtype: torch.dtype, classes: int) -> bool:
    """Whether ``candidate`` gives ``F.cross_entropy``'s bits (reduction none) on this CPU for ``classes``
    classes in ``dtype``: the losses and the gradient of ``sum_i w_i loss_i`` with respect to the logits, for
    random weights ``w`` and logits of :data:`PROBE_SPREADS` scales, on probes of :data:`PROBE_ROWS` rows."""
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode(False), torch.enable_grad():  # whatever mode the first caller is in
        for rows in PROBE_ROWS:
            spread = torch.tensor(PROBE_SPREADS, dtype=dtype).repeat(-(-rows // len(PROBE_SPREADS)))[:rows, None]
            logits = torch.randn(rows, classes, generator=gen, dtype=dtype) * spread
            targets = torch.randint(0, classes, (rows,), generator=gen)
            weights = torch.rand(rows, generator=gen, dtype=dtype)
            answers = []
            for loss in (reference_cross_entropy, candidate):
                x = logits.clone().requires_grad_(True)
                value = loss(x, targets)
                answers.append((value.detach(), torch.autograd.grad((value * weights).sum(), x)[0]))
            (value, grad), (value_c, grad_c) = answers
            if not (same_bits(value, value_c) and same_bits(grad, grad_c)):
                return False
    return True


@cache
def exact_here(dtype: torch.dtype, classes: int) -> bool:
    """:func:`classes_first_cross_entropy` passes :func:`matches_reference` for this dtype and class count
    (checked once per process; fewer than :data:`PAD` classes only: above, every CPU kernel adds a tree)."""
    return classes < PAD and matches_reference(classes_first_cross_entropy, dtype, classes)


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
