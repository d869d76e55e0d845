"""A model factory: ``(input_shape, num_classes) -> torch.nn.Module``; fedrun seeds torch before calling it."""

from __future__ import annotations

import math

from torch import nn


def mlp(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Flatten, one hidden layer of 32 ReLU units, logits."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 32), nn.ReLU(), nn.Linear(32, num_classes))
