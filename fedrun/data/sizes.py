"""Sizes checked against the memory available before anything is allocated.

A typo such as ``data.num_clients=1000000000`` or ``data.synthetic.shape=[100000, 100000, 100]`` would
otherwise start a 300 GB allocation that ends in the OOM killer or an ``_ArrayMemoryError`` traceback.
The estimate is a lower bound of what the run allocates on each rank (every rank generates the whole
in-memory dataset): the generated arrays at their peak and the per-client bookkeeping. An on-demand
dataset (docs/scale.md) holds no examples between rounds: it counts its per-client bookkeeping and its
bounded pooled test set, never N times the examples. Only when it exceeds the
memory available now is the run refused, with one line naming the fields.
"""

from __future__ import annotations

import math
import os

from fedrun.config import DataConfig
from fedrun.data.synthetic_fedprox import MIN_EXAMPLES
from fedrun.errors import ConfigError

PER_CLIENT_BYTES = 48  # partition index, example counts, last participation and count: int64 each, at least


def available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), else the free physical pages; None if neither is known."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def planned_bytes(cfg: DataConfig) -> list[tuple[str, int]]:
    """(fields, bytes) of the allocations that follow from the config alone, before any file is read.

    Synthetic data: N * n_c + n_test examples of prod(shape) float32 values, drawn through a float64
    temporary and a gathered class mean: 16 bytes per value at the peak. Generated least squares:
    A [N, m, d] and its temporaries in float64: 16 bytes per value. ``synthetic_fedprox``: ``test_clients``
    clients of at least max(1, round(test_fraction * 50)) test examples each in the pooled test set, drawn
    in float64: 16 bytes per value. Every client: ``PER_CLIENT_BYTES``."""
    n = cfg.num_clients
    plans = [("data.num_clients", n * PER_CLIENT_BYTES)]
    if cfg.name == "synthetic":
        sc = cfg.synthetic
        values = (n * sc.examples_per_client + sc.test_examples) * math.prod(sc.shape)
        plans.append(("data.num_clients x data.synthetic.examples_per_client x data.synthetic.shape", 16 * values))
    elif cfg.name == "least_squares" and cfg.least_squares.file is None:
        ls = cfg.least_squares
        plans.append(("data.num_clients x data.least_squares.rows_per_client x data.least_squares.dim",
                      16 * n * ls.rows_per_client * ls.dim))
    elif cfg.name == "synthetic_fedprox":
        sf = cfg.synthetic_fedprox
        least = max(1, round(sf.test_fraction * MIN_EXAMPLES))
        plans.append(("data.synthetic_fedprox.test_clients x data.synthetic_fedprox.dim",
                      16 * min(n, sf.test_clients) * least * sf.dim))
    return plans


def check_memory(cfg: DataConfig, available: int | None = None) -> None:
    """Raise :class:`ConfigError` (one line, exit status 2) when a planned allocation exceeds the memory
    available on this node (``available``: bytes, default :func:`available_bytes`)."""
    available = available_bytes() if available is None else available
    if available is None:
        return
    for fields, size in planned_bytes(cfg):
        if size > available:
            raise ConfigError(f"{fields}: the run would allocate at least {_gib(size)} for them, more than the "
                              f"{_gib(available)} of memory available on this node; expected smaller sizes")


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"
