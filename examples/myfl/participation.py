"""A participation pattern with state: S clients per round, uniformly among those NOT active in the round
before (the last round's mask is the state the checkpoint saves)."""

from __future__ import annotations

import numpy as np

from fedrun.config import ParticipationConfig
from fedrun.errors import require
from fedrun.federation.participation import Participation, round_rng


class NoRepeat(Participation):
    name = "no_repeat"
    stateful = True  # round t depends on round t-1: rounds are drawn in order

    @classmethod
    def from_config(cls, cfg: ParticipationConfig, num_clients: int, seed: int, rounds: int) -> NoRepeat:
        return cls(num_clients, seed, cfg.clients_per_round)

    def __init__(self, num_clients: int, seed: int, clients_per_round: int) -> None:
        super().__init__(num_clients, seed)
        require(1 <= clients_per_round <= num_clients // 2, "participation.clients_per_round",
                f"an integer in [1, N/2 = {num_clients // 2}] for pattern no_repeat", clients_per_round)
        self.clients_per_round = clients_per_round
        self.last = np.zeros(num_clients, dtype=bool)

    def _draw(self, t: int) -> np.ndarray:
        idle = np.flatnonzero(~self.last)
        mask = np.zeros(self.num_clients, dtype=bool)
        # the draw is a function of (seed, t) and the state: every rank draws the same clients
        mask[round_rng(self.seed, t).choice(idle, self.clients_per_round, replace=False)] = True
        self.last = mask
        return mask

    def max_active(self) -> int:
        return self.clients_per_round

    def _state(self) -> dict[str, np.ndarray]:
        return {"last": self.last.copy()}

    def _load_state(self, d: dict[str, np.ndarray]) -> None:
        self.last = self._vector(d, "last", bool)

    def _reset(self) -> None:
        self.last = np.zeros(self.num_clients, dtype=bool)
