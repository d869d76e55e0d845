"""A rank's client rows as a part of the checkpoint: :class:`ClientRowsPart`, a
:class:`fedrun.checkpoint.stateful.StreamingStateful` over either store (:class:`fedrun.state.rows.ClientRows`).

Its tables are the store's entries, one row per client of the rank's block (global clients ``first .. stop -
1``). A full checkpoint stores the rows that may differ from the entry's declared initial value
(``written``); an increment stores the vector rows changed since the last checkpoint (``changed``), scalar
entries whole. Loaded rows take the run's dtype and device.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedrun.protocol import Vector
from fedrun.state.rows import ClientRows
from fedrun.state.store import constant_init


class ClientRowsPart:
    """The client rows of ``store``, the block of clients ``span`` (first, stop), as one checkpoint part."""

    def __init__(self, store: ClientRows, span: tuple[int, int], device: torch.device, dtype: torch.dtype) -> None:
        self.store, self.span, self.device, self.dtype = store, span, device, dtype
        self.vectors = {e.name for e in store.entries if isinstance(e, Vector)}

    def tables(self) -> dict[str, float | None]:
        return {e.name: constant_init(e) for e in self.store.entries}

    def stored(self, name: str, increment: bool) -> np.ndarray:
        return np.flatnonzero(self.store.changed(name) if increment and name in self.vectors
                              else self.store.written(name))

    def rows(self, name: str, rows: np.ndarray) -> Tensor:
        if len(rows) == 0 or rows[-1] - rows[0] == len(rows) - 1:  # consecutive rows: a slice, not a copy
            start = int(rows[0]) if len(rows) else 0
            return self.store.block(name, start, start + len(rows)).contiguous()
        return self.store.gather(torch.as_tensor(rows, device=self.device), [name])[name]

    def load(self, name: str, start: int, values: np.ndarray) -> None:
        self.store.load(name, start, torch.as_tensor(np.asarray(values), device=self.device).to(self.dtype))

    def checkpointed(self) -> None:
        self.store.checkpointed()
