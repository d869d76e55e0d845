"""Counter-based hash keys: random numbers that are a function of their integer coordinates alone.

Sample order, per-client test splits and client samples are keyed by (seed, stream, client, ...), so they
never depend on which rank computes them or on what else is computed with them (docs/design.md).
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer, element-wise on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def hash_keys(*parts: np.ndarray | int) -> np.ndarray:
    """Hash integer arrays (broadcast together) into uint64 keys; order of ``parts`` matters."""
    h = np.zeros((), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for p in parts:
            h = _mix(h + (np.asarray(p, dtype=np.int64).astype(np.uint64) + np.uint64(1)) * _GOLDEN)
    return h
