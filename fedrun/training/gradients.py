"""Gradient oracles: minibatch gradients of a group of clients at their points, ``g, loss = oracle(x, rows, k)``.

Four strategies compute the same arithmetic (up to the order of floating-point sums):

* ``sequential``: one client after another (the module's own backward on views of x), the cost
  model of a plain PyTorch loop; models that draw random numbers (dropout) re-seed their generator
  from (seed, round, client, step) before every client's step.
* ``channels_last``: ``sequential`` with images and convolution kernels in NHWC memory order (CNNs only).
* ``vmap``: the whole block in one batched call (torch.func.vmap of the loss over the client
  dimension, one backward), which turns C small models into one batched kernel; padded slots are
  masked out of the loss. Given per-row dropout seeds (``batched`` only), dropout layers take each
  client's noise drawn outside the batched call from the client's own stream (fedrun.training.dropout);
  a model may ask for its convolutions as batched matrix products (fedrun.training.gemm_conv).
* ``batched``: ``vmap`` on fixed-size padded chunks (:class:`Chunks`), whose kernels see the same shapes
  whatever clients share a call.

:mod:`fedrun.training.local_strategy` builds each strategy once and asks it for its oracle every round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from fedrun.data.client_block import Batches
from fedrun.training.dropout import BlockDropout, DropoutSeeds
from fedrun.training.flat_model import FlatModel
from fedrun.training.gemm_conv import batched_module
from fedrun.training.losses import LossFn, loss_and_grad

# clients per batched call, by device type and model size (bench/RESULTS.md: on W2's logistic regression a
# CPU call costs about as much as 100 clients' arithmetic, so 64 rows take 34 ms for 100 clients, 16 take 78)
CHUNK = {("cpu", False): 64, ("cpu", True): 16, ("cuda", False): 256, ("cuda", True): 64}  # (device, large)
LARGE = 1 << 20  # parameters above which a model is large (memory: a solver holds several [S, d] copies)
PLACED = 16  # numbers of clients whose chunk rows Chunks.placed keeps
TAIL = 64  # elements of padding that end every chunk: more than a vectorized loop's scalar remainder
FITTED_CHUNK = 128  # rows per call of fitted chunks (a CPU, a written-out gradient): W2's 100 clients in one call
FITTED_BYTES = 64 << 20  # a call's gathered examples up to which fitted chunks take FITTED_CHUNK rows (else the
# fixed chunks' rows: logistic regression on CIFAR-sized inputs, 50 a step, would gather 79 MB a call of 128)
FIT = 8  # rows to which a fitted chunk's last call is rounded up (fewer distinct shapes)
Oracle = Callable[[Tensor, slice, int], tuple[Tensor, Tensor]]  # (x of rows, rows, step) -> (g, loss)


def sequential_oracle(model: FlatModel, loss_fn: LossFn, batches: Batches,
                      seeds: DropoutSeeds | None = None) -> Oracle:
    sizes = np.asarray(batches.sizes)  # the host plan: a client's batch size never reads the device

    def oracle(x: Tensor, rows: slice, k: int) -> tuple[Tensor, Tensor]:
        g = torch.empty_like(x)
        losses = []
        for j, c in enumerate(range(rows.start, rows.stop)):
            b = int(sizes[c, k])
            if b == 0:
                g[j].zero_()
                losses.append(x.new_zeros(()))
                continue
            idx = batches.index[c, k, :b]
            if seeds is not None:
                seeds.reseed(c, k)
            # index_select: the rows x[idx] copies, without advanced indexing's per-call set-up
            losses.append(model.gradient(x[j], batches.x.index_select(0, idx), batches.y.index_select(0, idx),
                                         loss_fn, out=g[j]))
        return g, torch.stack(losses).to(x.dtype)

    return oracle


def batched_loss_fn(model: FlatModel, loss_fn: LossFn, module: nn.Module, dropout: BlockDropout | None = None
                    ) -> Callable[[dict[str, Tensor], Tensor, Tensor, Tensor, list[Tensor]], Tensor]:
    """Every client's masked mean loss at once, ``f_c = sum_j m_cj l(model_c(a_cj), b_cj) / max(1, sum_j m_cj)``
    for parameters ``[C, ...]``, inputs ``[C, B, ...]``, targets and mask ``[C, B]``, and with ``dropout``
    each dropout layer's noise ``[C, B, ...]`` (fedrun.training.dropout; an empty list without); ``module``:
    what vmap calls (:func:`fedrun.training.gemm_conv.batched_module`, or ``dropout.module``).

    A model with a ``batched_forward(params, inputs)`` method (the linear models) computes its C forward passes
    itself, as the products vmap would dispatch, and the loss runs on the flattened ``[C * B]`` examples with
    the same per-client sums: the same bits as vmap (tests/test_batched_exact.py), without vmap's per-call cost
    (on W2's logistic regression, half of a 64-client step on a CPU). Any other model is vmapped."""
    written_out = getattr(model.module, "batched_forward", None)
    if written_out is None:
        def client_loss(params: dict[str, Tensor], inputs: Tensor, targets: Tensor, mask: Tensor,
                        noise: list[Tensor]) -> Tensor:
            if dropout is not None:
                dropout.feed = list(noise)
            per_example = loss_fn(functional_call(module, params, (inputs,)), targets)
            weights = mask.to(per_example.dtype)
            return (per_example * weights).sum() / weights.sum().clamp_min(1)

        return vmap(client_loss)

    def clients_loss(params: dict[str, Tensor], inputs: Tensor, targets: Tensor, mask: Tensor,
                     noise: list[Tensor]) -> Tensor:
        outputs = written_out(params, inputs)
        per_example = loss_fn(outputs.flatten(0, 1), targets.flatten(0, 1)).view(mask.shape)
        weights = mask.to(per_example.dtype)
        return (per_example * weights).sum(1) / weights.sum(1).clamp_min(1)

    return clients_loss


# (params, inputs, targets, mask) -> (each parameter's gradient [C, *shape], each client's masked mean loss [C])
BlockGradient = Callable[[dict[str, Tensor], Tensor, Tensor, Tensor], tuple[dict[str, Tensor], Tensor]]


def written_out_gradient(model: FlatModel, loss_fn: LossFn) -> BlockGradient | None:
    """For a model that writes out both its batched forward and its backward (``batched_forward`` and
    ``batched_backward``, the linear models), every client's gradient and masked mean loss without autograd:

        o = batched_forward(params, a),  w_cj = m_cj / max(1, sum_j m_cj),
        l, dl/do = the loss and the gradient of sum_cj w_cj l(o_cj, b_cj)   (fedrun.training.losses.loss_and_grad)
        f_c = sum_j m_cj l_cj / max(1, sum_j m_cj),  grads = batched_backward(params, a, dl/do)

    The same kernels on the same operands as autograd's backward of :func:`batched_loss_fn` (w is its gradient of
    the summed losses with respect to the per-example losses, 1/den then times the mask), so the same bits
    (tests/test_batched_exact.py), without the graph and the engine: a third of W2's oracle on a CPU. None for
    any other model."""
    forward = getattr(model.module, "batched_forward", None)
    backward = getattr(model.module, "batched_backward", None)
    if forward is None or backward is None:
        return None

    def gradient(params: dict[str, Tensor], inputs: Tensor, targets: Tensor, mask: Tensor
                 ) -> tuple[dict[str, Tensor], Tensor]:
        outputs = forward(params, inputs)
        weights = mask.to(outputs.dtype)
        counts = weights.sum(1).clamp_min(1)
        per_weight = torch.ones_like(counts).div_(counts).unsqueeze(1) * weights
        per_example, grad_outputs = loss_and_grad(loss_fn, outputs.flatten(0, 1), targets.flatten(0, 1),
                                                  per_weight.flatten())
        losses = (per_example.view(mask.shape) * weights).sum(1) / counts
        return backward(params, inputs, grad_outputs.view(outputs.shape)), losses

    return gradient


def vmap_oracle(model: FlatModel, loss_fn: LossFn, batches: Batches, seeds: DropoutSeeds | None = None) -> Oracle:
    """``seeds``: for a model with dropout, each row's stream (its noise drawn by :class:`BlockDropout`)."""
    module = batched_module(model.module)
    dropout = None if seeds is None else BlockDropout.of(module, batches.x[:1])
    written_out = None if dropout is not None else written_out_gradient(model, loss_fn)
    batched_loss = batched_loss_fn(model, loss_fn, module if dropout is None else dropout.module, dropout)
    counts = np.asarray(batches.sizes) if dropout is not None else None  # examples per row and step, on the host
    # index_select gathers a chunk's examples at a quarter of advanced indexing's cost (W2: 26 us against 108),
    # but hands channels_last images back NCHW for the model to copy again (W1's oracle 3.5 % slower)
    gather = rows_of if batches.x.is_contiguous() else lambda values, idx: values[idx]

    def oracle(x: Tensor, rows: slice, k: int) -> tuple[Tensor, Tensor]:
        idx = batches.index[rows, k]
        inputs, targets, mask = gather(batches.x, idx), rows_of(batches.y, idx), batches.mask[rows, k]
        if written_out is not None:
            grads, losses = written_out(model.batched_params(x), inputs, targets, mask)
            return _flat(model, x, grads), losses
        # vmap of the forward pass only, then one ordinary backward of the summed losses: the clients are
        # independent, so each row's gradient is its own client's; ~15% faster than vmap(grad(...)) on
        # CPU for small models, where the transform's per-call overhead dominates. Each parameter is its
        # own leaf (a [C, ...] view of x): autograd through slices of one flat leaf would zero-fill and
        # add a [C, d] tensor per parameter
        noise = [] if dropout is None else dropout.noise(seeds, counts, rows, k, batches.slots, x)
        with torch.enable_grad():
            leaves = {name: view.detach().requires_grad_(True) for name, view in model.batched_params(x).items()}
            losses = batched_loss(leaves, inputs, targets, mask, noise)
            grads = torch.autograd.grad(losses.sum(), list(leaves.values()))
        if dropout is not None:
            dropout.feed = None
        return _flat(model, x, dict(zip(leaves, grads, strict=True))), losses.detach()

    return oracle


def _flat(model: FlatModel, x: Tensor, grads: dict[str, Tensor]) -> Tensor:
    """The parameters' gradients ``[C, *shape]`` as one ``[C, d]`` (each copied once into its columns)."""
    g = x.new_empty(x.shape)
    for name, view in model.batched_params(g).items():
        view.copy_(grads[name])
    return g


def rows_of(values: Tensor, idx: Tensor) -> Tensor:
    """``values[idx]`` (``[*idx.shape, ...]``, rows of the first dimension) as one index_select of the flattened
    index: the same copy, without advanced indexing's general kernel (a chunk's examples on W2's CPU, 64 x 50 rows
    of 32 floats: 19 us instead of 82)."""
    return values.index_select(0, idx.reshape(-1)).view(*idx.shape, *values.shape[1:])


@dataclass(frozen=True)
class Chunks:
    """The shapes of the ``batched`` strategy's calls: ``size`` rows each, the first ``real`` of them clients,
    the others padding (copies of the chunk's first client with every step masked out).

    The padding rows at the end of every chunk matter twice: each kernel sees the same shapes whatever
    clients share a call, and no client's values fall in the last elements of a [size, d] tensor, which
    PyTorch's vectorized CPU loops hand to a scalar loop whose rounding may differ (measured: 3.7e-9 on a
    client-Adam step); ``size - real`` rows hold at least :data:`TAIL` elements.

    ``fitted`` chunks (:func:`fitted_chunks`: a model whose kernels give a client the same bits in a call of
    any number of rows) make the last call of a block only as large as its clients and padding need, rounded
    up to :data:`FIT` rows: 100 clients are one call of 104 rows, not two of 64."""

    size: int
    real: int
    fitted: bool = False
    _placed: dict[tuple[int, torch.device], ChunkRows] = field(default_factory=dict, init=False, compare=False,
                                                              repr=False)

    @staticmethod
    def of(size: int, dim: int, fitted: bool = False) -> Chunks:
        """Chunks of ``size`` rows for d = ``dim`` (at least twice the padding rows, for tiny models)."""
        pad = -(-TAIL // dim)
        size = max(size, 2 * pad)
        return Chunks(size, size - pad, fitted)

    def groups(self, count: int) -> list[tuple[int, int]]:
        """For ``count`` clients, each call's (padded rows, clients): full calls, then the last one (fitted:
        its clients and at least ``size - real`` padding rows, rounded up to :data:`FIT`)."""
        full, rest = divmod(count, self.real)
        last = [] if not rest else [(min(self.size, -(-(rest + self.size - self.real) // FIT) * FIT)
                                     if self.fitted else self.size, rest)]
        return [(self.size, self.real)] * full + last

    def layout(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """For ``count`` clients: the client each padded row copies and which rows are clients (both
        ``[padded rows]``, on the host; the clients' rows in their order)."""
        sources, lives, first = [], [], 0
        for rows, clients in self.groups(count):
            j = np.arange(rows)
            live = j < clients
            sources.append(np.where(live, first + j, first))
            lives.append(live)
            first += clients
        if not sources:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
        return np.concatenate(sources), np.concatenate(lives)

    def placed(self, count: int, device: torch.device) -> ChunkRows:
        """:meth:`layout` of ``count`` clients with its index tensors on ``device``, built once per (count,
        device): a run's steps mostly train the same number of clients, and the oracle and the solver of every
        step both ask (read-only: shared by every step that asks)."""
        key = (count, device)
        if key not in self._placed:
            if len(self._placed) >= PLACED:
                self._placed.clear()
            source, live = self.layout(count)
            to = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
            ends = np.cumsum([0] + [rows for rows, _ in self.groups(count)])
            self._placed[key] = ChunkRows(source, live, to(source), to(live), to(np.flatnonzero(live)),
                                          [slice(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:], strict=True)])
            for host in (source, live):
                host.flags.writeable = False
        return self._placed[key]


@dataclass(frozen=True)
class ChunkRows:
    """The padded rows of :meth:`Chunks.layout` for one number of clients: the client each row copies and which
    rows are clients, on the host and on the device, the clients' rows as an index, and each call's rows."""

    source_host: np.ndarray  # [padded rows]
    live_host: np.ndarray  # [padded rows] bool
    source: Tensor
    live: Tensor
    live_rows: Tensor  # int64: the positions of the clients' rows (an index, not a mask)
    calls: list[slice]  # the padded rows of each call, in order


def chunked_oracle(model: FlatModel, loss_fn: LossFn, batches: Batches, chunks: Chunks,
                   seeds: DropoutSeeds | None = None) -> Oracle:
    """vmap's oracle on the fixed shapes of ``chunks``, for the padded rows of :meth:`Chunks.layout`: every
    step is padded to ``batches.slots`` example slots, and every slot of a padding row is masked out (and
    draws no dropout noise)."""
    placed = chunks.placed(batches.index.shape[0], batches.index.device)
    source_host, live_host, source, live = placed.source_host, placed.live_host, placed.source, placed.live
    index, mask = rows_of(batches.index, source), rows_of(batches.mask, source) & live[:, None, None]
    pad = batches.slots - index.shape[2]
    if pad:  # the first example repeated (a valid row), masked out
        index = torch.cat([index, index[:, :, :1].expand(-1, -1, pad)], dim=2)
        mask = torch.cat([mask, mask.new_zeros(*mask.shape[:2], pad)], dim=2)
    sizes = np.asarray(batches.sizes)[source_host] * live_host[:, None]  # a padding row's steps take no examples
    padded = Batches(index=index, mask=mask, sizes=sizes, steps=batches.steps, x=batches.x, y=batches.y,
                     slots=batches.slots)
    return vmap_oracle(model, loss_fn, padded, None if seeds is None else seeds.rows(source_host))


def fitted_chunks(model: FlatModel, loss_fn: LossFn, batches: Batches, fixed: Chunks) -> Chunks | None:
    """Fitted chunks of :data:`FITTED_CHUNK` rows (``fixed``'s where a call's examples would exceed
    :data:`FITTED_BYTES`) for this model on this machine, or None (keep ``fixed``).

    Only a model with a written-out gradient (:func:`written_out_gradient`: per-client batched products and
    per-row losses, with no vmap or convolution whose algorithm follows the batch) on a CPU qualifies, and only
    if this machine's kernels show it: probe clients drawn from ``batches``' examples (some short, one empty)
    get every bit of their gradients and losses in a call of each size a fitted chunk can take (:data:`FIT`
    rows up to the chunk's) equal to those of the ``fixed`` chunks' calls. Those bits are the fixed chunks'
    bits, so a rank whose kernels fail the check keeps fixed chunks and the run keeps its bits on any number of
    ranks. Checked once per strategy (about 20 calls, a few milliseconds for W2)."""
    gradient = written_out_gradient(model, loss_fn)
    if (gradient is None or batches.x.device.type != "cpu" or not batches.x.is_floating_point()
            or model.dim > LARGE or not len(batches.x)):
        return None
    example_bytes = batches.x[0].numel() * batches.x.element_size()
    size = FITTED_CHUNK if FITTED_CHUNK * batches.slots * example_bytes <= FITTED_BYTES else fixed.size
    fitted = Chunks.of(size, model.dim, fitted=True)
    clients, slots = fitted.real, batches.slots
    gen = torch.Generator().manual_seed(0)
    index = torch.randint(0, len(batches.x), (clients, slots), generator=gen)
    mask = torch.ones(clients, slots, dtype=torch.bool)
    mask[1, slots // 2:], mask[2] = False, False  # a short client and an empty one
    x = 0.1 * torch.randn(clients, model.dim, generator=gen).to(batches.x.dtype)

    def call(rows: int, members: np.ndarray) -> tuple[Tensor, Tensor]:
        """The gradients and losses of clients ``members`` in one call of ``rows`` rows (padding: the first)."""
        source = torch.from_numpy(np.concatenate([members, np.full(rows - len(members), members[0])]))
        live = torch.arange(rows) < len(members)
        points, idx = x[source], index[source]
        grads, losses = gradient(model.batched_params(points), rows_of(batches.x, idx), rows_of(batches.y, idx),
                                 mask[source] & live[:, None])
        return _flat(model, points, grads)[:len(members)], losses[:len(members)]

    members = np.arange(clients)
    reference = [call(fixed.size, members[start:start + fixed.real]) for start in range(0, clients, fixed.real)]
    g_ref, loss_ref = (torch.cat(parts) for parts in zip(*reference, strict=True))
    for rows in range(FIT, fitted.size + 1, FIT):
        members = np.arange(min(clients, rows - (fitted.size - fitted.real)))
        if not len(members):
            continue
        g, loss = call(rows, members)
        if not (torch.equal(g, g_ref[:len(members)]) and torch.equal(loss, loss_ref[:len(members)])):
            return None
    return fitted


def chunk_size(device: torch.device, dim: int) -> int:
    """Rows per call of the ``batched`` strategy: a function of the device type and the model's size, never
    of the number of ranks or of the cohort, so that every run of a model on a device type calls the same
    kernel shapes."""
    return CHUNK["cuda" if device.type == "cuda" else "cpu", dim > LARGE]
