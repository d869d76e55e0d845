"""Report on a sweep directory or one run: one table of final metrics per configuration, and learning curves.

    python -m fedrun report SWEEP_DIR|RUN_DIR [--out DIR]

Reads every run directory under SWEEP_DIR (those listed in ``sweep.json`` written at submission, or any
subdirectory with a ``metrics.jsonl``), or the one run of a RUN_DIR that has a ``metrics.jsonl``.
Runs that differ only in the seed axis (``seed_key``, default
``run.seed``) form one configuration; the table gives mean ± std over its seeds of the final metrics
(``result.json`` where the run finished, else its last metrics row; the ``done`` column says how many
finished). ``run_s`` is a run's time in rounds (the sum of its per-round ``wall_s``, across resumes;
start-up excluded), not the last round's. Writes to SWEEP_DIR (or --out):

* ``summary.csv`` and ``summary.md``: one row per configuration;
* ``curves_rounds.png``: training loss and test accuracy against rounds (integer ticks; rounds from 1);
* ``curves_uplink.png``: the same against cumulative uplink floats (the FedSUM paper's Figure 1 view);
* ``curves_communicated.png``: the same against cumulative communicated floats (uplink + downlink);
  one line per configuration (the seed mean, with a band of ± one std over seeds);
* ``clients.png`` when the runs evaluated per client (docs/evaluation.md): a histogram of the per-client
  test accuracy at the last evaluation (from each run's ``clients.h5``, seeds pooled), and the mean and
  worst-10% client accuracy against rounds; with ``eval.finetune_steps`` > 0 the same for the fine-tuned
  (personalized) models, dotted, and their ``finetuned_accuracy_*`` columns in the table.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

METRICS = ("train_loss", "test_accuracy", "test_loss", "client_accuracy_mean", "client_accuracy_worst10",
           "finetuned_accuracy_mean", "finetuned_accuracy_worst10",
           "uplink_total", "downlink_total", "run_s", "round")


@dataclass
class RunRecord:
    name: str
    dir: Path
    point: dict[str, Any]
    rows: list[dict[str, Any]]
    final: dict[str, Any]
    done: bool
    algorithm: str = "run"
    extra: dict[str, Any] = field(default_factory=dict)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a run killed mid-write leaves a partial last line
    return rows


def _cumulative(rows: list[dict[str, Any]], direction: str) -> list[float | None]:
    """Cumulative ``uplink``/``downlink`` floats per row: a ``*_total``/``cum*`` field when the core
    writes one, else the running sum of the per-round ``<direction>_floats``."""
    keys = [k for k in (rows[0] if rows else {}) if direction in k and ("total" in k or "cum" in k)]
    if keys:
        return [r.get(keys[0]) for r in rows]
    out, acc = [], 0.0
    for r in rows:
        value = r.get(f"{direction}_floats")
        if value is None:
            out.append(None)
            continue
        acc += float(value)
        out.append(acc)
    return out


def load_run(run_dir: Path, name: str | None = None, point: dict[str, Any] | None = None) -> RunRecord:
    rows = read_jsonl(run_dir / "metrics.jsonl")
    for direction in ("uplink", "downlink"):
        for row, value in zip(rows, _cumulative(rows, direction), strict=True):
            row[f"{direction}_total"] = value
    for row in rows:
        up, down = row.get("uplink_total"), row.get("downlink_total")
        row["communicated_total"] = None if up is None or down is None else up + down
    if point is None:
        sp = run_dir / "sweep_point.json"
        point = json.loads(sp.read_text()).get("point", {}) if sp.is_file() else {}
    final: dict[str, Any] = {}
    for row in rows:  # latest value of every metric (evaluations may be every k rounds)
        final.update({k: v for k, v in row.items() if v is not None})
    result_path = run_dir / "result.json"
    done = result_path.is_file()
    if done:
        result = json.loads(result_path.read_text())
        if isinstance(result, dict):
            flat = dict(result.get("final", result)) if isinstance(result.get("final"), dict) else result
            final.update({k: v for k, v in flat.items() if isinstance(v, (int, float)) and v is not None})
    walls = [r["wall_s"] for r in rows if isinstance(r.get("wall_s"), (int, float))]
    if walls:
        final["run_s"] = sum(walls)
    algorithm = point.get("algorithm.name")
    if algorithm is None:
        cfg = run_dir / "config.yaml"
        if cfg.is_file():
            try:
                algorithm = ((yaml.safe_load(cfg.read_text()) or {}).get("algorithm") or {}).get("name")
            except yaml.YAMLError:
                algorithm = None
    return RunRecord(name=name or run_dir.name, dir=run_dir, point=point, rows=rows, final=final, done=done,
                     algorithm=str(algorithm or "run"))


def load_sweep_dir(root: Path) -> tuple[list[RunRecord], str]:
    """Every run of a sweep directory and the seed key."""
    manifest = root / "sweep.json"
    if not manifest.is_file() and (root / "metrics.jsonl").is_file():  # one run directory
        return [load_run(root)], "run.seed"
    if manifest.is_file():
        info = json.loads(manifest.read_text())
        runs = [load_run(root / r["name"], r["name"], r.get("point", {})) for r in info.get("runs", [])]
        return runs, info.get("seed_key", "run.seed")
    dirs = sorted(p.parent for p in root.glob("*/metrics.jsonl"))
    return [load_run(d) for d in dirs], "run.seed"


def mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, 0.0
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def group_runs(runs: list[RunRecord], seed_key: str) -> dict[str, list[RunRecord]]:
    """Configuration label (the point without the seed axis) -> its runs, in sweep order."""
    groups: dict[str, list[RunRecord]] = {}
    for run in runs:
        rest = {k: v for k, v in run.point.items() if k != seed_key}
        label = " ".join(f"{k}={v}" for k, v in rest.items()) if rest else run.algorithm
        if not run.point:  # not from a sweep: one configuration per directory
            label = run.name
        groups.setdefault(label, []).append(run)
    return groups


def summarize(runs: list[RunRecord], seed_key: str) -> list[dict[str, Any]]:
    """One dict per configuration: label, algorithm, seeds, done, and ``<metric>_mean``/``_std``."""
    table = []
    for label, members in group_runs(runs, seed_key).items():
        row: dict[str, Any] = {"configuration": label, "algorithm": members[0].algorithm,
                               "seeds": len(members), "done": sum(m.done for m in members)}
        for metric in METRICS:
            values = [float(m.final[metric]) for m in members
                      if isinstance(m.final.get(metric), (int, float))]
            row[f"{metric}_mean"], row[f"{metric}_std"] = mean_std(values)
        table.append(row)
    return table


def _fmt(x: float, metric: str) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "-"
    if metric in ("uplink_total", "downlink_total", "run_s"):
        return f"{x:.3g}"
    if metric == "round":
        return f"{x:.0f}"
    return f"{x:.4g}"


def write_tables(table: list[dict[str, Any]], out: Path) -> tuple[Path, Path]:
    csv_path, md_path = out / "summary.csv", out / "summary.md"
    columns = ["configuration", "algorithm", "seeds", "done"] + [
        f"{m}_{s}" for m in METRICS for s in ("mean", "std")]
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in table:
            writer.writerow({k: ("" if isinstance(row[k], float) and math.isnan(row[k]) else row[k])
                             for k in columns})
    shown = [m for m in METRICS if any(not math.isnan(r[f"{m}_mean"]) for r in table)]
    lines = ["| configuration | seeds | done | " + " | ".join(shown) + " |",
             "|---|---:|---:|" + "---:|" * len(shown)]
    for row in table:
        cells = []
        for m in shown:
            mean, std = row[f"{m}_mean"], row[f"{m}_std"]
            cells.append(_fmt(mean, m) if math.isnan(mean) or row["seeds"] < 2 else
                         f"{_fmt(mean, m)} ± {_fmt(std, m)}")
        head = f"| {row['configuration']} | {row['seeds']} | {row['done']} | "
        lines.append(head + " | ".join(cells) + " |")
    md_path.write_text("\n".join(lines) + "\n")
    return csv_path, md_path


def _curve(members: list[RunRecord], x_key: str, y_key: str) -> tuple[list[float], list[float], list[float]]:
    """Seed mean and std of ``y_key`` at the x values (rounds or cumulative uplink) all seeds share."""
    per_run = []
    for m in members:
        pts = {}
        for row in m.rows:
            x, y = row.get(x_key), row.get(y_key)
            if isinstance(x, (int, float)) and isinstance(y, (int, float)):
                pts[float(x)] = float(y)
        per_run.append(pts)
    xs = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
    means, stds = [], []
    for x in xs:
        m, s = mean_std([p[x] for p in per_run])
        means.append(m)
        stds.append(s)
    return xs, means, stds


def _band(ax, xs: list[float], ys: list[float], sd: list[float], color: str, labelled: bool) -> None:
    """The ± one std band over seeds around a seed-mean curve (labelled once per axes)."""
    low = [y - s for y, s in zip(ys, sd, strict=True)]
    high = [y + s for y, s in zip(ys, sd, strict=True)]
    ax.fill_between(xs, low, high, color=color, alpha=0.2, linewidth=0,
                    label=None if labelled else "±1 std over seeds")


def plot_curves(runs: list[RunRecord], seed_key: str, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    groups = group_runs(runs, seed_key)
    written = []
    for x_key, x_label, fname in (("round", "round", "curves_rounds.png"),
                                  ("uplink_total", "cumulative uplink (floats)", "curves_uplink.png"),
                                  ("communicated_total", "cumulative communicated floats (uplink + downlink)",
                                   "curves_communicated.png")):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, (y_key, y_label) in zip(axes, (("train_loss", "training loss"),
                                               ("test_accuracy", "test accuracy")), strict=True):
            banded = False
            for label, members in groups.items():
                xs, ys, sd = _curve(members, x_key, y_key)
                if not xs:
                    continue
                (line,) = ax.plot(xs, ys, label=label)
                if len(members) > 1:
                    _band(ax, xs, ys, sd, line.get_color(), banded)
                    banded = True
            ax.set_title(f"{y_label} against {x_label.split(' (')[0]}")
            if x_key == "round":
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel(x_label)
            ax.set_ylabel(y_label)
            if y_key == "train_loss" and all(
                    v > 0 for m in runs for v in (r.get("train_loss") for r in m.rows) if v is not None):
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / fname
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    if any("client_accuracy_mean" in row for run in runs for row in run.rows):
        written.append(plot_clients(groups, out))
    return written


def last_client_accuracy(run: RunRecord, name: str = "accuracy") -> list[float]:
    """Per-client test accuracy (``name``: ``accuracy`` of the global model, ``finetuned_accuracy`` after
    fine-tuning) at the run's last evaluation (its clients.h5; [] without one)."""
    path = run.dir / "clients.h5"
    if not path.is_file():
        return []
    import h5py

    with h5py.File(path, "r") as f:
        if name not in f or not f[name].shape[0]:
            return []
        values = f[name][-1]
    return [float(v) for v in values if math.isfinite(v)]


# (clients.h5 array, record prefix, what the legend calls it, histogram and curve styles)
_CLIENT_MODELS = (("accuracy", "client", "global", "solid", ("-", "--")),
                  ("finetuned_accuracy", "finetuned", "fine-tuned", "dotted", (":", "-.")))


def plot_clients(groups: dict[str, list[RunRecord]], out: Path) -> Path:
    """``clients.png``: per-client accuracy histogram at the last evaluation, and the mean and worst-10%
    client accuracy against rounds, one colour per configuration; the fine-tuned (personalized) models'
    figures too where the runs have them."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (hist, curves) = plt.subplots(1, 2, figsize=(11, 4))
    for label, members in groups.items():
        color = None
        for array, prefix, model, hist_style, (mean_style, worst_style) in _CLIENT_MODELS:
            values = [v for m in members for v in last_client_accuracy(m, array)]
            if values:
                _, _, patches = hist.hist(values, bins=20, range=(0, 1), histtype="step", linewidth=1.5,
                                          linestyle=hist_style, color=color, label=f"{label}: {model}")
                color = patches[0].get_edgecolor()
            for stat, style, name in (("mean", mean_style, "mean"), ("worst10", worst_style, "worst 10%")):
                xs, ys, _ = _curve(members, "round", f"{prefix}_accuracy_{stat}")
                if xs:
                    (line,) = curves.plot(xs, ys, style, color=color, label=f"{label}: {model} {name}")
                    color = line.get_color()
    hist.set_title("per-client test accuracy at the last evaluation")
    hist.set_xlabel("client test accuracy")
    hist.set_ylabel("clients (seeds pooled)")
    curves.set_title("client test accuracy: mean and worst 10% of clients")
    curves.set_xlabel("round")
    curves.set_ylabel("client test accuracy")
    curves.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (hist, curves):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "clients.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def make_report(root: str | Path, out: str | Path | None = None) -> dict[str, Any]:
    """Write the tables and plots of sweep directory ``root``; returns the table and the paths."""
    root = Path(root)
    runs, seed_key = load_sweep_dir(root)
    runs_with_metrics = [r for r in runs if r.rows]
    if not runs_with_metrics:
        raise FileNotFoundError(f"{root}: no run with a metrics.jsonl")
    out_dir = Path(out) if out else root
    out_dir.mkdir(parents=True, exist_ok=True)
    table = summarize(runs_with_metrics, seed_key)
    csv_path, md_path = write_tables(table, out_dir)
    pngs = plot_curves(runs_with_metrics, seed_key, out_dir)
    return {"table": table, "csv": csv_path, "markdown": md_path, "plots": pngs,
            "runs": len(runs), "with_metrics": len(runs_with_metrics)}


def report_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="fedrun report", description="Tables (summary.csv, summary.md) and plots (curves_*.png, clients.png) of "
        "a sweep or of one run: final metrics as mean +- std over seeds, learning curves against rounds and "
        "communicated floats, per-client and fine-tuned (personalized) accuracy where the runs have them.")
    parser.add_argument("sweep_dir", metavar="SWEEP_DIR|RUN_DIR",
                        help="a sweep directory (the sweep file's root, with sweep.json or run subdirectories) or "
                             "one run directory (with a metrics.jsonl)")
    parser.add_argument("--out", default=None, help="where to write (default: the sweep directory)")
    args = parser.parse_args(argv)
    try:
        rep = make_report(args.sweep_dir, args.out)
    except (OSError, ValueError) as exc:
        print(f"fedrun report: {exc}", file=sys.stderr)
        return 1
    print(rep["markdown"].read_text(), end="")
    print(f"{rep['with_metrics']}/{rep['runs']} runs with metrics; wrote {rep['csv']}, {rep['markdown']}, "
          + ", ".join(str(p) for p in rep["plots"]))
    return 0
