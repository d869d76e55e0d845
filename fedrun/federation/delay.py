"""Delay metrics of ALGORITHMS.md 1.2 (minimal; the participation work extends it)."""

from __future__ import annotations

import numpy as np


class DelayTracker:
    def __init__(self, num_clients: int) -> None:
        self.last_active = np.full(num_clients, -1, dtype=np.int64)
        self.participations = np.zeros(num_clients, dtype=np.int64)
        self.rounds = 0
        self.tau_max = 0
        self.tau_sum = 0.0
        self.tau_client_sum = 0.0

    def update(self, active: np.ndarray) -> dict[str, float]:
        t = self.rounds
        self.last_active[active] = t
        self.participations[active] += 1
        gaps = t - self.last_active
        tau_t = int(gaps.max())
        self.rounds += 1
        self.tau_max = max(self.tau_max, tau_t)
        self.tau_sum += tau_t
        self.tau_client_sum += float(gaps.mean())
        return {"tau_t": tau_t, "tau_max": self.tau_max, "tau_avg": self.tau_sum / self.rounds,
                "tau_avg_client": self.tau_client_sum / self.rounds}
