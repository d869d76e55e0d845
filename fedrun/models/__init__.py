"""Model registry: ``build_model(name, input_shape, num_classes)``; ``model.name`` may also be
``package.module:factory``, a ``(input_shape, num_classes) -> torch.nn.Module`` outside fedrun, or, when
the factory has a ``Settings`` dataclass attribute, ``(input_shape, num_classes, settings) -> nn.Module``
(the settings are the ``model`` section's other keys, docs/extending.md)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from torch import nn

from fedrun.errors import ConfigError, brief
from fedrun.models.cnn import MnistCNN, cifar10_cnn, svhn_cnn
from fedrun.models.leaf import CharLSTM, FemnistCNN
from fedrun.models.linear import LinearNoBias, Logistic
from fedrun.models.resnet import ResNet18
from fedrun.plugins import call, is_import_path, load

ModelFactory = Callable[[tuple[int, ...], int], nn.Module]

MODELS: dict[str, ModelFactory] = {
    "cnn_mnist": lambda shape, classes: MnistCNN(shape[0], classes),
    "cnn_svhn": lambda shape, classes: svhn_cnn(shape[0], classes),
    "cnn_cifar10": lambda shape, classes: cifar10_cnn(shape[0], classes),
    "logistic": lambda shape, classes: Logistic(math.prod(shape), classes),
    "linear": lambda shape, classes: LinearNoBias(math.prod(shape)),
    # GroupNorm (2 groups): no buffers, so averaging the parameters averages the whole model.
    "resnet18": lambda shape, classes: ResNet18(shape[0], classes, norm="group"),
    # BatchNorm: running statistics are buffers outside the averaged parameters (see resnet.py).
    "resnet18_bn": lambda shape, classes: ResNet18(shape[0], classes, norm="batch"),
    "cnn_femnist": lambda shape, classes: FemnistCNN(shape[0], classes, (shape[1], shape[2])),
    # Token ids in, next-token logits out: the vocabulary is the class set (81 for Shakespeare).
    "lstm_shakespeare": lambda shape, classes: CharLSTM(classes, classes),
    "lstm_shakespeare_unrolled": lambda shape, classes: CharLSTM(classes, classes, unrolled=True),
}


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, settings: Any = None) -> nn.Module:
    """Instantiate model ``name`` for inputs of ``input_shape`` (without the batch dimension); ``settings``:
    a plugin's ``Settings`` instance (``cfg.model.settings``; default: its defaults)."""
    if is_import_path(name):
        contract = "a factory (input_shape, num_classes) -> torch.nn.Module"
        factory = load(name, "model.name", contract, callable)
        args: tuple[Any, ...] = (tuple(input_shape), num_classes)
        if getattr(factory, "Settings", None) is not None:
            contract = "a factory (input_shape, num_classes, settings) -> torch.nn.Module"
            args = (*args, settings if settings is not None else factory.Settings())
        module = call("model.name", name, contract, factory, *args)
        if not isinstance(module, nn.Module):
            raise ConfigError(f"model.name: {name} returned {type(module).__name__}; expected a torch.nn.Module")
        return module
    if name not in MODELS:
        raise ConfigError(f"model.name: expected one of {', '.join(sorted(MODELS))}, got {brief(name)}")
    return MODELS[name](tuple(input_shape), num_classes)


def uses_randomness(model: nn.Module) -> bool:
    """True if the forward pass draws random numbers in training mode (dropout)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules())
