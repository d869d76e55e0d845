"""The one contract through which a part of the run state saves and loads itself (in the spirit of
``torch.distributed.checkpoint.stateful.Stateful``), in two kinds; a checkpoint is a dict ``{group: part}``
written and read by fedrun.checkpoint.collective, one group of the file per part.

* :class:`Stateful`: the part hands out its state as ``state_dict()``, a flat ``{name: value}`` of numpy
  arrays, numbers or strings, and takes it back with ``load_state_dict(state)``; the checkpoint stores its
  values as the datasets ``group/<name>``, each checksummed like any other. Rank 0's state is the one
  written; every rank loads. The schedule, the delay history and the privacy accountant are such parts as
  they are; the run's other fields are wrapped by fedrun.federation.snapshot.
* :class:`StreamingStateful`: the part's state is tables of rows spread over the ranks, too large for one
  rank (the client rows, fedrun.state.part): rank r holds rows ``span`` of every table. Saving streams the
  rows each rank stores to rank 0 a bounded block at a time; loading reads on every rank the rows of its own
  span, so a run can resume on another number of ranks. Table ``name`` is stored as ``group/<name>`` in
  either form of fedrun.checkpoint.entries.

Adding a persisted part is implementing one of the two and naming it in ``fedrun.federation.snapshot.parts``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]:
        """The part's state: ``{name: numpy array, number or str}``."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the state back (raise :class:`CheckpointError` when it does not fit this run)."""


@runtime_checkable
class StreamingStateful(Protocol):
    """Tables of rows spread over the ranks; this rank holds global rows ``span[0] .. span[1] - 1`` of each,
    which it addresses as rows ``0 .. span[1] - span[0] - 1``."""

    span: tuple[int, int]

    def tables(self) -> dict[str, float | None]:
        """Every table's name and initial value when it is one number (a row never stored reads back as it),
        else None."""

    def stored(self, name: str, increment: bool) -> np.ndarray:
        """The rows of table ``name`` a checkpoint stores, ascending: those that may differ from the initial
        value, or in an increment (fedrun.checkpoint.chain) those that changed since the last checkpoint."""

    def rows(self, name: str, rows: np.ndarray) -> Tensor:
        """The values of ``rows`` of table ``name``, ``[len(rows), *row_shape]`` (no rows: the dtype, device and
        row shape)."""

    def load(self, name: str, start: int, values: np.ndarray) -> None:
        """Rows ``start .. start + len(values)`` of table ``name`` from a checkpoint."""

    def checkpointed(self) -> None:
        """A checkpoint holding every stored row is in place (written, or just loaded): count changes afresh."""
