"""A participation pattern with state and its own settings: S clients per round, uniformly among those that
sat out the last ``participation.cooldown`` rounds (each client's last active round is the state the
checkpoint saves)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedrun.config import ParticipationConfig
from fedrun.errors import require
from fedrun.federation.participation import Participation, round_rng


@dataclass
class NoRepeatSettings:
    """Every field is a config key under ``participation:``, type-checked like a built-in's."""

    cooldown: int = 1  # rounds a client sits out after taking part

    def check(self) -> None:
        require(self.cooldown >= 0, "participation.cooldown", "an integer >= 0", self.cooldown)


class NoRepeat(Participation):
    name = "no_repeat"
    stateful = True  # round t depends on the rounds before: rounds are drawn in order
    Settings = NoRepeatSettings

    @classmethod
    def from_config(cls, cfg: ParticipationConfig, num_clients: int, seed: int, rounds: int) -> NoRepeat:
        return cls(num_clients, seed, cfg.clients_per_round, cfg.settings.cooldown)

    def __init__(self, num_clients: int, seed: int, clients_per_round: int, cooldown: int) -> None:
        super().__init__(num_clients, seed)
        most = num_clients // (cooldown + 1)  # at most S * cooldown clients are resting in any round
        require(1 <= clients_per_round <= most, "participation.clients_per_round",
                f"an integer in [1, N / (cooldown + 1) = {most}] for pattern no_repeat", clients_per_round)
        self.clients_per_round = clients_per_round
        self.cooldown = cooldown
        self._reset()

    def _draw(self, t: int) -> np.ndarray:
        rested = np.flatnonzero(t - self.last_active > self.cooldown)
        mask = np.zeros(self.num_clients, dtype=bool)
        # the draw is a function of (seed, t) and the state: every rank draws the same clients
        mask[round_rng(self.seed, t).choice(rested, self.clients_per_round, replace=False)] = True
        self.last_active[mask] = t
        return mask

    def max_active(self) -> int:
        return self.clients_per_round

    def state_dict(self) -> dict[str, np.ndarray]:
        return super().state_dict() | {"last_active": self.last_active.copy()}  # saved under schedule/

    def load_state_dict(self, d: dict[str, np.ndarray]) -> None:
        super().load_state_dict(d)  # the round drawn next
        self.last_active = self._vector(d, "last_active", np.int64)

    def _reset(self) -> None:
        self.last_active = np.full(self.num_clients, -(1 << 40), dtype=np.int64)  # never active
