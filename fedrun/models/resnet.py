"""ResNet-18 for 32x32 inputs (CIFAR-style stem: one 3x3 convolution, no max-pool).

Normalization is GroupNorm by default: BatchNorm keeps running mean/variance in *buffers*, which
federated averaging of the parameters never sees, so each client's statistics drift apart and the
global model evaluates with whichever statistics it happened to keep (Hsieh et al., 2020, "The
Non-IID Data Quagmire"). GroupNorm has no buffers and normalizes each sample on its own, so the model
is fully described by its parameters. Two groups per layer follows Reddi et al. (2021, "Adaptive
Federated Optimization"), who trained ResNet-18 with GroupNorm in federated CIFAR experiments.
``norm="batch"`` gives the classic BatchNorm network (registered as ``resnet18_bn``) for comparison.

11,173,962 parameters for 10 classes (either norm; the affine weights and biases match).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

Norm = Literal["group", "batch"]


def make_norm(kind: Norm, channels: int, groups: int = 2) -> nn.Module:
    """GroupNorm with ``groups`` groups, or BatchNorm2d."""
    if kind == "group":
        return nn.GroupNorm(groups, channels)
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    raise ValueError(f"norm must be 'group' or 'batch', got {kind!r}")


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (1x1 projection when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int, norm: Norm, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = make_norm(norm, cout, groups)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = make_norm(norm, cout, groups)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          make_norm(norm, cout, groups))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 (stages of 64, 128, 256, 512 channels, two blocks each), global average pooling.

    Built for 32x32 inputs; larger inputs (Tiny-ImageNet 64x64) work too, through the adaptive pool.
    ``width``: the first stage's channels (64; the others double it), smaller for tests of the same network.
    A batched block computes its convolutions as matrix products (``batched_convolutions``,
    fedrun.training.gemm_conv): vmap's grouped convolution left a client's bits dependent on its position
    in the chunk on CUDA.
    """

    batched_convolutions = "gemm"

    def __init__(self, in_channels: int = 3, num_classes: int = 10, norm: Norm = "group",
                 groups: int = 2, width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, 1, 1, bias=False),
                                  make_norm(norm, width, groups), nn.ReLU())
        blocks: list[nn.Module] = []
        cin = width
        for cout, stride in ((width, 1), (2 * width, 2), (4 * width, 2), (8 * width, 2)):
            blocks += [BasicBlock(cin, cout, stride, norm, groups), BasicBlock(cout, cout, 1, norm, groups)]
            cin = cout
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(8 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))
