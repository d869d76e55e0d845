"""A torch module seen as a function of one flat parameter vector.

The runtime communicates and stores models as flat vectors ``x`` of dimension d, in the order of
``model.named_parameters()``. ``FlatModel.params(x)`` gives views of ``x`` shaped like each
parameter, so ``torch.func.functional_call`` evaluates the model at ``x`` without copying it, and
autograd returns the gradient as one flat vector. Buffers (none in the shipped models except
``resnet18_bn``) stay in the module and are not part of x.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.func import functional_call


class FlatModel:
    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.names = [n for n, _ in module.named_parameters()]
        self.shapes = [tuple(p.shape) for _, p in module.named_parameters()]
        self.sizes = [math.prod(s) for s in self.shapes]
        self.dim = sum(self.sizes)

    def initial_vector(self, dtype: torch.dtype, device: torch.device) -> Tensor:
        """The module's current (seeded) parameters as one flat vector."""
        with torch.no_grad():
            return torch.cat([p.detach().reshape(-1) for p in self.module.parameters()]).to(
                device=device, dtype=dtype)

    def params(self, x: Tensor) -> dict[str, Tensor]:
        out, offset = {}, 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes, strict=True):
            out[name] = x[offset:offset + size].view(shape)
            offset += size
        return out

    def forward(self, x: Tensor, inputs: Tensor) -> Tensor:
        return functional_call(self.module, self.params(x), (inputs,))
