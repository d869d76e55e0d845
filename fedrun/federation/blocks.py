"""Which rank trains which client: contiguous blocks balanced by example count (the owner of a
client's state), or, for algorithms without per-client state, each round's participants split by work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedrun.data.client_block import ClientBlock


@dataclass
class Placement:
    """Where this rank's clients are: the resolved ``run.placement`` (:attr:`mode`), chosen once when the run
    is built, as one of two classes whose :meth:`local_rows` says which of a step's clients this rank trains."""

    mode: ClassVar[str]  # "blocks" or "work" (runtime.json)
    blocks: list[tuple[int, int]]  # [first, stop) client ids owned by each rank (their state lives there)
    block: ClientBlock  # this rank's client data
    rank: int
    size: int

    @property
    def first(self) -> int:
        """Global id of block row 0."""
        return self.block.first

    def local_rows(self, ids: np.ndarray) -> np.ndarray:
        """This rank's share of the clients ``ids`` (sorted global ids), as block rows."""
        raise NotImplementedError


@dataclass
class BlockPlacement(Placement):
    """The rank holds and trains its contiguous block ``blocks[rank]``, whose clients' state it owns."""

    mode = "blocks"

    def local_rows(self, ids: np.ndarray) -> np.ndarray:
        first, stop = self.blocks[self.rank]
        return ids[(ids >= first) & (ids < stop)] - first


@dataclass
class WorkPlacement(Placement):
    """The rank holds every client's data (``block`` is all of them) and trains its share of each step's
    clients, split by their ``work`` (:func:`split_by_work`); for algorithms without per-client state."""

    mode = "work"
    work: np.ndarray  # per-client work (examples x steps)

    def local_rows(self, ids: np.ndarray) -> np.ndarray:
        return split_by_work(ids, self.work[ids], self.size)[self.rank]


def assign_blocks(num_examples: np.ndarray, ranks: int) -> list[tuple[int, int]]:
    """``[(first, stop), ...]`` per rank: contiguous client ranges with near-equal example totals.

    Client i goes to the rank whose share of the cumulative example count contains the midpoint of
    its examples; every rank gets at least one client.
    """
    n = len(num_examples)
    if n < ranks:
        raise ValueError(f"data.num_clients={n}: fewer clients than the {ranks} ranks; use fewer ranks")
    total = float(num_examples.sum())
    mid = np.cumsum(num_examples) - num_examples / 2.0
    owner = np.minimum((mid / total * ranks).astype(int), ranks - 1)
    starts = np.searchsorted(owner, np.arange(ranks), side="left")
    # every rank must own >= 1 client: push empty ranks' starts forward/backward as needed
    starts = np.maximum(starts, np.arange(ranks))
    starts = np.minimum(starts, n - (ranks - np.arange(ranks)))
    for r in range(1, ranks):
        starts[r] = max(starts[r], starts[r - 1] + 1)
    bounds = list(starts) + [n]
    return [(int(bounds[r]), int(bounds[r + 1])) for r in range(ranks)]


def round_work(num_examples: np.ndarray, batch_size: int, steps: int, epochs: int | None) -> np.ndarray:
    """Examples each client processes in one round, the unit of work: K min(B, n_i) local steps of a
    fixed count, or epochs * n_i."""
    if epochs is not None:
        return epochs * num_examples
    return steps * np.minimum(batch_size, num_examples)


def split_by_work(ids: np.ndarray, work: np.ndarray, ranks: int) -> list[np.ndarray]:
    """The round's participants ``ids`` (with their ``work``) split over ``ranks`` so that the ranks finish
    together: largest work first, each to the least loaded rank (ties: lower rank; equal work: lower id).
    Deterministic, so every rank computes the same split; each share is sorted by id."""
    order = np.lexsort((ids, -work))
    owner = np.empty(len(ids), dtype=np.int64)
    if len(ids) and work.min() == work.max():  # equal work: the greedy rule deals round-robin
        owner[order] = np.arange(len(ids)) % ranks
    else:
        load = np.zeros(ranks, dtype=np.int64)
        for i in order:
            r = int(np.argmin(load))
            owner[i] = r
            load[r] += work[i]
    return [np.sort(ids[owner == r]) for r in range(ranks)]
