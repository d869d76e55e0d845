"""Delay (staleness) metrics of a participation sequence (docs/participation.md).

For round t (0-based) with active set S_t::

    a_{i,t} = max{ j <= t : i in S_j }   (-1 if client i has not participated in rounds 0..t)
    tau_t   = max_i (t - a_{i,t})        (an active client has delay 0)
    tau_max = max_{s <= t} tau_s
    tau_avg = (1/(t+1)) sum_{s <= t} tau_s                             (primary, fedrun's choice)
    tau_avg_client = (1/(N (t+1))) sum_{s <= t} sum_i (s - a_{i,s})   (alternative, logged too)

All counters are int64, so resuming from ``state_dict`` continues bit for bit.
"""

from __future__ import annotations

import numpy as np


class DelayTracker:
    """Feed one active mask per round, in order, with :meth:`update`.

    ``update(active)`` handles round ``t = self.round`` (the number of updates so far). Before the call,
    ``last_active`` holds ``a_{i,t-1}`` (the last round each client took part in, before this round);
    after it, ``last_active`` holds ``a_{i,t}`` and ``last_active_before`` keeps the ``a_{i,t-1}`` of the
    round just processed (what algorithms needing "the round of the previous participation", such as
    FedSUM-CR's a_i or FedAU's interval, want). ``participations`` counts rounds each client was active.
    """

    def __init__(self, num_clients: int) -> None:
        if num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {num_clients}")
        self.num_clients = int(num_clients)
        self._last_active = np.full(self.num_clients, -1, dtype=np.int64)
        self._last_active_before = self._last_active.copy()
        self._participations = np.zeros(self.num_clients, dtype=np.int64)
        self._round = 0  # rounds processed so far = index of the next round
        self._tau_t = 0
        self._tau_max = 0
        self._tau_sum = 0  # sum of tau_t over processed rounds
        self._client_delay_sum = 0  # sum over processed rounds and clients of (t - a_{i,t})

    # properties ----------------------------------------------------------------------------------------
    @property
    def round(self) -> int:
        """Number of rounds processed; the next :meth:`update` is for this round index."""
        return self._round

    @property
    def last_active(self) -> np.ndarray:
        """int64 [N]: last round each client was active, -1 = never (after the latest update)."""
        return self._last_active.copy()

    @property
    def last_active_before(self) -> np.ndarray:
        """int64 [N]: ``last_active`` as it was before the latest update (a_{i,t-1} for that round t)."""
        return self._last_active_before.copy()

    def of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``participations`` and ``last_active`` of the clients ``ids`` only (copies of their entries, without
        copying all N: the rules' view of a round's clients)."""
        return self._participations[ids], self._last_active[ids]

    @property
    def participations(self) -> np.ndarray:
        """int64 [N]: number of rounds each client has been active in."""
        return self._participations.copy()

    def delays(self) -> np.ndarray:
        """int64 [N]: ``t - a_{i,t}`` for the latest processed round t (all zeros before any update)."""
        if self._round == 0:
            return np.zeros(self.num_clients, dtype=np.int64)
        return (self._round - 1) - self._last_active

    def metrics(self) -> dict[str, float | int]:
        """The metrics after the latest update (the same dict :meth:`update` returned)."""
        rounds = max(self._round, 1)
        return {
            "round": self._round - 1,
            "tau_t": int(self._tau_t),
            "tau_max": int(self._tau_max),
            "tau_avg": self._tau_sum / rounds,
            "tau_avg_client": self._client_delay_sum / (rounds * self.num_clients),
        }

    # update --------------------------------------------------------------------------------------------
    def update(self, active: np.ndarray) -> dict[str, float | int]:
        """Record round ``t = self.round`` with bool mask ``active`` [N]; return this round's metrics.

        Keys: ``round`` (t), ``tau_t``, ``tau_max`` (running max), ``tau_avg`` (mean of tau over rounds
        0..t), ``tau_avg_client`` (mean over clients and rounds 0..t of t - a_{i,t}).
        """
        active = np.asarray(active)
        if active.shape != (self.num_clients,) or active.dtype != bool:
            raise ValueError(f"active must be a bool array of shape ({self.num_clients},), "
                             f"got {active.dtype} {active.shape}")
        t = self._round
        self._last_active_before = self._last_active.copy()
        self._last_active[active] = t
        self._participations += active
        delay = t - self._last_active
        self._tau_t = int(delay.max())
        self._tau_max = max(self._tau_max, self._tau_t)
        self._tau_sum += self._tau_t
        self._client_delay_sum += int(delay.sum())
        self._round = t + 1
        return self.metrics()

    # checkpoint ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        scalar = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
        return {
            "last_active": self._last_active.copy(),
            "last_active_before": self._last_active_before.copy(),
            "participations": self._participations.copy(),
            "round": scalar(self._round),
            "tau_t": scalar(self._tau_t),
            "tau_max": scalar(self._tau_max),
            "tau_sum": scalar(self._tau_sum),
            "client_delay_sum": scalar(self._client_delay_sum),
        }

    def load_state_dict(self, d: dict[str, np.ndarray]) -> None:
        for key in ("last_active", "last_active_before", "participations"):
            value = np.asarray(d[key])
            if value.shape != (self.num_clients,):
                raise ValueError(f"delay state: {key!r} has shape {value.shape}, "
                                 f"expected ({self.num_clients},)")
        self._last_active = np.asarray(d["last_active"], dtype=np.int64).copy()
        self._last_active_before = np.asarray(d["last_active_before"], dtype=np.int64).copy()
        self._participations = np.asarray(d["participations"], dtype=np.int64).copy()
        self._round = int(np.asarray(d["round"]))
        self._tau_t = int(np.asarray(d["tau_t"]))
        self._tau_max = int(np.asarray(d["tau_max"]))
        self._tau_sum = int(np.asarray(d["tau_sum"]))
        self._client_delay_sum = int(np.asarray(d["client_delay_sum"]))
