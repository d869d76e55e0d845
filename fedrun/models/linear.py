"""Linear models: multinomial logistic regression, and the bias-free linear model of least squares."""

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


class LinearNoBias(nn.Module):
    """y = A x with the flat parameter vector equal to x (the least-squares task, docs/verification.md)."""

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(in_features))

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return a @ self.weight
