"""``participation.pattern`` -> a built pattern: one factory per name, checking the section's fields for that
pattern, and plugin classes given as ``package.module:Class`` (docs/extending.md)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedrun.config import ParticipationConfig
from fedrun.errors import ConfigError, brief
from fedrun.federation.participation.base import Participation
from fedrun.federation.participation.patterns import (
    Bernoulli,
    Cyclic,
    Full,
    Markov,
    ReshuffledCyclic,
    Sine,
    Trace,
    Uniform,
    biased_probabilities,
)
from fedrun.federation.participation.traces import load_client_vector, load_trace, read_array
from fedrun.plugins import call, is_import_path, load

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
        raw = np.asarray(read_array(cfg.markov_file, field), dtype=np.float64)
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


def _check_persistence(plugin: type[Participation], value: str) -> None:
    """Refuse a plugin written against the ``_state`` / ``_load_state`` hooks fedrun no longer calls: its state
    would silently be left out of the checkpoint, and a resume would not continue its rounds."""
    hooks = [name for name, contract in (("_state", "state_dict"), ("_load_state", "load_state_dict"))
             if hasattr(plugin, name) and getattr(plugin, contract) is getattr(Participation, contract)]
    if hooks:
        raise ConfigError(f"participation.pattern: {value} implements {' / '.join(hooks)}, which fedrun no longer "
                          "calls (its state would be lost on resume); expected state_dict() / load_state_dict(d) "
                          "extending Participation's (docs/extending.md)")


def make_participation(cfg: ParticipationConfig, num_clients: int, seed: int, rounds: int) -> Participation:
    """Build the configured pattern for N = ``num_clients`` clients and a run of ``rounds`` rounds.

    Raises :class:`ConfigError` naming the field for an unknown pattern, a plugin still on the old persistence
    hooks, S > N where S is used, bad per-client files, or a trace shorter than ``rounds``.
    """
    factory = PATTERNS.get(cfg.pattern)
    if is_import_path(cfg.pattern):
        plugin = load(cfg.pattern, "participation.pattern",
                      "a subclass of fedrun.federation.participation.Participation",
                      lambda obj: isinstance(obj, type) and issubclass(obj, Participation))
        _check_persistence(plugin, cfg.pattern)
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
