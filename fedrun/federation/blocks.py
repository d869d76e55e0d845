"""Contiguous client blocks per rank, balanced by example count."""

from __future__ import annotations

import numpy as np


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
