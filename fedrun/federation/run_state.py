"""The run state: everything a checkpoint holds, which the rounds advance (the run is exactly this plus its
config). Built by :func:`fedrun.federation.build.build`, advanced by :meth:`fedrun.federation.rounds.Round.run`,
saved and loaded by :mod:`fedrun.federation.snapshot`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from fedrun.checkpoint.chain import ChainTip
from fedrun.federation.delay import DelayTracker
from fedrun.federation.schedule import Schedule
from fedrun.privacy.mechanism import PrivacyState
from fedrun.state.rows import ClientRows
from fedrun.training.local_strategy import LocalStrategy


@dataclass
class RunState:
    """Everything a checkpoint holds: the run is exactly this plus the config.

    ``server`` lives on rank 0 only; ``clients`` holds this rank's block rows of every per-client entry
    and of the rows the schedule holds uploads in (:meth:`~fedrun.federation.schedule.Schedule.held_entries`)."""

    next_round: int
    server: dict[str, Tensor]
    clients: ClientRows
    schedule: Schedule
    delay: DelayTracker
    strategy: LocalStrategy  # the local-training strategy, built once (its name is kept on resume)
    metrics: list[dict[str, Any]] = field(default_factory=list)  # one record per finished round (rank 0)
    chain: ChainTip = field(default_factory=ChainTip)  # what the next increment builds on (fedrun.checkpoint.chain)
    privacy: PrivacyState | None = None  # the privacy accountant and the current clip (privacy.mode != none)
