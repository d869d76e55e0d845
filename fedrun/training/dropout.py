"""Dropout with per-client random streams, for one client at a time and for a batched block of clients.

A client's dropout masks come from its own stream: before each local step k of client i the generator is
re-seeded from (seed, round, i, k) (:meth:`DropoutSeeds.reseed`), and the model's dropout layers then draw
in the order of its forward pass. A dropout layer with drop rate p computes, on its input a of shape
[b, ...] (torch's CPU kernel)

    noise = bernoulli(1 - p) / (1 - p)     of shape [b, ...], or [b, C, 1, ...] for Dropout1d/2d/3d
    y     = a * noise

(CUDA's fused kernel computes ``a * m * (1 / (1 - p))`` with a 0/1 mask m drawn for a's shape: for m = 1
the same single rounding of ``a * (1 / (1 - p))``, and m depends only on the generator state, the shape
and the memory alignment, which a fresh tensor of the same shape shares)

so a client's draws never depend on who trains beside it, and the run is the same on any number of ranks.

A batched block (``vmap`` over the clients) cannot draw inside the batched call: one generator would serve
every client. :class:`BlockDropout` draws outside it instead, client by client in the block's order: it
re-seeds as above and calls each of the model's dropout layers itself, in forward order, on ones of the
client's shape at that layer (``1 * noise = noise`` exactly, whatever kernel the device runs), and hands
the stacked noise to a copy of the model whose dropout layers multiply their input by it, ``y = a * noise``:
the product the layer computes for that client trained alone, element for element. Padding rows and
example slots get noise 1 (their loss is masked out). The shapes at each layer come from one forward pass
of one example at start (:meth:`BlockDropout.of`); a layer's input must have the examples first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from fedrun.data.hashing import hash_keys
from fedrun.training.flat_model import sharing_copy

# the dropout layers whose output is their input times a noise tensor (AlphaDropout adds an affine shift)
MULTIPLICATIVE = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)


@dataclass(frozen=True)
class DropoutSeeds:
    """For a model that draws random numbers (dropout): the generator is re-seeded from (seed, round, client,
    step) before every client's step, so that a client's draws never depend on who trains beside it.
    ``client_ids``: the global ids of the block's rows."""

    client_ids: np.ndarray
    seed: int
    round_: int

    def reseed(self, row: int, k: int) -> None:
        """Seed torch's generators (every device's) for step ``k`` of block row ``row``."""
        torch.manual_seed(int(hash_keys(self.seed, self.round_, self.client_ids[row], k) >> np.uint64(1)))

    def streams(self, k: int) -> np.ndarray:
        """Every row's seed for step ``k`` (what :meth:`reseed` seeds, hashed for all rows at once)."""
        return (hash_keys(self.seed, self.round_, self.client_ids, k) >> np.uint64(1)).astype(np.int64)

    def rows(self, source: np.ndarray) -> DropoutSeeds:
        """The seeds of the block rows ``source`` (the rows of a padded chunk layout, on the host)."""
        return DropoutSeeds(self.client_ids[np.asarray(source)], self.seed, self.round_)


def unbatchable_dropout(module: nn.Module) -> str | None:
    """The first dropout layer of ``module`` whose output is not its input times a noise tensor (AlphaDropout),
    ``"name (Type)"``, or None: a batched block refuses such a model (fedrun.training.strategy)."""
    for name, layer in module.named_modules():
        if isinstance(layer, nn.modules.dropout._DropoutNd) and not isinstance(layer, MULTIPLICATIVE):
            return f"{name} ({type(layer).__name__})"
    return None


class _Fed(nn.Module):
    """Stands for dropout ``layer`` in :class:`BlockDropout`'s copy of the model: multiplies its input by the
    next noise tensor of the call, or, while the shapes are probed, records its input's shape."""

    def __init__(self, layer: nn.Module, owner: BlockDropout) -> None:
        super().__init__()
        self.layer = layer
        self.owner = [owner]  # a list: not a submodule

    def forward(self, a: Tensor) -> Tensor:
        owner = self.owner[0]
        if owner.feed is None:
            owner.sites.append((self.layer, tuple(a.shape[1:])))
            return a
        noise = owner.feed.pop(0)
        if noise.shape != a.shape:
            raise RuntimeError(f"batched dropout: a layer's input is {tuple(a.shape)}, its noise "
                               f"{tuple(noise.shape)}; the examples must come first")
        return a * noise


class BlockDropout:
    """Each client's dropout noise for a batched block, drawn from the client's own stream (module doc).
    ``module``: the copy of the model to call under vmap (parameters and buffers shared with the model)."""

    def __init__(self, module: nn.Module) -> None:
        self.sites: list[tuple[nn.Module, tuple[int, ...]]] = []  # (dropout layer, input shape per example)
        self.feed: list[Tensor] | None = None
        self.module = sharing_copy(module)
        for child in list(self.module.modules()):
            for key, layer in list(child.named_children()):
                if isinstance(layer, nn.modules.dropout._DropoutNd):
                    setattr(child, key, _Fed(layer, self))

    @staticmethod
    def of(module: nn.Module, example: Tensor) -> BlockDropout:
        """The dropout of ``module``, its shapes probed on one ``example`` ``[1, ...]`` (in eval mode: no
        draw, no buffer updated)."""
        out = BlockDropout(module)
        modes = [m.training for m in out.module.modules()]
        out.module.eval()
        with torch.no_grad():
            out.module(example)
        for m, mode in zip(out.module.modules(), modes, strict=True):
            m.training = mode
        return out

    def noise(self, seeds: DropoutSeeds, counts: np.ndarray, rows: slice, k: int, slots: int,
              like: Tensor) -> list[Tensor]:
        """Step ``k``'s noise of every site for block ``rows``, ``[rows, slots, *shape]`` in ``like``'s dtype and
        device: row r with ``counts[r, k]`` examples draws from its own stream (``seeds.reseed(r, k)``) as that
        client alone would; the other slots (and rows without examples) are 1."""
        out = [like.new_ones(rows.stop - rows.start, slots, *shape) for _, shape in self.sites]
        streams = seeds.streams(k)
        # the generator the layers draw from on like's device, seeded as torch.manual_seed seeds it (which
        # costs ~0.4 ms a call on a CPU, most of it for device types the run does not use)
        generator = torch.default_generator if like.device.type == "cpu" else \
            torch.cuda.default_generators[like.device.index]
        with torch.no_grad():
            for j, r in enumerate(range(rows.start, rows.stop)):
                b = int(counts[r, k])
                if b == 0:
                    continue
                generator.manual_seed(int(streams[r]))
                for noise, (layer, shape) in zip(out, self.sites, strict=True):
                    noise[j, :b] = layer(like.new_ones(b, *shape))
        return out
