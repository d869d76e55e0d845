"""Summaries and pictures of a participation pattern over a run (``python -m fedrun participation``)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedrun.federation.delay import DelayTracker
from fedrun.federation.participation import Participation


def _fresh(participation: Participation) -> Participation:
    """A copy rewound to round 0, so the caller's object (and its state) is left untouched."""
    out = copy.deepcopy(participation)
    out.reset()
    return out


def describe(participation: Participation, rounds: int) -> dict[str, Any]:
    """Statistics of rounds 0..rounds-1 of ``participation`` (drawn on a rewound copy).

    Keys: pattern, num_clients, rounds, cohort_mean/min/max, empty_rounds, tau_max, tau_avg,
    tau_avg_client (docs/participation.md, at the last round), rate_min/mean/max (per-client fraction of
    rounds active).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    p = _fresh(participation)
    tracker = DelayTracker(p.num_clients)
    sizes = np.empty(rounds, dtype=np.int64)
    metrics: dict[str, Any] = {}
    for t in range(rounds):
        mask = p.active(t)
        sizes[t] = int(mask.sum())
        metrics = tracker.update(mask)
    rate = tracker.participations / rounds
    return {
        "pattern": p.name,
        "num_clients": p.num_clients,
        "rounds": rounds,
        "cohort_mean": float(sizes.mean()),
        "cohort_min": int(sizes.min()),
        "cohort_max": int(sizes.max()),
        "empty_rounds": int((sizes == 0).sum()),
        "tau_max": int(metrics["tau_max"]),
        "tau_avg": float(metrics["tau_avg"]),
        "tau_avg_client": float(metrics["tau_avg_client"]),
        "rate_min": float(rate.min()),
        "rate_mean": float(rate.mean()),
        "rate_max": float(rate.max()),
    }


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1 else f"{value:.2f}"
    return str(value)


def format_description(stats: dict[str, Any] | Sequence[dict[str, Any]]) -> str:
    """A small aligned text table: one row per statistic, one value column per ``describe`` result."""
    columns = [stats] if isinstance(stats, dict) else list(stats)
    if not columns:
        return ""
    keys = [k for k in columns[0] if k != "pattern"]
    header = ["", *[str(c.get("pattern", "")) for c in columns]]
    rows = [header] + [[k, *[_cell(c.get(k, "")) for c in columns]] for k in keys]
    key_width = max(len(r[0]) for r in rows)
    widths = [max(len(r[j]) for r in rows) for j in range(1, len(header))]
    lines = []
    for r in rows:
        cells = [r[0].ljust(key_width)] + [v.rjust(w) for v, w in zip(r[1:], widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def save_participation_png(participation: Participation, rounds: int, path: str | Path,
                           window: tuple[int, int] | None = None) -> Path:
    """Draw who participated when: a clients x rounds raster over ``window`` = [start, stop) 0-based round
    indices (default the first min(rounds, 200)), labelled as rounds start + 1 .. stop (rounds count from 1
    in every output), with the cohort size underneath. Matplotlib Agg, no pyplot."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    start, stop = window if window is not None else (0, min(rounds, 200))
    if not 0 <= start < stop <= rounds:
        raise ValueError(f"window must satisfy 0 <= start < stop <= rounds={rounds}, got {(start, stop)}")
    p = _fresh(participation)
    masks = np.zeros((stop - start, p.num_clients), dtype=bool)
    for t in range(stop):  # stateful patterns need every round from 0
        mask = p.active(t)
        if t >= start:
            masks[t - start] = mask
    fig = Figure(figsize=(min(4 + (stop - start) / 25, 14), 6), dpi=100)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2, 1, height_ratios=[4, 1], hspace=0.08)
    ax = fig.add_subplot(grid[0])
    extent = (start + 0.5, stop + 0.5, p.num_clients - 0.5, -0.5)  # round r = t + 1 counts from 1
    ax.imshow(masks.T, aspect="auto", interpolation="nearest", cmap="Greys", extent=extent, vmin=0, vmax=1)
    ax.set_ylabel("client")
    ax.set_title(f"participation: {p.name} (N={p.num_clients}, rounds {start + 1}..{stop})")
    ax.tick_params(labelbottom=False)
    size_ax = fig.add_subplot(grid[1], sharex=ax)
    size_ax.step(np.arange(start + 1, stop + 1), masks.sum(axis=1), where="mid", color="black", linewidth=0.8)
    size_ax.set_xlabel("round")
    size_ax.set_ylabel("|S_t|")
    size_ax.set_ylim(0, max(int(masks.sum(axis=1).max()), 1) * 1.15)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    return path
