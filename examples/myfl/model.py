"""A model factory with its own settings: ``model.width`` (the ``Settings`` dataclass attribute makes fedrun
call ``mlp(input_shape, num_classes, settings)``); fedrun seeds torch before calling it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from fedrun.errors import require


@dataclass
class MlpSettings:
    """Every field is a config key under ``model:``, type-checked like a built-in's."""

    width: int = 32  # hidden units

    def check(self) -> None:
        require(self.width >= 1, "model.width", "an integer >= 1", self.width)


def mlp(input_shape: tuple[int, ...], num_classes: int, settings: MlpSettings) -> nn.Module:
    """Flatten, one hidden layer of ``settings.width`` ReLU units, logits."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), settings.width), nn.ReLU(),
                         nn.Linear(settings.width, num_classes))


mlp.Settings = MlpSettings  # type: ignore[attr-defined]
