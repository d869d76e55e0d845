"""The participation contract: the :class:`Participation` base class and the per-round generator.

Every pattern is a deterministic function of ``(seed, t)`` and, when stateful, of its own small state:
each round's draws come from :func:`round_rng`, so every rank computes the same active set.
"""

from __future__ import annotations

import numpy as np

from fedrun.config import ParticipationConfig

STREAM = 0x50415254  # "PART": per-round participation draws, rng([seed, t, STREAM])
STREAM_FIXED_PERMUTATION = 0x50455246  # "PERF": the fixed order of cyclic with shuffle, rng([seed, 0, .])


def round_rng(seed: int, t: int, stream: int = STREAM) -> np.random.Generator:
    """The generator for round ``t``: a pure function of ``(seed, t, stream)``."""
    return np.random.default_rng([int(seed), int(t), int(stream)])


class Participation:
    """Base class: subclasses implement ``_draw(t)`` and, when stateful, ``_reset()`` and the persistence contract
    of every checkpointed part (fedrun.checkpoint.stateful): they extend :meth:`state_dict` and
    :meth:`load_state_dict` with their own arrays."""

    name: str = "participation"
    stateful: bool = False  # True: active(t) depends on the previous rounds' draws
    # the sampling randomness a privacy accountant may amplify by (docs/privacy.md): "poisson" (every client
    # independently with its probabilities(t)), "without_replacement" (a uniform S of N), "none" (deterministic
    # or correlated over rounds: no amplification, each client's epsilon from the rounds it joined)
    sampling: str = "none"

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
        """The pattern's state, numpy arrays by name (the checkpoint's ``schedule/`` group): the round drawn next.
        A stateful pattern extends it, ``super().state_dict() | {name: array, ...}``."""
        return {"next_round": np.asarray(self._next_round, dtype=np.int64)}

    def load_state_dict(self, d: dict[str, np.ndarray]) -> None:
        """Take :meth:`state_dict` back; a stateful pattern calls this first, then reads its own arrays."""
        if "next_round" not in d:
            raise ValueError(f"{self.name} participation state: missing 'next_round'")
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
