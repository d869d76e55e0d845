"""The LEAF benchmark models: the FEMNIST CNN and the Shakespeare character LSTM (Caldas et al., 2018)."""

from __future__ import annotations

import torch
from torch import nn


class FemnistCNN(nn.Module):
    """conv 5x5 32 (same) - ReLU - pool 2 - conv 5x5 64 (same) - ReLU - pool 2 - dense 2048 - ReLU - dense.

    6,603,710 parameters for 1x28x28 inputs and 62 classes. No dropout, no normalization buffers.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 62,
                 image_size: tuple[int, int] = (28, 28)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * (image_size[0] // 4) * (image_size[1] // 4), 2048)
        self.fc2 = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class CharLSTM(nn.Module):
    """Embedding (8) - 2-layer LSTM (256) - linear; predicts the character after a token sequence.

    Input int64 token ids ``[batch, seq_len]``; output logits ``[batch, num_classes]`` from the last
    time step. ``unrolled=True`` computes the same LSTM step by step from the same parameters (identical
    names and values as ``nn.LSTM``'s) with plain tensor ops: slower on one model, but it vectorizes
    under ``torch.func.vmap``, where the fused ``nn.LSTM`` kernel has no batching rule and falls back to
    a per-sample loop.
    """

    def __init__(self, vocab_size: int, num_classes: int, embed_dim: int = 8, hidden: int = 256,
                 layers: int = 2, unrolled: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, layers, batch_first=True)
        self.fc = nn.Linear(hidden, num_classes)
        self.unrolled = unrolled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        if self.unrolled:
            last = self._unrolled(h)
        else:
            last = self.lstm(h)[0][:, -1]
        return self.fc(last)

    def _unrolled(self, h: torch.Tensor) -> torch.Tensor:
        lstm = self.lstm
        for k in range(lstm.num_layers):
            w_ih, w_hh = getattr(lstm, f"weight_ih_l{k}"), getattr(lstm, f"weight_hh_l{k}")
            bias = getattr(lstm, f"bias_ih_l{k}") + getattr(lstm, f"bias_hh_l{k}")
            # [batch, seq, 4 * hidden], all steps at once; unbind, not gates_x[:, t]: the backward of one
            # unbind stacks the steps' gradients once, where T selects would each zero-fill and add a
            # tensor of the whole sequence's gates (O(T^2) memory traffic, under vmap O(C T^2)); same values
            gates_x = (h @ w_ih.T + bias).unbind(1)
            state = h.new_zeros(h.shape[0], lstm.hidden_size)
            cell = state
            outputs = []
            for gates_t in gates_x:
                i, f, g, o = (gates_t + state @ w_hh.T).chunk(4, dim=-1)  # PyTorch's gate order
                cell = torch.sigmoid(f) * cell + torch.sigmoid(i) * torch.tanh(g)
                state = torch.sigmoid(o) * torch.tanh(cell)
                outputs.append(state)
            h = torch.stack(outputs, dim=1)
        return h[:, -1]
