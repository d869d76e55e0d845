"""Linear models: multinomial logistic regression, and the bias-free linear model of least squares.

Both also evaluate C models at once, ``batched_forward(params, inputs)`` with every parameter ``[C, *shape]``
and inputs ``[C, B, ...]``: the batched products that ``torch.func.vmap`` of ``forward`` dispatches (the same
``bmm`` kernels, hence the same bits), without vmap's per-call cost, which is most of a small model's batched
step on a CPU (fedrun.training.gradients, ``batched_forward``). ``batched_backward(params, inputs, grad)``
writes out its vector-Jacobian product, the gradient of ``sum(grad * batched_forward(params, inputs))`` with
respect to every parameter, as the same kernels autograd's backward of those products runs on the same layouts
(the same bits, tests/test_batched_exact.py), without autograd's graph and engine."""

from __future__ import annotations

import torch
from torch import nn


class Logistic(nn.Module):
    """Softmax regression on flattened inputs."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))

    def batched_forward(self, params: dict[str, torch.Tensor], inputs: torch.Tensor) -> torch.Tensor:
        """Logits ``[C, B, classes]``: b_c + W_c a for each client c's weights and its inputs."""
        return torch.baddbmm(params["linear.bias"].unsqueeze(1), inputs.flatten(2),
                             params["linear.weight"].transpose(1, 2))

    def batched_backward(self, params: dict[str, torch.Tensor], inputs: torch.Tensor,
                         grad: torch.Tensor) -> dict[str, torch.Tensor]:
        """dW_c = (A_c^T G_c)^T (baddbmm's backward for its second operand, then the transpose's) and db_c = the
        sum of G_c over the examples (the broadcast bias's backward) for the logits' gradient ``grad``."""
        return {"linear.weight": torch.bmm(inputs.flatten(2).transpose(1, 2), grad).transpose(1, 2),
                "linear.bias": grad.sum(1)}


class LinearNoBias(nn.Module):
    """y = A x with the flat parameter vector equal to x (the least-squares task, docs/verification.md)."""

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(in_features))

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return a @ self.weight

    def batched_forward(self, params: dict[str, torch.Tensor], inputs: torch.Tensor) -> torch.Tensor:
        """Outputs ``[C, B]``: A_c x_c for each client c."""
        return torch.bmm(inputs, params["weight"].unsqueeze(2)).squeeze(2)

    def batched_backward(self, params: dict[str, torch.Tensor], inputs: torch.Tensor,
                         grad: torch.Tensor) -> dict[str, torch.Tensor]:
        """dx_c = A_c^T g_c (bmm's backward for its second operand) for the outputs' gradient ``grad`` [C, B]."""
        return {"weight": torch.bmm(inputs.transpose(1, 2), grad.unsqueeze(2)).squeeze(2)}
