"""Sizes checked against the memory available before anything is allocated.

A typo such as ``data.num_clients=1000000000`` or ``data.synthetic.shape=[100000, 100000, 100]`` would
otherwise start a 300 GB allocation that ends in the OOM killer or an ``_ArrayMemoryError`` traceback.
The estimate is a lower bound of what the run allocates on each rank (every rank generates the whole
dataset): the generated arrays at their peak, the per-client bookkeeping at its measured cost, and the
per-round minibatch indices, summed. Only when the sum exceeds the memory available now is the run
refused, with one line naming the fields of its largest part. An on-demand dataset (docs/scale.md)
holds no examples between rounds: it counts its per-client bookkeeping and its bounded pooled test
set, never N times the examples. The per-client evaluation counts its evaluated clients and one window
of examples (fedrun.federation.client_eval). Once the data and the model's size d are known (before
the model is built), :func:`model_bytes` adds the model's copies and the block's client state.
"""

from __future__ import annotations

import math
import os

from fedrun.config import Config
from fedrun.data.dataset import ON_DEMAND_HINT
from fedrun.data.synthetic_fedprox import MIN_EXAMPLES
from fedrun.errors import ConfigError

# What one client costs a run beyond its data, measured as the growth of the peak resident memory of a
# one-rank run from N = 3e5 to 3e6 clients of one example each: 264 B (least squares, FedAvg), 273 B
# (SCAFFOLD, its c_i included), 327 B (synthetic); partition lists, example counts, participation and delay
# history, the client store, the sampler's permutations
PER_CLIENT_BYTES = 320
# the per-round minibatch index arrays [C, K, b] (positions, epochs, rows, sort keys, permutation, mask):
# bytes per index at their peak
INDEX_BYTES = 48
# per evaluated client of the per-client evaluation: its id, test count and running end (int64), rank 0's
# (loss, correct) sums and up to four result arrays (float64)
EVAL_CLIENT_BYTES = 80
# one evaluation window at its peak: the inputs (fedrun.federation.client_eval.WINDOW_BYTES) and the
# per-example results of at most WINDOW_EXAMPLES examples (2 float64 each, reduced: twice)
EVAL_WINDOW_BYTES = (64 << 20) + 32 * (1 << 20)
ON_DEMAND_NAMES = ("synthetic_fedprox", "federated_h5")  # datasets that always evaluate per client


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


def planned_bytes(cfg: Config) -> list[tuple[str, int]]:
    """(fields, bytes) of the allocations that follow from the config alone, before any file is read.

    Every client: ``PER_CLIENT_BYTES``. Synthetic data: N * n_c + n_test examples of prod(shape) float32
    values, drawn through a float64 temporary and a gathered class mean: 16 bytes per value at the peak.
    Generated least squares: A [N, m, d] and its temporaries in float64: 16 bytes per value. A round's
    minibatch indices: C clients x K steps x b examples, ``INDEX_BYTES`` each (fixed-steps mode).
    ``synthetic_fedprox``: ``test_clients`` clients of at least max(1, round(test_fraction * 50)) test
    examples each in the pooled test set, drawn in float64: 16 bytes per value."""
    data = cfg.data
    n = data.num_clients
    plans = [("data.num_clients", n * PER_CLIENT_BYTES)]
    examples = None  # per client, when the config fixes it
    if data.name == "synthetic":
        sc = data.synthetic
        examples = sc.examples_per_client
        values = (n * sc.examples_per_client + sc.test_examples) * math.prod(sc.shape)
        plans.append(("data.num_clients x data.synthetic.examples_per_client x data.synthetic.shape", 16 * values))
    elif data.name == "least_squares" and data.least_squares.file is None:
        ls = data.least_squares
        examples = ls.rows_per_client
        plans.append(("data.num_clients x data.least_squares.rows_per_client x data.least_squares.dim",
                      16 * n * ls.rows_per_client * ls.dim))
    elif data.name == "synthetic_fedprox":
        sf = data.synthetic_fedprox
        least = max(1, round(sf.test_fraction * MIN_EXAMPLES))
        plans.append(("data.synthetic_fedprox.test_clients x data.synthetic_fedprox.dim",
                      16 * min(n, sf.test_clients) * least * sf.dim))
    if data.name in ON_DEMAND_NAMES or data.client_test_fraction > 0:
        evaluated = n if cfg.eval.clients is None else min(n, cfg.eval.clients)
        plans.append(("eval.clients (the clients of the per-client evaluation)",
                      evaluated * EVAL_CLIENT_BYTES + EVAL_WINDOW_BYTES))
    if cfg.local.epochs is None:
        if cfg.asynchrony.enabled:
            cohort, field = cfg.asynchrony.concurrency, "asynchrony.concurrency"
        elif cfg.participation.pattern == "full":
            cohort, field = n, "data.num_clients"
        else:
            cohort, field = cfg.participation.clients_per_round, "participation.clients_per_round"
        width = min(cfg.local.batch_size, examples or cfg.local.batch_size)
        plans.append((f"{field} x local.steps x local.batch_size",
                      INDEX_BYTES * min(cohort, n) * cfg.local.steps * width))
    return plans


def model_bytes(cfg: Config, dim: int, itemsize: int, vectors: dict[str, int], scalars: int, rows: int,
                ) -> list[tuple[str, int]]:
    """(fields, bytes) of what the model's size d = ``dim`` costs a rank, a lower bound: the model and its
    flat copy, ``vectors["server"]`` server entries (rank 0), the downlink and uplink entries, the exact sum's
    int64 limbs of each uplink entry, and one client's local training (its model, gradient and momentum):
    ``d x itemsize x copies``; and the client state of its ``rows`` block clients with ``vectors["client"]``
    vector and ``scalars`` scalar entries: ``rows x (d x vectors + scalars) x itemsize`` in memory
    (``state.store=memory``), else ``rows x (vectors + scalars x itemsize)`` (the disk store's bookkeeping)."""
    limbs = 2 if itemsize == 8 else 1  # fedrun.runtime.exact_sum.limbs
    copies = 2 + vectors["server"] + vectors["down"] + vectors["up"] * (1 + limbs * 8 // itemsize) + 3
    state = (rows * (dim * vectors["client"] + scalars) * itemsize if cfg.state.store == "memory"
             else rows * (vectors["client"] + scalars * itemsize))
    return [(f"model.name={cfg.model.name} (d = {dim:,} parameters x {copies} copies: model, server state, "
             "downlink, uplink and its exact sums, local training)", dim * itemsize * copies),
            (f"algorithm.name={cfg.algorithm.name} x data.num_clients (the client state of a rank's "
             f"{rows:,} clients, state.store={cfg.state.store})", state)]


def check_memory(cfg: Config, available: int | None = None, extra: list[tuple[str, int]] | tuple = ()) -> None:
    """Raise :class:`ConfigError` (one line, exit status 2) when the planned allocations (and ``extra``, e.g.
    :func:`model_bytes`) together exceed the memory available on this node (``available``: bytes, default
    :func:`available_bytes`); the line names the fields of the largest part."""
    available = available_bytes() if available is None else available
    if available is None:
        return
    plans = [*planned_bytes(cfg), *extra]
    total = sum(size for _, size in plans)
    if total > available:
        fields, size = max(plans, key=lambda plan: plan[1])
        hint = f"; {ON_DEMAND_HINT}" if "data.num_clients" in fields and cfg.data.name not in ON_DEMAND_NAMES else ""
        raise ConfigError(f"{fields}: the run would allocate at least {_gib(total)} ({_gib(size)} of it for them), "
                          f"more than the {_gib(available)} of memory available on this node; expected smaller "
                          f"sizes{hint}")


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"
