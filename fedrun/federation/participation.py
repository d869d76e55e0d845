"""Participation patterns: which clients take part in round t (docs/participation.md).

Every pattern is a deterministic function of ``(seed, t)`` and, for the two stateful patterns
(``reshuffled_cyclic``, ``markov``), of its own small state. Each round's random draws come from a
fresh generator ``np.random.default_rng([seed, t, STREAM])``, so every MPI rank computes the same
active set over all N clients, whatever the number of ranks, and no hidden generator state exists.

Contract of :class:`Participation`:

- ``active(t)`` returns a bool array [N]. Call it with t = 0, 1, 2, ... in order. Asking again for the
  round just drawn returns the same mask. Stateless patterns also accept any t (random access);
  stateful ones raise ``ValueError`` on an out-of-order t.
- ``probabilities(t)`` returns the marginal probability ``P(i in S_t)`` as float64 [N], or ``None``
  where the pattern has no probability model (``cyclic``, ``trace``).
- ``state_dict()`` / ``load_state_dict(d)`` hold numpy arrays only (for the HDF5 checkpoint); after
  ``load_state_dict`` the next ``active(next_round)`` continues exactly as the saved object would have.
- ``max_active()``: the most clients any round can draw (the worst-case cohort of the start-up memory
  check of gathered uploads); N unless the pattern bounds it.

``participation.pattern`` may also be ``package.module:Class``, a :class:`Participation` subclass outside
fedrun, built by its ``from_config(cfg, num_clients, seed, rounds)`` (docs/extending.md).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fedrun.config import ConfigError, ParticipationConfig
from fedrun.errors import brief, require_file
from fedrun.plugins import call, is_import_path, load

STREAM = 0x50415254  # "PART": per-round participation draws, rng([seed, t, STREAM])
STREAM_FIXED_PERMUTATION = 0x50455246  # "PERF": the fixed order of cyclic with shuffle, rng([seed, 0, .])
BIASED_FLOOR = 0.05  # H.8 probabilities are clipped at this value for clients beyond 110


def round_rng(seed: int, t: int, stream: int = STREAM) -> np.random.Generator:
    """The generator for round ``t``: a pure function of ``(seed, t, stream)``."""
    return np.random.default_rng([int(seed), int(t), int(stream)])


# --------------------------------------------------------------------------------------------- base


class Participation:
    """Base class: subclasses implement ``_draw(t)`` and, when stateful, ``_state``/``_load_state``."""

    name: str = "participation"
    stateful: bool = False  # True: active(t) depends on the previous rounds' draws

    @classmethod
    def from_config(cls, cfg: ParticipationConfig, num_clients: int, seed: int, rounds: int) -> Participation:
        """How a plugin pattern is built from the ``participation`` section (default: ``cls(N, seed)``)."""
        return cls(num_clients, seed)

    def __init__(self, num_clients: int, seed: int) -> None:
        if num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {num_clients}")
        self.num_clients = int(num_clients)
        self.seed = int(seed)
        self._next_round = 0
        self._last: tuple[int, np.ndarray] | None = None

    # public API ---------------------------------------------------------------------------------------
    def active(self, t: int) -> np.ndarray:
        """Bool mask [N] of the clients in ``S_t``."""
        t = int(t)
        if t < 0:
            raise ValueError(f"{self.name} participation: round must be >= 0, got {t}")
        if self._last is not None and self._last[0] == t:
            return self._last[1].copy()
        if self.stateful and t != self._next_round:
            raise ValueError(f"{self.name} participation: round {t} requested, expected round "
                             f"{self._next_round} (draw rounds in order; load_state_dict to resume)")
        mask = np.asarray(self._draw(t), dtype=bool)
        self._last = (t, mask)
        self._next_round = t + 1
        return mask.copy()

    def probabilities(self, t: int) -> np.ndarray | None:
        """Marginal ``P(i in S_t)`` as float64 [N], or ``None`` when the pattern has no probabilities."""
        return None

    def max_active(self) -> int:
        """The most clients one round can draw."""
        return self.num_clients

    @property
    def next_round(self) -> int:
        """The round ``active`` expects next (one past the last round drawn)."""
        return self._next_round

    def state_dict(self) -> dict[str, np.ndarray]:
        out = {"next_round": np.asarray(self._next_round, dtype=np.int64)}
        out.update(self._state())
        return out

    def load_state_dict(self, d: dict[str, np.ndarray]) -> None:
        if "next_round" not in d:
            raise ValueError(f"{self.name} participation state: missing 'next_round'")
        self._load_state(d)
        self._next_round = int(np.asarray(d["next_round"]))
        self._last = None

    def reset(self) -> None:
        """Back to the state before round 0 (same seed)."""
        self._next_round = 0
        self._last = None
        self._reset()

    # subclass hooks ------------------------------------------------------------------------------------
    def _draw(self, t: int) -> np.ndarray:
        raise NotImplementedError

    def _state(self) -> dict[str, np.ndarray]:
        return {}

    def _load_state(self, d: dict[str, np.ndarray]) -> None:
        pass

    def _reset(self) -> None:
        pass

    def _vector(self, d: dict[str, np.ndarray], key: str, dtype: type) -> np.ndarray:
        if key not in d:
            raise ValueError(f"{self.name} participation state: missing {key!r}")
        value = np.asarray(d[key])
        if value.shape != (self.num_clients,):
            raise ValueError(f"{self.name} participation state: {key!r} has shape {value.shape}, "
                             f"expected ({self.num_clients},)")
        return value.astype(dtype, copy=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, num_clients={self.num_clients}, seed={self.seed})"


# --------------------------------------------------------------------------------------------- patterns


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

    def _state(self) -> dict[str, np.ndarray]:
        return {"permutation": self.permutation.copy(),
                "pointer": np.asarray(self.pointer, dtype=np.int64)}

    def _load_state(self, d: dict[str, np.ndarray]) -> None:
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

    def _state(self) -> dict[str, np.ndarray]:
        return {"state": self.state.copy()}

    def _load_state(self, d: dict[str, np.ndarray]) -> None:
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


# --------------------------------------------------------------------------------------------- files


def _read_array(path: str, field: str) -> np.ndarray:
    """A numeric or boolean array from .npy or .csv; ConfigError naming the field and file otherwise."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".npy", ".csv"):
        raise ConfigError(f"{field}: {path}: expected a .npy or .csv file")
    try:
        require_file(p, f"a {suffix} file", ConfigError)
    except ConfigError as exc:
        raise ConfigError(f"{field}: {exc}") from None
    try:
        if suffix == ".npy":
            return np.load(p, allow_pickle=False)
        with open(p, newline="") as fh:
            rows = [[cell.strip() for cell in row] for row in csv.reader(fh)
                    if row and not row[0].lstrip().startswith("#")]
    except (OSError, ValueError, EOFError) as exc:
        first = (str(exc).splitlines() or [""])[0]
        raise ConfigError(f"{field}: cannot read {path} ({type(exc).__name__}: {first})") from None
    widths = {len(r) for r in rows}
    if len(widths) > 1:
        raise ConfigError(f"{field}: {path}: rows have different numbers of columns ({sorted(widths)})")
    words = {"true": 1.0, "false": 0.0}
    out = np.empty((len(rows), widths.pop() if widths else 0))
    for r, row in enumerate(rows):
        for c, cell in enumerate(row):
            try:
                out[r, c] = words[cell.lower()] if cell.lower() in words else float(cell)
            except ValueError:
                raise ConfigError(f"{field}: {path}: row {r + 1}, column {c + 1}: not a number or "
                                  f"boolean: {cell!r}") from None
    return out


def load_trace(path: str, num_clients: int, rounds: int, field: str = "participation.trace") -> np.ndarray:
    """Load and check a participation trace: bool [T, N] with T >= rounds."""
    raw = _read_array(path, field)
    if raw.dtype != bool:
        if raw.dtype.kind not in "iuf" or not np.all((raw == 0) | (raw == 1)):
            raise ConfigError(f"{field}: {path}: expected boolean values (0/1, true/false), "
                              f"got dtype {raw.dtype} with values other than 0 and 1")
    if raw.ndim != 2:
        raise ConfigError(f"{field}: {path}: expected a [rounds, clients] array, got shape {raw.shape}")
    if raw.shape[1] != num_clients:
        raise ConfigError(f"{field}: {path}: has {raw.shape[1]} clients (columns), "
                          f"expected data.num_clients = {num_clients}")
    if raw.shape[0] < rounds:
        raise ConfigError(f"{field}: {path}: has {raw.shape[0]} rounds (rows), the run needs {rounds}")
    return raw.astype(bool)


def load_client_vector(path: str, num_clients: int, field: str, low: float = 0.0,
                       high: float = 1.0) -> np.ndarray:
    """A per-client float vector [N] (.npy, or .csv with one value per row or one row) within [low, high]."""
    raw = np.asarray(_read_array(path, field), dtype=np.float64).reshape(-1)
    if raw.shape != (num_clients,):
        raise ConfigError(f"{field}: {path}: has {raw.size} values, expected one per client "
                          f"({num_clients})")
    if not np.all((raw > low) & (raw <= high)):
        raise ConfigError(f"{field}: {path}: expected values in ({low}, {high}], "
                          f"got min {raw.min():g}, max {raw.max():g}")
    return raw


# --------------------------------------------------------------------------------------------- factory


Factory = Callable[[ParticipationConfig, int, int, int], Participation]


def _cohort(cfg: ParticipationConfig, n: int) -> int:
    s = cfg.clients_per_round
    if not 1 <= s <= n:
        raise ConfigError(f"participation.clients_per_round: expected an integer in [1, data.num_clients = "
                          f"{n}] for pattern {cfg.pattern}, got {s}")
    return s


def _rate(cfg: ParticipationConfig, n: int) -> float | np.ndarray:
    """Per-client base probability: probability_file, else probability, else S/N."""
    if cfg.probability_file is not None:
        return load_client_vector(cfg.probability_file, n, "participation.probability_file")
    if cfg.probability is not None:
        return cfg.probability
    return _cohort(cfg, n) / n


def _full(cfg: ParticipationConfig, n: int, seed: int, rounds: int) -> Participation:
    return Full(n, seed)


def _uniform(cfg: ParticipationConfig, n: int, seed: int, rounds: int) -> Participation:
    return Uniform(n, seed, _cohort(cfg, n))


def _bernoulli(cfg: ParticipationConfig, n: int, seed: int, rounds: int) -> Participation:
    return Bernoulli(n, seed, _rate(cfg, n))


def _sine(cfg: ParticipationConfig, n: int, seed: int, rounds: int) -> Participation:
    base = _rate(cfg, n)
    peak = float(np.max(base)) * (cfg.sine_offset + abs(cfg.sine_amplitude))
    if peak > 1 + 1e-12:
        raise ConfigError(f"participation.sine_amplitude: base * (sine_offset + |sine_amplitude|) = "
                          f"{peak:g} exceeds 1 (expected probabilities <= 1)")
    return Sine(n, seed, base, cfg.sine_amplitude, cfg.sine_offset, cfg.sine_period)


def _cyclic(cfg: ParticipationConfig, n: int, seed: int, rounds: int) -> Participation:
    return Cyclic(n, seed, _cohort(cfg, n), shuffle=cfg.cyclic_shuffle)


def _reshuffled(cfg: ParticipationConfig, n: int, seed: int, rounds: int) -> Participation:
    return ReshuffledCyclic(n, seed, _cohort(cfg, n))


def _p1(cfg: ParticipationConfig, n: int, seed: int, rounds: int) -> Participation:
    out = Uniform(n, seed, _cohort(cfg, n))
    out.name = "p1"
    return out


def _p2(cfg: ParticipationConfig, n: int, seed: int, rounds: int) -> Participation:
    out = Bernoulli(n, seed, _cohort(cfg, n) / n)
    out.name = "p2"
    return out


def _p3(cfg: ParticipationConfig, n: int, seed: int, rounds: int) -> Participation:
    # (S/N) (0.3 sin(pi t / 5) + 0.7): period 10 rounds
    out = Sine(n, seed, _cohort(cfg, n) / n, amplitude=0.3, offset=0.7, period=10.0)
    out.name = "p3"
    return out


def _biased(cfg: ParticipationConfig, n: int, seed: int, rounds: int) -> Participation:
    out = Bernoulli(n, seed, biased_probabilities(n))
    out.name = "biased"
    return out


def _markov(cfg: ParticipationConfig, n: int, seed: int, rounds: int) -> Participation:
    if cfg.markov_file is not None:
        field = "participation.markov_file"
        raw = np.asarray(_read_array(cfg.markov_file, field), dtype=np.float64)
        if raw.shape != (2, n):
            raise ConfigError(f"{field}: {cfg.markov_file}: expected shape [2, {n}] (rows p_on, p_off), "
                              f"got {raw.shape}")
        if not np.all((raw > 0) & (raw <= 1)):
            raise ConfigError(f"{field}: {cfg.markov_file}: expected transition probabilities in (0, 1]")
        return Markov(n, seed, raw[0], raw[1])
    p_off = cfg.markov_p_off
    if cfg.markov_p_on is not None:
        return Markov(n, seed, cfg.markov_p_on, p_off)
    pi = np.asarray(_rate(cfg, n), dtype=np.float64)
    if np.any(pi >= 1):
        raise ConfigError("participation.probability: the markov stationary rate must be < 1 "
                          f"(or set participation.markov_p_on), got max {float(np.max(pi)):g}")
    p_on = pi * p_off / (1 - pi)
    if np.any(p_on > 1):
        raise ConfigError(f"participation.markov_p_off: stationary rate {float(np.max(pi)):g} needs "
                          f"p_on = {float(np.max(p_on)):g} > 1; lower markov_p_off or set markov_p_on")
    return Markov(n, seed, p_on, p_off)


def _trace(cfg: ParticipationConfig, n: int, seed: int, rounds: int) -> Participation:
    if cfg.trace is None:
        raise ConfigError("participation.trace: expected a .npy or .csv file for pattern trace, got None")
    return Trace(n, seed, load_trace(cfg.trace, n, rounds))


PATTERNS: dict[str, Factory] = {
    "full": _full,
    "uniform": _uniform,
    "bernoulli": _bernoulli,
    "sine": _sine,
    "cyclic": _cyclic,
    "reshuffled_cyclic": _reshuffled,
    "p1": _p1,
    "p2": _p2,
    "p3": _p3,
    "biased": _biased,
    "markov": _markov,
    "trace": _trace,
}


def make_participation(cfg: ParticipationConfig, num_clients: int, seed: int, rounds: int) -> Participation:
    """Build the configured pattern for N = ``num_clients`` clients and a run of ``rounds`` rounds.

    Raises :class:`ConfigError` naming the field for an unknown pattern, S > N where S is used, bad
    per-client files, or a trace shorter than ``rounds``.
    """
    factory = PATTERNS.get(cfg.pattern)
    if is_import_path(cfg.pattern):
        plugin = load(cfg.pattern, "participation.pattern",
                      "a subclass of fedrun.federation.participation.Participation",
                      lambda obj: isinstance(obj, type) and issubclass(obj, Participation))
        def factory(cfg: ParticipationConfig, n: int, seed: int, rounds: int) -> Participation:
            return call("participation.pattern", cfg.pattern, "from_config(cfg, num_clients, seed, rounds)",
                        plugin.from_config, cfg, n, seed, rounds)
    if factory is None:
        raise ConfigError(f"participation.pattern: expected one of {', '.join(PATTERNS)}, "
                          f"got {brief(cfg.pattern)}")
    if num_clients < 1:
        raise ConfigError(f"data.num_clients: expected an integer >= 1, got {num_clients}")
    if rounds < 0:
        raise ConfigError(f"run.rounds: expected an integer >= 0, got {rounds}")
    pattern = factory(cfg, int(num_clients), int(seed), int(rounds))
    if not isinstance(pattern, Participation):
        raise ConfigError(f"participation.pattern: {cfg.pattern}.from_config returned {type(pattern).__name__}; "
                          "expected a Participation")
    return pattern
