"""A rank's block of clients: their examples as device-resident tensors, and minibatch indices.

The examples of the block's clients are stored back to back in one tensor on the rank's device;
client j of the block owns rows ``offsets[j]:offsets[j+1]``. Minibatches are drawn by index.

Sample order is a function of (seed, round, client id) only (docs/design.md), so it does not
depend on which rank hosts a client or which other clients train in the same round: each client sees
its examples in successive random permutations ("epochs"), where the permutation of epoch e is the
argsort of counter-based hash keys h(seed, round, client, e, j).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedrun.data.dataset import TaskData

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer, element-wise on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def hash_keys(*parts: np.ndarray | int) -> np.ndarray:
    """Hash integer arrays (broadcast together) into uint64 keys; order of ``parts`` matters."""
    h = np.zeros((), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for p in parts:
            h = _mix(h + (np.asarray(p, dtype=np.int64).astype(np.uint64) + np.uint64(1)) * _GOLDEN)
    return h


@dataclass
class Batches:
    """Minibatch plan of C clients for one round."""

    index: Tensor  # [C, K, B] int64 rows of the block tensors (padding repeats a valid row)
    mask: Tensor  # [C, K, B] bool: which slots are real examples
    sizes: Tensor  # [C, K] int64 real examples per step (0: the client does no step k)
    steps: np.ndarray  # [C] local steps of each client


def _take_rows(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``array[rows]``; a contiguous run of rows is a view, so a memory-mapped dataset is not copied."""
    if len(rows) and rows[-1] - rows[0] + 1 == len(rows) and bool((np.diff(rows) == 1).all()):
        return array[rows[0]:rows[-1] + 1]
    return array[rows]


class ClientBlock:
    """The examples of clients ``first .. first + len(parts) - 1`` on one device."""

    def __init__(self, task: TaskData, parts: list[np.ndarray], first: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.first = first
        self.num_clients = len(parts)
        self.num_examples = np.array([len(p) for p in parts], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.num_examples)]).astype(np.int64)
        rows = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        x = torch.from_numpy(np.ascontiguousarray(_take_rows(task.x_train, rows)))
        if x.is_floating_point():
            x = x.to(dtype)
        y = torch.from_numpy(np.ascontiguousarray(task.y_train[rows]))
        if task.task == "regression":
            y = y.to(dtype)
        pin = device.type == "cuda"
        self.x = (x.pin_memory() if pin else x).to(device, non_blocking=pin)
        self.y = (y.pin_memory() if pin else y).to(device, non_blocking=pin)
        self.device = device

    def batches(self, local: np.ndarray, seed: int, round_: int, batch_size: int, steps: int,
                epochs: int | None, shuffle: bool = True) -> Batches:
        """Minibatch indices for block clients ``local`` (block-relative) in round ``round_``.

        Fixed-steps mode: K = ``steps`` minibatches of b_i = min(B, n_i) examples each.
        Epochs mode: K_i = epochs * ceil(n_i / B) minibatches; the last of each epoch may be short.
        Without ``shuffle`` every epoch takes the client's examples in stored order.
        """
        n = self.num_examples[local]  # [C]
        ids = local + self.first
        b = np.minimum(batch_size, n)
        if epochs is None:
            k_i = np.full(len(local), steps, dtype=np.int64)
            width = int(b.max()) if len(b) else 1
            k = np.arange(steps)[None, :, None]
            s = np.arange(width)[None, None, :]
            pos = k * b[:, None, None] + s
            mask = np.broadcast_to(s < b[:, None, None], pos.shape)
        else:
            per_epoch = -(-n // batch_size)
            k_i = epochs * per_epoch
            kmax = int(k_i.max())
            width = int(b.max())
            k = np.arange(kmax)[None, :, None]
            s = np.arange(width)[None, None, :]
            e, kk = k // per_epoch[:, None, None], k % per_epoch[:, None, None]
            within = kk * batch_size + s
            pos = e * n[:, None, None] + within
            mask = (k < k_i[:, None, None]) & (within < n[:, None, None])
        epoch = pos // n[:, None, None]
        j = pos % n[:, None, None]
        if shuffle:
            num_epochs = int(epoch.max()) + 1
            nmax = int(n.max())
            keys = hash_keys(seed, round_, ids[:, None, None], np.arange(num_epochs)[None, :, None],
                             np.arange(nmax)[None, None, :])
            keys = np.where(np.arange(nmax)[None, None, :] < n[:, None, None], keys, np.iinfo(np.uint64).max)
            perm = np.argsort(keys, axis=-1, kind="stable")  # [C, E, nmax]
            rows_local = np.take_along_axis(perm.reshape(len(local), -1),
                                            (epoch * nmax + j).reshape(len(local), -1), axis=1).reshape(pos.shape)
        else:
            rows_local = j
        rows = rows_local + self.offsets[local][:, None, None]
        rows = np.where(mask, rows, self.offsets[local][:, None, None])
        sizes = mask.sum(axis=-1)
        return Batches(index=torch.from_numpy(rows).to(self.device),
                       mask=torch.from_numpy(np.array(mask)).to(self.device),
                       sizes=torch.from_numpy(sizes).to(self.device), steps=k_i)
