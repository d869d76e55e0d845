"""The one interface through which a part of the run state saves and loads itself (in the spirit of
``torch.distributed.checkpoint.stateful.Stateful``).

A part hands out its state as ``state_dict()``, a flat ``{name: value}`` of numpy arrays, numbers or strings,
and takes it back with ``load_state_dict(state)``; the checkpoint stores part ``group``'s values as the
datasets ``group/<name>``, each checksummed like any other. The schedule, the delay history and the privacy
accountant are such parts as they are; the run's other fields are wrapped by fedrun.federation.snapshot.
The client rows are not: they live on every rank and are streamed (fedrun.checkpoint.entries).
"""

from __future__ import annotations

from typing import Any, Protocol

from fedrun.checkpoint.reader import CheckpointReader
from fedrun.checkpoint.writer import CheckpointWriter
from fedrun.errors import CheckpointError


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]:
        """The part's state: ``{name: numpy array, number or str}``."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the state back (raise :class:`CheckpointError` when it does not fit this run)."""


def write_parts(writer: CheckpointWriter, parts: dict[str, Stateful]) -> None:
    """Every part's state into ``writer``, part ``group``'s under ``group/``."""
    for group, part in parts.items():
        for name, value in part.state_dict().items():
            writer.write(f"{group}/{name}", value)


def read_parts(reader: CheckpointReader, parts: dict[str, Stateful]) -> None:
    """Load every part from the datasets of its group in ``reader`` (each read verifies its checksum)."""
    for group, part in parts.items():
        state = {name: reader.read(f"{group}/{name}") for name in reader.names(group)}
        try:
            part.load_state_dict(state)
        except CheckpointError as err:  # the part's state does not fit this run's config
            raise CheckpointError(f"{reader.path}: {err}") from None
