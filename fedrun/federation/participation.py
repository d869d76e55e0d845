"""Participation patterns (minimal set; the participation work extends it): full, uniform."""

from __future__ import annotations

import numpy as np

from fedrun.config import ConfigError, ParticipationConfig


class Participation:
    def __init__(self, num_clients: int, seed: int) -> None:
        self.num_clients = num_clients
        self.seed = seed

    def active(self, t: int) -> np.ndarray:
        raise NotImplementedError

    def probabilities(self, t: int) -> np.ndarray | None:
        return None

    def state_dict(self) -> dict[str, np.ndarray]:
        return {}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        pass


class Full(Participation):
    def active(self, t: int) -> np.ndarray:
        return np.ones(self.num_clients, dtype=bool)


class Uniform(Participation):
    def __init__(self, num_clients: int, seed: int, s: int) -> None:
        super().__init__(num_clients, seed)
        self.s = s

    def active(self, t: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, t, 0xCA5E1])
        out = np.zeros(self.num_clients, dtype=bool)
        out[rng.choice(self.num_clients, self.s, replace=False)] = True
        return out


def make_participation(cfg: ParticipationConfig, num_clients: int, seed: int, rounds: int) -> Participation:
    if cfg.pattern == "full":
        return Full(num_clients, seed)
    if cfg.pattern == "uniform":
        if cfg.clients_per_round > num_clients:
            raise ConfigError(f"participation.clients_per_round: expected <= data.num_clients={num_clients}")
        return Uniform(num_clients, seed, cfg.clients_per_round)
    raise ConfigError(f"participation.pattern: unknown pattern {cfg.pattern!r}")
