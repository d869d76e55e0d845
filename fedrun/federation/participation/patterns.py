"""The built-in participation patterns (docs/participation.md): full, uniform, Bernoulli, sine, cyclic,
reshuffled cyclic, Markov and trace replay."""

from __future__ import annotations

import numpy as np

from fedrun.federation.participation.base import STREAM_FIXED_PERMUTATION, Participation, round_rng

BIASED_FLOOR = 0.05  # H.8 probabilities are clipped at this value for clients beyond 110


class Full(Participation):
    """Every client in every round."""

    name = "full"

    def _draw(self, t: int) -> np.ndarray:
        return np.ones(self.num_clients, dtype=bool)

    def probabilities(self, t: int) -> np.ndarray:
        return np.ones(self.num_clients)


class Uniform(Participation):
    """Case 1: exactly S clients, uniformly without replacement, every round."""

    name = "uniform"
    sampling = "without_replacement"

    def __init__(self, num_clients: int, seed: int, clients_per_round: int) -> None:
        super().__init__(num_clients, seed)
        if not 1 <= clients_per_round <= num_clients:
            raise ValueError(f"clients_per_round must be in [1, {num_clients}], got {clients_per_round}")
        self.clients_per_round = int(clients_per_round)

    def _draw(self, t: int) -> np.ndarray:
        mask = np.zeros(self.num_clients, dtype=bool)
        mask[round_rng(self.seed, t).choice(self.num_clients, self.clients_per_round, replace=False)] = True
        return mask

    def max_active(self) -> int:
        return self.clients_per_round

    def probabilities(self, t: int) -> np.ndarray:
        return np.full(self.num_clients, self.clients_per_round / self.num_clients)


class Bernoulli(Participation):
    """Case 2: client i joins round t independently with probability p_i^t (``_p(t)``)."""

    name = "bernoulli"
    sampling = "poisson"

    def __init__(self, num_clients: int, seed: int, p: float | np.ndarray = 0.1) -> None:
        super().__init__(num_clients, seed)
        p = np.broadcast_to(np.asarray(p, dtype=np.float64), (num_clients,)).copy()
        if not np.all((p >= 0) & (p <= 1)):
            raise ValueError("probabilities must lie in [0, 1]")
        self.p = p

    def _p(self, t: int) -> np.ndarray:
        return self.p

    def _draw(self, t: int) -> np.ndarray:
        return round_rng(self.seed, t).random(self.num_clients) < self._p(t)

    def probabilities(self, t: int) -> np.ndarray:
        return self._p(int(t)).copy()


class Sine(Bernoulli):
    """Case 2 with ``p_i^t = base_i * (amplitude * sin(2 pi t / period) + offset)`` (P3 generalized)."""

    name = "sine"

    def __init__(self, num_clients: int, seed: int, base: float | np.ndarray, amplitude: float = 0.3,
                 offset: float = 0.7, period: float = 10.0) -> None:
        super().__init__(num_clients, seed, base)
        if period <= 0:
            raise ValueError(f"period must be > 0, got {period}")
        if offset < abs(amplitude):
            raise ValueError(f"offset must be >= |amplitude| (got {offset}, {amplitude})")
        if np.max(self.p) * (offset + abs(amplitude)) > 1 + 1e-12:
            raise ValueError("base * (offset + |amplitude|) exceeds 1: not a probability")
        self.amplitude, self.offset, self.period = float(amplitude), float(offset), float(period)

    def _p(self, t: int) -> np.ndarray:
        factor = self.amplitude * np.sin(2.0 * np.pi * t / self.period) + self.offset
        return np.clip(self.p * factor, 0.0, 1.0)


def biased_probabilities(num_clients: int, floor: float = BIASED_FLOOR) -> np.ndarray:
    """H.8 (continued past client 33, fedrun's choice): ``p_i = 0.50 - 0.05 floor((i-1)/11)``, 1-based i,
    clipped at ``floor``.

    Up to N = 110 the clip never acts (client 110 gets 0.05); beyond, every client gets ``floor``.
    """
    i = np.arange(1, num_clients + 1)
    return np.maximum(0.50 - 0.05 * ((i - 1) // 11), floor)


class Cyclic(Participation):
    """Case 3: blocks of S consecutive clients of a fixed order, wrapping around."""

    name = "cyclic"

    def __init__(self, num_clients: int, seed: int, clients_per_round: int, shuffle: bool = False) -> None:
        super().__init__(num_clients, seed)
        if not 1 <= clients_per_round <= num_clients:
            raise ValueError(f"clients_per_round must be in [1, {num_clients}], got {clients_per_round}")
        self.clients_per_round = int(clients_per_round)
        if shuffle:
            self.order = round_rng(seed, 0, STREAM_FIXED_PERMUTATION).permutation(num_clients)
        else:
            self.order = np.arange(num_clients)

    def _draw(self, t: int) -> np.ndarray:
        mask = np.zeros(self.num_clients, dtype=bool)
        positions = (t * self.clients_per_round + np.arange(self.clients_per_round)) % self.num_clients
        mask[self.order[positions]] = True
        return mask

    def max_active(self) -> int:
        return self.clients_per_round


class ReshuffledCyclic(Participation):
    """Case 4: blocks of S from a permutation that is redrawn when exhausted (one epoch per permutation).

    Straddling rule (fedrun's choice; S does not divide N): the block that runs past the end of the current
    permutation takes its r remaining clients, draws the new permutation (rng of the current round) and
    completes the block with the first S - r clients of the new permutation that are not already in the
    block. Those S - r clients count as the new epoch's first block: the new permutation is reordered to
    put them first and the pointer set after them, so each epoch still visits every client exactly once.

    State: ``permutation`` (int64 [N]) and ``pointer`` (clients of it already used).
    """

    name = "reshuffled_cyclic"
    stateful = True

    def __init__(self, num_clients: int, seed: int, clients_per_round: int) -> None:
        super().__init__(num_clients, seed)
        if not 1 <= clients_per_round <= num_clients:
            raise ValueError(f"clients_per_round must be in [1, {num_clients}], got {clients_per_round}")
        self.clients_per_round = int(clients_per_round)
        self._reset()

    def max_active(self) -> int:
        return self.clients_per_round

    def _reset(self) -> None:
        self.permutation = np.arange(self.num_clients, dtype=np.int64)
        self.pointer = self.num_clients  # exhausted: round 0 draws the first permutation

    def _draw(self, t: int) -> np.ndarray:
        n, s = self.num_clients, self.clients_per_round
        if self.pointer + s <= n:
            block = self.permutation[self.pointer:self.pointer + s]
            self.pointer += s
        else:
            rest = self.permutation[self.pointer:]
            fresh = round_rng(self.seed, t).permutation(n).astype(np.int64)
            taken = fresh[~np.isin(fresh, rest)][: s - len(rest)]
            block = np.concatenate([rest, taken])
            self.permutation = np.concatenate([taken, fresh[~np.isin(fresh, taken)]])
            self.pointer = len(taken)
        mask = np.zeros(n, dtype=bool)
        mask[block] = True
        return mask

    def probabilities(self, t: int) -> np.ndarray:
        # exchangeable over clients with |S_t| = S, so the unconditional marginal is S/N
        return np.full(self.num_clients, self.clients_per_round / self.num_clients)

    def state_dict(self) -> dict[str, np.ndarray]:
        return super().state_dict() | {"permutation": self.permutation.copy(),
                                       "pointer": np.asarray(self.pointer, dtype=np.int64)}

    def load_state_dict(self, d: dict[str, np.ndarray]) -> None:
        super().load_state_dict(d)
        perm = self._vector(d, "permutation", np.int64)
        if not np.array_equal(np.sort(perm), np.arange(self.num_clients)):
            raise ValueError(f"{self.name} participation state: 'permutation' is not a permutation")
        pointer = int(np.asarray(d.get("pointer", -1)))
        if not 0 <= pointer <= self.num_clients:
            raise ValueError(f"{self.name} participation state: 'pointer' out of range: {pointer}")
        self.permutation, self.pointer = perm, pointer


class Markov(Participation):
    """Per-client two-state on/off chain: off->on with p_on, on->off with p_off (scalars or [N]).

    Round 0 draws each client's state from the stationary distribution ``pi = p_on / (p_on + p_off)``;
    round t >= 1 applies one transition to the state of round t-1. Availability is correlated over time
    (lag-one autocorrelation ``1 - p_on - p_off``). State: ``state`` (bool [N], the last round's mask).
    """

    name = "markov"
    stateful = True

    def __init__(self, num_clients: int, seed: int, p_on: float | np.ndarray,
                 p_off: float | np.ndarray) -> None:
        super().__init__(num_clients, seed)
        self.p_on = np.broadcast_to(np.asarray(p_on, dtype=np.float64), (num_clients,)).copy()
        self.p_off = np.broadcast_to(np.asarray(p_off, dtype=np.float64), (num_clients,)).copy()
        for name, p in (("p_on", self.p_on), ("p_off", self.p_off)):
            if not np.all((p > 0) & (p <= 1)):
                raise ValueError(f"{name} must lie in (0, 1]")
        self.stationary = self.p_on / (self.p_on + self.p_off)
        self._reset()

    def _reset(self) -> None:
        self.state = np.zeros(self.num_clients, dtype=bool)

    def _draw(self, t: int) -> np.ndarray:
        u = round_rng(self.seed, t).random(self.num_clients)
        if t == 0:
            self.state = u < self.stationary
        else:
            self.state = np.where(self.state, u >= self.p_off, u < self.p_on)
        return self.state.copy()

    def probabilities(self, t: int) -> np.ndarray:
        # unconditional marginal: the chain starts stationary, so P(on at t) = pi_i for every t
        return self.stationary.copy()

    def state_dict(self) -> dict[str, np.ndarray]:
        return super().state_dict() | {"state": self.state.copy()}

    def load_state_dict(self, d: dict[str, np.ndarray]) -> None:
        super().load_state_dict(d)
        self.state = self._vector(d, "state", bool)


class Trace(Participation):
    """Replay a boolean [T, N] array: ``S_t`` = row t."""

    name = "trace"

    def __init__(self, num_clients: int, seed: int, trace: np.ndarray) -> None:
        super().__init__(num_clients, seed)
        trace = np.asarray(trace, dtype=bool)
        if trace.ndim != 2 or trace.shape[1] != num_clients:
            raise ValueError(f"trace must have shape [T, {num_clients}], got {trace.shape}")
        self.trace = trace

    def _draw(self, t: int) -> np.ndarray:
        if t >= len(self.trace):
            raise ValueError(f"trace participation: round {t} is past the trace's {len(self.trace)} rounds")
        return self.trace[t].copy()

    def max_active(self) -> int:
        return int(self.trace.sum(axis=1).max(initial=0))
