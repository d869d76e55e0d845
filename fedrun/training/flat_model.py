"""A torch module seen as a function of one flat parameter vector.

The runtime communicates and stores models as flat vectors ``x`` of dimension d, in the order of
``model.named_parameters()``. ``FlatModel.params(x)`` gives views of ``x`` shaped like each
parameter, so ``torch.func.functional_call`` evaluates the model at ``x`` without copying it, and
autograd returns the gradient as one flat vector. Buffers (none in the shipped models except
``resnet18_bn``) stay in the module and are not part of x.

``FlatModel(module, channels_last=True)`` (the ``channels_last`` local strategy) evaluates gradients
with images and convolution kernels in NHWC memory order, which CPU and GPU convolution kernels often
run faster; x itself keeps the NCHW order, so checkpoints and collectives do not depend on it.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor, nn
from torch.func import functional_call


class FlatModel:
    def __init__(self, module: nn.Module, channels_last: bool = False) -> None:
        self.module = module
        self.channels_last = channels_last
        self.names = [n for n, _ in module.named_parameters()]
        self._leaves = list(module.parameters())  # the module's parameter objects, re-pointed by gradient()
        self.shapes = [tuple(p.shape) for _, p in module.named_parameters()]
        self.sizes = [math.prod(s) for s in self.shapes]
        self.dim = sum(self.sizes)

    @property
    def has_conv_kernels(self) -> bool:
        """Whether any parameter is a 4-D (2-D convolution) kernel, which ``channels_last`` reorders."""
        return any(len(s) == 4 for s in self.shapes)

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

    def batched_params(self, x: Tensor) -> dict[str, Tensor]:
        """``params`` of every row of ``x`` [C, d] at once: views ``[C, *shape]``."""
        out, offset = {}, 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes, strict=True):
            out[name] = x[:, offset:offset + size].view(x.shape[0], *shape)
            offset += size
        return out

    def forward(self, x: Tensor, inputs: Tensor) -> Tensor:
        return functional_call(self.module, self.params(x), (inputs,))

    def gradient(self, x: Tensor, inputs: Tensor, targets: Tensor, loss_fn, out: Tensor) -> Tensor:
        """Mean loss at ``x`` on one minibatch; its gradient is written into the flat ``out`` [d].

        The module's parameters are pointed at slices of ``x`` (no copy) and ``backward`` runs on the
        module itself, the cost of a plain PyTorch training step (autograd through views of one flat
        leaf would add a d-sized accumulation per parameter). With ``channels_last`` the 4-D kernels
        are NHWC copies of their slices (small next to the activations) and the inputs are NHWC.
        """
        params = self._leaves
        for p, shape, piece in zip(params, self.shapes, x.split(self.sizes), strict=True):
            view = piece.view(shape)
            if self.channels_last and len(shape) == 4:
                view = view.contiguous(memory_format=torch.channels_last)
            p.data = view
            p.grad = None
        if self.channels_last and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        value = loss_fn(self.module(inputs), targets).mean()
        value.backward()
        torch.cat([p.grad.reshape(-1) for p in params], out=out)  # one copy into out, any grad layout
        return value.detach()


def module_at(module: nn.Module, x: Tensor) -> nn.Module:
    """A copy of ``module`` whose parameters are the flat vector ``x`` (in ``named_parameters()`` order, as the
    runtime stores models), each its own tensor; buffers are copied as they are."""
    out = copy.deepcopy(module)
    params = list(out.parameters())
    if x.numel() != sum(p.numel() for p in params):
        raise ValueError(f"x has {x.numel()} values, the model {sum(p.numel() for p in params)} parameters")
    offset = 0
    with torch.no_grad():
        for p in params:
            p.data = x[offset:offset + p.numel()].reshape(p.shape).to(p.dtype).clone()
            p.grad = None
            offset += p.numel()
    return out


def sharing_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module``'s layers whose parameters and buffers are the module's own tensors (not copies):
    for a batched block that swaps some layers for batched formulations while training the same model."""
    return copy.deepcopy(module, {id(t): t for t in (*module.parameters(), *module.buffers())})
