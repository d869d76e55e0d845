"""A rank's block of clients: their examples as device tensors, and minibatch indices.

The examples come from a :class:`~fedrun.data.client_source.ClientSource`. A resident source (every
in-memory dataset) is copied onto the rank's device once: the block's clients back to back in one
tensor, client j of the block owning rows ``offsets[j]:offsets[j+1]``. An on-demand source
(``federated_h5``, ``synthetic_fedprox``) is read each time minibatches are planned, for the planned
clients only, and the plan's tensors hold just those clients; nothing per example of the other clients
is ever held. Minibatches are drawn by index into the tensors the plan carries (:class:`Batches`).

Sample order is a function of (seed, round, client id) only (docs/design.md), so it does not
depend on which rank hosts a client, which other clients train in the same round, or whether the
examples are resident: each client sees its examples in successive random permutations ("epochs"),
where the permutation of epoch e is the argsort of counter-based hash keys h(seed, round, client, e, j).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedrun.data.client_source import ClientSource
from fedrun.data.hashing import hash_keys


@dataclass
class Batches:
    """Minibatch plan of C clients for one round."""

    index: Tensor  # [C, K, B] int64 rows of the block tensors (padding repeats a valid row)
    mask: Tensor  # [C, K, B] bool: which slots are real examples
    sizes: np.ndarray  # [C, K] int64 real examples per step (0: the client does no step k), on the host:
    # the solver plans its steps from it without reading the device
    steps: np.ndarray  # [C] local steps of each client
    x: Tensor  # the examples ``index`` points into (the resident block, or the planned clients')
    y: Tensor
    slots: int  # B' = min(B, largest n_i of the federation): the width every batched call pads a step to


class ClientBlock:
    """The examples of clients ``first .. stop - 1`` on one device (resident) or read as planned (on demand)."""

    def __init__(self, source: ClientSource, first: int, stop: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.source, self.first, self.device, self.dtype = source, first, device, dtype
        self.num_clients = stop - first
        self.num_examples = source.num_examples[first:stop]
        self.input_shape = source.task.input_shape
        self.most_examples = int(source.num_examples.max())  # the federation's largest n_i (every plan's slots)
        if source.resident:  # client j of the block: rows offsets[j]:offsets[j+1] of x, y
            self.offsets = np.concatenate([[0], np.cumsum(self.num_examples)]).astype(np.int64)
            self.x, self.y = self._to_device(*source.load(np.arange(first, stop)))

    def _to_device(self, x_host: np.ndarray, y_host: np.ndarray) -> tuple[Tensor, Tensor]:
        """Examples as tensors on the device: floating inputs in the run's dtype, regression targets too."""
        x = torch.from_numpy(np.ascontiguousarray(x_host))
        if x.is_floating_point():
            x = x.to(self.dtype)
        y = torch.from_numpy(np.ascontiguousarray(y_host))
        if self.source.task.task == "regression":
            y = y.to(self.dtype)
        pin = self.device.type == "cuda"
        return (x.pin_memory() if pin else x).to(self.device, non_blocking=pin), \
            (y.pin_memory() if pin else y).to(self.device, non_blocking=pin)

    def batches(self, local: np.ndarray, seed: int, round_: int, batch_size: int, steps: int,
                epochs: int | None, shuffle: bool = True) -> Batches:
        """Minibatch indices for block clients ``local`` (block-relative) in round ``round_``.

        Fixed-steps mode: K = ``steps`` minibatches of b_i = min(B, n_i) examples each.
        Epochs mode: K_i = epochs * ceil(n_i / B) minibatches; the last of each epoch may be short.
        Without ``shuffle`` every epoch takes the client's examples in stored order. An on-demand block
        reads the clients ``local`` here; the plan's ``x``, ``y`` hold their examples in the order of ``local``.
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
        j = pos % n[:, None, None]
        if shuffle:
            epoch = pos // n[:, None, None]
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
        if self.source.resident:
            starts, x, y = self.offsets[local], self.x, self.y
        else:
            starts = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
            x, y = self._to_device(*self.source.load(ids))
        rows = rows_local + starts[:, None, None]
        rows = np.where(mask, rows, starts[:, None, None])
        sizes = mask.sum(axis=-1)
        return Batches(index=torch.from_numpy(rows).to(self.device, non_blocking=True),
                       mask=torch.from_numpy(np.array(mask)).to(self.device, non_blocking=True), sizes=sizes,
                       steps=k_i, x=x, y=y,
                       slots=min(batch_size, self.most_examples))
