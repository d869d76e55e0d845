"""The CNNs of the FedSUM paper's Table 2 (MNIST, SVHN, CIFAR-10 shapes), 5x5 convolutions.

Notation of the paper: C(in,out) convolution, R ReLU, M 2x2 max-pool, D dropout, L(out) linear.
"""

from __future__ import annotations

import torch
from torch import nn


class MnistCNN(nn.Module):
    """C(1,10)-R-M-C(10,20)-D-R-M-L(50)-R-D-L(10); 28x28 inputs (21,840 parameters)."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 10, 5)
        self.conv2 = nn.Conv2d(10, 20, 5)
        self.drop2d = nn.Dropout2d(0.5)
        self.fc1 = nn.Linear(320, 50)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(50, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.drop2d(self.conv2(x))), 2)
        x = self.drop(torch.relu(self.fc1(x.flatten(1))))
        return self.fc2(x)


class ConvNet(nn.Module):
    """C(c,32)-R-M-C(32,32)-R-M-L(h1)[-R-L(h2)]-R-L(classes) for 32x32 inputs (SVHN, CIFAR-10)."""

    def __init__(self, in_channels: int, num_classes: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 5)
        self.conv2 = nn.Conv2d(32, 32, 5)
        widths = (32 * 5 * 5, *hidden)
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:], strict=True))
        self.out = nn.Linear(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = x.flatten(1)
        for layer in self.hidden:
            x = torch.relu(layer(x))
        return self.out(x)


def svhn_cnn(in_channels: int = 3, num_classes: int = 10) -> ConvNet:
    """C(3,32)-R-M-C(32,32)-R-M-L(128)-R-L(10)."""
    return ConvNet(in_channels, num_classes, (128,))


def cifar10_cnn(in_channels: int = 3, num_classes: int = 10) -> ConvNet:
    """C(3,32)-R-M-C(32,32)-R-M-L(256)-R-L(64)-R-L(10)."""
    return ConvNet(in_channels, num_classes, (256, 64))
