"""Per-client statistics and a picture of a partition (``python -m fedrun data``), without training.

``describe_data(cfg)`` loads ``data.name``, partitions it exactly as a run with ``run.seed`` would and
returns the statistics plus the clients x classes count matrix; ``save_partition_png`` draws that
matrix the way the FedSUM paper's Figure 4 does (one stacked bar of label counts per client) with a
clients x classes bubble chart underneath.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedrun.config import Config
from fedrun.data.dataset import TaskData
from fedrun.errors import DataError


def label_counts(task: TaskData, parts: list[np.ndarray]) -> np.ndarray:
    """int64 ``[N, C]``: how many training examples of class c client i holds."""
    if task.task != "classification":
        raise DataError(f"dataset {task.name} has no class labels")
    out = np.zeros((len(parts), task.num_classes), dtype=np.int64)
    for i, idx in enumerate(parts):
        out[i] = np.bincount(task.y_train[idx], minlength=task.num_classes)[: task.num_classes]
    return out


def label_entropy(counts: np.ndarray) -> np.ndarray:
    """Shannon entropy in bits of each row's label distribution (0 for a one-class client)."""
    counts = np.atleast_2d(counts).astype(np.float64)
    totals = counts.sum(axis=1, keepdims=True)
    p = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log2(p), 0.0)
    return terms.sum(axis=1)


def describe_partition(sizes: np.ndarray, counts: np.ndarray | None = None) -> dict[str, Any]:
    """Statistics of a partition: client sizes and, for classification, classes and label entropy.

    ``sizes`` is ``[N]`` examples per client; ``counts`` the ``[N, C]`` label counts (or None).
    Entropies are in bits; ``entropy_all`` is that of the pooled training labels (the i.i.d. value).
    """
    sizes = np.asarray(sizes)
    out: dict[str, Any] = {
        "clients": int(len(sizes)),
        "examples": int(sizes.sum()),
        "size_min": int(sizes.min()),
        "size_mean": float(sizes.mean()),
        "size_max": int(sizes.max()),
        "size_std": float(sizes.std()),
    }
    if counts is not None:
        classes = (counts > 0).sum(axis=1)
        entropy = label_entropy(counts)
        out.update({
            "num_classes": int(counts.shape[1]),
            "classes_min": int(classes.min()),
            "classes_mean": float(classes.mean()),
            "classes_max": int(classes.max()),
            "entropy_min": float(entropy.min()),
            "entropy_mean": float(entropy.mean()),
            "entropy_max": float(entropy.max()),
            "entropy_all": float(label_entropy(counts.sum(axis=0))[0]),
        })
    return out


def describe_data(cfg: Config) -> tuple[dict[str, Any], np.ndarray, np.ndarray | None]:
    """Load and partition ``cfg.data`` with ``cfg.run.seed``: (statistics, sizes [N], counts [N, C] or None)."""
    from fedrun.data import load_task
    from fedrun.data.partition import partition

    task = load_task(cfg.data, cfg.run.seed)
    parts = partition(task, cfg.data, cfg.run.seed)
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    counts = label_counts(task, parts) if task.task == "classification" else None
    stats = {"dataset": task.name, "partition": cfg.data.partition, **describe_partition(sizes, counts)}
    return stats, sizes, counts


def format_partition_stats(stats: dict[str, Any]) -> str:
    """A few aligned lines: clients, examples per client, classes per client, label entropy."""
    lines = [f"dataset {stats['dataset']}, partition {stats['partition']}: {stats['clients']} clients, "
             f"{stats['examples']} training examples"]
    rows = [("examples per client", stats["size_min"], stats["size_mean"], stats["size_max"])]
    if "classes_min" in stats:
        rows.append(("classes per client", stats["classes_min"], stats["classes_mean"], stats["classes_max"]))
        rows.append(("label entropy (bits)", stats["entropy_min"], stats["entropy_mean"], stats["entropy_max"]))
    width = max(len(r[0]) for r in rows)
    lines.append(f"{'':{width}}  {'min':>8}  {'mean':>8}  {'max':>8}")
    for name, lo, mean, hi in rows:
        fmt = (lambda v: f"{v:8.3f}") if isinstance(lo, float) else (lambda v: f"{v:8d}")
        lines.append(f"{name:{width}}  {fmt(lo)}  {mean:8.2f}  {fmt(hi)}")
    if "entropy_all" in stats:
        lines.append(f"label entropy of all training labels: {stats['entropy_all']:.3f} bits "
                     f"(log2 {stats['num_classes']} = {np.log2(stats['num_classes']):.3f})")
    return "\n".join(lines)


def save_partition_png(counts: np.ndarray, path: str | Path, title: str = "") -> Path:
    """Stacked bars of label counts per client (FedSUM Figure 4) over a clients x classes bubble chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = np.asarray(counts)
    n, c = counts.shape
    path = Path(path)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8.0, min(24.0, 0.12 * n + 4)), 7.5), sharex=True,
                                      gridspec_kw={"height_ratios": [1.2, 1]})
    cmap = plt.get_cmap("tab10" if c <= 10 else "tab20" if c <= 20 else "viridis")
    colors = [cmap(k % cmap.N) if c <= 20 else cmap(k / max(1, c - 1)) for k in range(c)]
    clients = np.arange(n)
    bottom_of = np.zeros(n)
    for k in range(c):
        top.bar(clients, counts[:, k], bottom=bottom_of, width=0.85, color=colors[k],
                label=str(k) if c <= 20 else None, linewidth=0)
        bottom_of += counts[:, k]
    top.set_ylabel("examples")
    top.set_title(title or f"{n} clients x {c} classes")
    if c <= 20:
        top.legend(title="label", fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ii, kk = np.nonzero(counts)
    area = counts[ii, kk] / max(1, counts.max()) * 120.0
    bottom.scatter(ii, kk, s=area, c=[colors[k] for k in kk], alpha=0.8, linewidths=0)
    bottom.set_ylabel("class")
    bottom.set_xlabel("client")
    bottom.set_ylim(-0.7, c - 0.3)
    if c <= 20:
        bottom.set_yticks(range(c))
    bottom.set_xlim(-1, n)
    bottom.grid(alpha=0.25)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
