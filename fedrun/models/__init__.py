"""Model registry: ``build_model(name, input_shape, num_classes)``."""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import nn

from fedrun.models.cnn import MnistCNN, cifar10_cnn, svhn_cnn
from fedrun.models.linear import LinearNoBias, Logistic

ModelFactory = Callable[[tuple[int, ...], int], nn.Module]

MODELS: dict[str, ModelFactory] = {
    "cnn_mnist": lambda shape, classes: MnistCNN(shape[0], classes),
    "cnn_svhn": lambda shape, classes: svhn_cnn(shape[0], classes),
    "cnn_cifar10": lambda shape, classes: cifar10_cnn(shape[0], classes),
    "logistic": lambda shape, classes: Logistic(math.prod(shape), classes),
    "linear": lambda shape, classes: LinearNoBias(math.prod(shape)),
}


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Instantiate model ``name`` for inputs of ``input_shape`` (without the batch dimension)."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r} (known: {', '.join(sorted(MODELS))})")
    return MODELS[name](tuple(input_shape), num_classes)


def uses_randomness(model: nn.Module) -> bool:
    """True if the forward pass draws random numbers in training mode (dropout)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules())
