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

``base`` holds the contract, ``patterns`` the built-in patterns (their classes are imported from there),
``traces`` the per-client files they read and ``registry`` the pattern names and :func:`make_participation`.
"""

from fedrun.federation.participation.base import STREAM, Participation, round_rng
from fedrun.federation.participation.patterns import BIASED_FLOOR, Trace, biased_probabilities
from fedrun.federation.participation.registry import PATTERNS, make_participation
from fedrun.federation.participation.traces import load_trace

__all__ = ["BIASED_FLOOR", "PATTERNS", "STREAM", "Participation", "Trace", "biased_probabilities", "load_trace",
           "make_participation", "round_rng"]
