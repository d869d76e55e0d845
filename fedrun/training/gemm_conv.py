"""Convolutions of a batched block as matrix products, for models that ask (``batched_convolutions = "gemm"``).

vmap turns the S clients' convolutions of a chunk into one grouped convolution (S groups), whose kernel the
library picks for the whole call: cuDNN's engines for grouped convolutions are free to tile groups together,
and no documented property makes a group's sums independent of its index, so a client's bits may depend
on its position in the chunk. A model whose block must not (ResNet-18 with GroupNorm, the one built-in
reported not position-exact on CUDA, 3.8x faster batched) can have its block compute each convolution as

    cols_i = unfold(a_i)                       [C k_h k_w, n L]   (each output position's input patch)
    y_i    = W_i cols_i (+ b_i)                [O, n L]           -> [n, O, H_out, W_out]

for client i with weights ``W_i`` [O, C k_h k_w]: unfold is a copy (exact), and vmap makes the product one
strided batched matrix product, which runs the same kernel with the same tiling on every client's matrices
(they differ only by a pointer offset) and never sums across clients; its backward is two more such
products and fold (each input pixel gathers its patches in a fixed order). The same kernels make the
linear models and the LSTM position-exact. The arithmetic differs from the one-client convolution only in
the order of sums (batched and sequential are not mutually exact anyway, docs/design.md), and it costs the
unfolded activations' memory (k_h k_w times the input's).
"""

from __future__ import annotations

from torch import Tensor, nn
from torch.nn import functional as F

from fedrun.training.flat_model import sharing_copy


class GemmConv2d(nn.Module):
    """``conv`` (groups 1, zero padding given as numbers) computed as unfold and one matrix product; the same
    parameter objects under the same names, so ``functional_call`` binds them as on ``conv``."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        if conv.groups != 1 or conv.padding_mode != "zeros" or isinstance(conv.padding, str):
            raise ValueError("batched_convolutions=gemm: expected convolutions with groups=1 and numeric zero "
                             f"padding, got groups={conv.groups}, padding={conv.padding!r} ({conv.padding_mode})")
        self.weight = conv.weight
        self.bias = conv.bias
        self.kernel_size, self.stride, self.padding, self.dilation = (
            conv.kernel_size, conv.stride, conv.padding, conv.dilation)

    def forward(self, a: Tensor) -> Tensor:
        n, _, height, width = a.shape
        out_h, out_w = (
            (size + 2 * pad - dil * (k - 1) - 1) // stride + 1
            for size, pad, dil, k, stride in zip((height, width), self.padding, self.dilation, self.kernel_size,
                                                 self.stride, strict=True))
        cols = F.unfold(a, self.kernel_size, self.dilation, self.padding, self.stride)  # [n, C k k, L]
        cols = cols.transpose(0, 1).reshape(cols.shape[1], -1)  # [C k k, n L]
        y = self.weight.reshape(self.weight.shape[0], -1) @ cols  # [O, n L]
        if self.bias is not None:
            y = y + self.bias.unsqueeze(1)
        return y.view(-1, n, out_h, out_w).transpose(0, 1)


def batched_module(module: nn.Module) -> nn.Module:
    """The module a batched block calls: ``module`` itself, or for a model with ``batched_convolutions =
    "gemm"`` a copy (parameters and buffers shared) whose 2-D convolutions are :class:`GemmConv2d`."""
    if getattr(module, "batched_convolutions", None) != "gemm":
        return module
    out = sharing_copy(module)
    for child in list(out.modules()):
        for key, layer in list(child.named_children()):
            if type(layer) is nn.Conv2d:
                setattr(child, key, GemmConv2d(layer))
    return out

