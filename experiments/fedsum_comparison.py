"""Scaled-down reproduction of the FedSUM paper's comparison and of FedAdamom vs FedAdam/FedAvgM.

Runs a grid of ``fedrun.run`` jobs (at most ``--jobs`` at a time, one process each), then writes a
markdown table (mean +- std over seeds of the final test accuracy, test loss and the training
objective f(x) = (1/N) sum_i f_i(x) at the final model) and PNG curves into ``--out``.

    python experiments/fedsum_comparison.py lr        # FedAvg learning-rate choice (the paper's protocol)
    python experiments/fedsum_comparison.py fedsum    # 9 algorithms x P1, P2, P3 x seeds
    python experiments/fedsum_comparison.py fedadamom # FedAdamom vs FedAdam, FedAvgM (and FedAvg)
    python experiments/fedsum_comparison.py report    # tables and plots from finished runs only

Finished runs (``result.json`` present, with ``objective.json``) are not rerun, so an interrupted grid
continues where it stopped. The scale and its reasons are in docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# ------------------------------------------------------------------------------------------ the grids

FEDSUM_ALGORITHMS = {  # name in the paper -> (fedrun algorithm, extra hyperparameters)
    "FedAvg": ("fedavg", {}),
    "FedAU": ("fedau", {"cutoff": 50}),
    "FedAWE": ("fedawe", {}),
    "FedVARP": ("fedvarp", {}),
    "MIFA": ("mifa", {}),
    "SCAFFOLD": ("scaffold", {}),
    "FedSUM-B": ("fedsum_b", {}),
    "FedSUM": ("fedsum", {}),
    "FedSUM-CR": ("fedsum_cr", {}),
}
PATTERNS = ("p1", "p2", "p3")

# The scaled-down FedSUM setup (docs/results.md says why each value): kept from the paper are S/N = 20%,
# Dirichlet 0.1, K = 10, batch 128, eta_0 / sqrt(t/10 + 1), eta_g = 1, FedAU cutoff 50 and one learning
# rate for every algorithm chosen by FedAvg; smaller are the data set (mnist5k), the model (softmax
# regression), N = 20 and S = 4 (the paper: 100 and 20) and the rounds (150; the paper: 2000).
FEDSUM_BASE: dict[str, Any] = {
    "run": {"rounds": 150, "threads": 1, "log_every": 1000},
    "data": {"name": "mnist5k", "num_clients": 20, "partition": "dirichlet", "alpha": 0.1},
    "model": {"name": "logistic"},
    "local": {"steps": 10, "batch_size": 128, "lr": 0.01, "lr_schedule": "inv_sqrt",
              "strategy": "sequential"},
    "participation": {"clients_per_round": 4},
    "eval": {"every": 10},
}
LR_GRID = (0.01, 0.03, 0.1, 0.3)  # eta_0 candidates for FedAvg (P1, LR_ROUNDS rounds), eta_g = 1
LR_ROUNDS = 100

# FedAdamom's README setup, scaled: 100 clients, 5% participation, Dirichlet 0.3, local SGD lr 0.1
# x 0.998 per round, weight decay 1e-3, gradient clip 10, 5 local epochs of batch 50.
FEDADAMOM_BASE: dict[str, Any] = {
    "run": {"rounds": 200, "threads": 1, "log_every": 1000},
    "data": {"name": "mnist5k", "num_clients": 100, "partition": "dirichlet", "alpha": 0.3},
    "model": {"name": "logistic"},
    "local": {"epochs": 5, "batch_size": 50, "lr": 0.1, "lr_schedule": "exponential", "lr_decay": 0.998,
              "weight_decay": 1e-3, "grad_clip": 10.0, "strategy": "sequential"},
    "participation": {"pattern": "uniform", "clients_per_round": 5},
    "eval": {"every": 10},
}
FEDADAMOM_ALGORITHMS = {
    "FedAdamom": ("fedadamom", {"global_lr": 1.0, "beta2": 0.05, "eps": 1e-3}),
    "FedAdam (eta=0.01)": ("fedadam", {"global_lr": 0.01}),
    "FedAdam (eta=0.1)": ("fedadam", {"global_lr": 0.1}),
    "FedAvgM": ("fedavgm", {"global_lr": 1.0, "beta": 0.9}),
    "FedAvgM (eta=0.1)": ("fedavgm", {"global_lr": 0.1, "beta": 0.9}),  # effective step eta/(1-beta) = 1
    "FedAvg": ("fedavg", {}),
}


def _merge(base: dict, extra: dict) -> dict:
    out = json.loads(json.dumps(base))
    for section, values in extra.items():
        out.setdefault(section, {}).update(values)
    return out


def job(root: Path, group: str, label: str, base: dict, extra: dict, seed: int, sub: str = "") -> dict:
    name = f"{label}_s{seed}".replace(" ", "").replace("(", "_").replace(")", "").replace("=", "")
    cfg = _merge(base, extra)
    cfg["run"].update({"name": name, "seed": seed, "dir": str(root / sub / group / name)})
    return {"group": group, "label": label, "seed": seed, "config": cfg}


def fedsum_jobs(root: Path, seeds: list[int], rounds: int | None, lr: float,
                patterns: tuple[str, ...] = PATTERNS) -> list[dict]:
    base = _merge(FEDSUM_BASE, {"run": {"rounds": rounds or FEDSUM_BASE["run"]["rounds"]}, "local": {"lr": lr}})
    jobs = []
    for seed in seeds:
        for pattern in patterns:
            for paper_name, (algo, hp) in FEDSUM_ALGORITHMS.items():
                extra = {"participation": {"pattern": pattern}, "algorithm": {"name": algo, **hp}}
                jobs.append(job(root, f"fedsum_{pattern}", paper_name, base, extra, seed, f"eta{lr}"))
    return jobs


def lr_jobs(root: Path) -> list[dict]:
    base = _merge(FEDSUM_BASE, {"run": {"rounds": LR_ROUNDS}, "participation": {"pattern": "p1"},
                                "algorithm": {"name": "fedavg"}})
    return [job(root, "lr", f"eta0={lr}", _merge(base, {"local": {"lr": lr}}), {}, 0) for lr in LR_GRID]


def fedadamom_jobs(root: Path, seeds: list[int], rounds: int | None) -> list[dict]:
    base = _merge(FEDADAMOM_BASE, {"run": {"rounds": rounds or FEDADAMOM_BASE["run"]["rounds"]}})
    return [job(root, "fedadamom", label, base, {"algorithm": {"name": algo, **hp}}, seed)
            for seed in seeds for label, (algo, hp) in FEDADAMOM_ALGORITHMS.items()]


# ------------------------------------------------------------------------------------------- running


def objective(cfg_dict: dict, x: np.ndarray) -> dict[str, float]:
    """f(x) = (1/N) sum_i f_i(x) over the run's own partition, and the example-weighted train loss."""
    import torch
    import torch.nn.functional as F

    from fedrun.config import config_from_dict
    from fedrun.data import load_task
    from fedrun.data.partition import partition
    from fedrun.models import build_model
    from fedrun.training.flat_model import FlatModel

    cfg = config_from_dict(cfg_dict)
    task = load_task(cfg.data, cfg.run.seed)
    parts = partition(task, cfg.data, cfg.run.seed)
    torch.manual_seed(0)
    model = FlatModel(build_model(cfg.model.name, task.x_train.shape[1:], task.num_classes))
    xt = torch.as_tensor(x, dtype=torch.float32)
    with torch.no_grad():
        losses = torch.cat([F.cross_entropy(model.forward(xt, torch.as_tensor(task.x_train[s:s + 1000])),
                                            torch.as_tensor(task.y_train[s:s + 1000]), reduction="none")
                            for s in range(0, len(task.y_train), 1000)]).numpy()
    per_client = np.array([losses[p].mean() for p in parts])
    return {"train_objective": float(per_client.mean()), "train_loss_examples": float(losses.mean())}


def _cache_mnist5k() -> None:
    """Read the mnist5k CSV once per worker process (its split does not depend on the seed)."""
    import fedrun.data as fdata

    original = fdata.BUILTIN["mnist5k"]
    if getattr(original, "cached", False):
        return
    memo: dict = {}

    def cached(cfg, seed):
        if cfg.test_fraction not in memo:
            memo[cfg.test_fraction] = original(cfg, seed)
        return memo[cfg.test_fraction]

    cached.cached = True
    fdata.BUILTIN["mnist5k"] = cached


def run_one(spec: dict) -> tuple[str, float, str]:
    import fedrun

    _cache_mnist5k()

    run_dir = Path(spec["config"]["run"]["dir"])
    if (run_dir / "result.json").is_file() and (run_dir / "objective.json").is_file():
        return str(run_dir), 0.0, "cached"
    if run_dir.exists():  # an unfinished earlier attempt: start over
        for f in sorted(run_dir.glob("*")):
            f.unlink()
    start = time.time()
    try:
        result = fedrun.run(spec["config"], write_files=True)
    except Exception as exc:  # keep the grid going; the report marks the run as missing
        (run_dir / "error.txt").write_text(f"{type(exc).__name__}: {exc}\n")
        return str(run_dir), time.time() - start, f"error: {exc}"
    for ckpt in run_dir.glob("ckpt_*.h5"):  # only the curves are needed; keep the disk small
        ckpt.unlink()
    (run_dir / "objective.json").write_text(json.dumps(objective(spec["config"], result.x)) + "\n")
    return str(run_dir), time.time() - start, "ok"


def run_all(jobs: list[dict], workers: int) -> None:
    start = time.time()
    done = 0
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        for run_dir, seconds, status in pool.imap_unordered(run_one, jobs):
            done += 1
            print(f"[{done}/{len(jobs)} {time.time() - start:6.0f}s] {status:6s} {seconds:5.1f}s {run_dir}",
                  flush=True)
    print(f"{len(jobs)} runs, {time.time() - start:.0f} s wall", flush=True)


# ------------------------------------------------------------------------------------------ reporting


def load_run(spec: dict) -> dict | None:
    run_dir = Path(spec["config"]["run"]["dir"])
    if not (run_dir / "objective.json").is_file():
        return None
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    evals = [m for m in metrics if "test_accuracy" in m]
    return {
        "metrics": metrics,
        "eval_rounds": np.array([m["round"] for m in evals]),
        "test_accuracy": np.array([m["test_accuracy"] for m in evals]),
        "test_loss": np.array([m["test_loss"] for m in evals]),
        "local_loss": np.array([m["train_loss"] for m in metrics], dtype=float),
        **json.loads((run_dir / "objective.json").read_text()),
    }


def summarize(jobs: list[dict]) -> dict[str, dict[str, dict]]:
    """group -> label -> {seeds: [...], runs: [...]} for the finished runs."""
    out: dict[str, dict[str, dict]] = {}
    for spec in jobs:
        run = load_run(spec)
        if run is None:
            continue
        entry = out.setdefault(spec["group"], {}).setdefault(spec["label"], {"seeds": [], "runs": []})
        entry["seeds"].append(spec["seed"])
        entry["runs"].append(run)
    return out


def _ms(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    v = np.asarray(values, dtype=float) * scale
    if len(v) == 1:
        return f"{v[0]:.{digits}f}"
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}"


def compact(groups: dict[str, dict[str, dict]], names: list[str]) -> str:
    """One row per algorithm, one column per group: final test accuracy (%) and train objective f(x)."""
    labels = list(FEDSUM_ALGORITHMS)
    head = " | ".join(f"{g.removeprefix('fedsum_').upper()}: test acc. (%) | {g.removeprefix('fedsum_').upper()}: f(x)"
                      for g in names)
    lines = [f"| algorithm | {head} |", "|---|" + "---|---|" * len(names)]
    for label in labels:
        cells = []
        for g in names:
            runs = groups.get(g, {}).get(label, {}).get("runs", [])
            if not runs:
                cells += ["–", "–"]
                continue
            cells += [_ms([r["test_accuracy"][-1] for r in runs], 100, 1),
                      _ms([r["train_objective"] for r in runs], digits=3)]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def rounds_to(run: dict, target: float) -> float:
    """The first evaluated round whose test accuracy reaches ``target`` (inf if none)."""
    hits = np.flatnonzero(run["test_accuracy"] >= target)
    return float(run["eval_rounds"][hits[0]]) if len(hits) else float("inf")


def table(groups: dict[str, dict[str, dict]], names: list[str], target: float | None = None,
          last: int = 5) -> str:
    """Mean ± std over seeds, rows sorted by final test accuracy. ``last``: evaluations (x eval.every
    rounds) over which the test-accuracy fluctuation is measured; ``target``: add rounds-to-accuracy."""
    lines = []
    for group in names:
        if group not in groups:
            continue
        extra = f" rounds to {target:.0%} |" if target is not None else ""
        lines += [f"**{group}**", "",
                  "| algorithm | seeds | test accuracy (%) | test loss | train objective f(x) | "
                  f"best test acc. (%) | acc. fluctuation, last {last} evals (pp) |{extra}",
                  "|---|---|---|---|---|---|---|" + ("---|" if target is not None else "")]
        rows = []
        for label, entry in groups[group].items():
            runs = entry["runs"]
            acc = [r["test_accuracy"][-1] for r in runs]
            cells = [str(len(runs)), _ms(acc, 100), _ms([r["test_loss"][-1] for r in runs], digits=3),
                     _ms([r["train_objective"] for r in runs], digits=3),
                     _ms([r["test_accuracy"].max() for r in runs], 100),
                     _ms([r["test_accuracy"][-last:].std() for r in runs], 100)]
            if target is not None:
                hits = [rounds_to(r, target) for r in runs]
                reached = [h for h in hits if np.isfinite(h)]
                cells.append((_ms(reached, digits=0) if reached else "never")
                             + (f" ({len(reached)}/{len(hits)} seeds)" if len(reached) < len(hits) else ""))
            rows.append((float(np.mean(acc)), label, cells))
        for _, label, cells in sorted(rows, key=lambda r: -r[0]):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def paired(groups: dict[str, dict[str, dict]], names: list[str], ours: list[str], others: list[str]) -> str:
    """Seed-paired differences (same seed: same partition, participation and minibatch draws):
    mean over seeds of ours - other in final test accuracy (pp) and train objective, and how many
    seeds ours is better on each."""
    lines = ["| pattern | comparison | Δ test acc. (pp) | acc. wins | Δ train objective | objective wins |",
             "|---|---|---|---|---|---|"]
    for group in names:
        g = groups.get(group, {})
        for a in ours:
            for b in others:
                if a not in g or b not in g or a == b:
                    continue
                ra = dict(zip(g[a]["seeds"], g[a]["runs"], strict=True))
                rb = dict(zip(g[b]["seeds"], g[b]["runs"], strict=True))
                common = sorted(set(ra) & set(rb))
                dacc = np.array([ra[s]["test_accuracy"][-1] - rb[s]["test_accuracy"][-1] for s in common])
                dobj = np.array([ra[s]["train_objective"] - rb[s]["train_objective"] for s in common])
                lines.append(f"| {group.removeprefix('fedsum_')} | {a} − {b} | {100 * dacc.mean():+.2f} | "
                             f"{int((dacc > 0).sum())}/{len(common)} | {dobj.mean():+.3f} | "
                             f"{int((dobj < 0).sum())}/{len(common)} |")
    return "\n".join(lines) + "\n"


def _smooth(y: np.ndarray, w: int) -> np.ndarray:
    """Moving mean over ``w`` rounds that skips empty rounds (NaN loss: no client was active)."""
    if w <= 1 or len(y) < w:
        return y
    ok = np.isfinite(y)
    total = np.convolve(np.where(ok, y, 0.0), np.ones(w), mode="valid")
    count = np.convolve(ok.astype(float), np.ones(w), mode="valid")
    return np.divide(total, count, out=np.full_like(total, np.nan), where=count > 0)


def plot_groups(groups: dict[str, dict[str, dict]], names: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [g for g in names if g in groups]
    fig, axes = plt.subplots(3, len(names), figsize=(4.6 * len(names), 10.5), squeeze=False)
    colors = plt.get_cmap("tab10")
    for j, group in enumerate(names):
        for k, (label, entry) in enumerate(groups[group].items()):
            runs = entry["runs"]
            color = colors(k % 10)
            style = "-" if label.startswith("FedSUM") or label.startswith("FedAdamom") else "--"
            r = runs[0]["eval_rounds"]
            for row, key in ((0, "test_accuracy"), (1, "test_loss")):
                ys = np.stack([run[key] for run in runs])
                mean = ys.mean(0) * (100 if key == "test_accuracy" else 1)
                axes[row, j].plot(r, mean, style, color=color, label=label, lw=1.3)
                if len(runs) > 1:
                    sd = ys.std(0) * (100 if key == "test_accuracy" else 1)
                    axes[row, j].fill_between(r, mean - sd, mean + sd, color=color, alpha=0.12, lw=0)
            local = np.stack([_smooth(run["local_loss"], 10) for run in runs]).mean(0)
            axes[2, j].plot(np.arange(len(local)) + 10, local, style, color=color, label=label, lw=1.0)
        axes[0, j].set_title(f"{title}: {group}")
        axes[0, j].set_ylabel("test accuracy (%)")
        axes[1, j].set_ylabel("test loss")
        axes[2, j].set_ylabel("loss on active clients' minibatches\n(during local steps; 10-round mean)")
        axes[1, j].set_yscale("log")
        axes[2, j].set_yscale("log")
        for row in range(3):
            axes[row, j].set_xlabel("round")
            axes[row, j].grid(alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def report(root: Path, out: Path, seeds: list[int], rounds: int | None, lr: float | None) -> None:
    """Tables (tables.md) and plots of every finished grid under ``root``; ``lr``: the chosen eta_0,
    reported first; the other eta_0 grids found under ``root`` follow (sensitivity checks)."""
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    lr_groups = summarize(lr_jobs(root))
    if lr_groups:
        parts.append(f"### FedAvg learning-rate choice (P1, seed 0, {LR_ROUNDS} rounds)\n")
        parts.append(table(lr_groups, ["lr"]))
    found = sorted(float(d.name[3:]) for d in root.glob("eta*") if d.is_dir())
    lrs = ([lr] if lr is not None else []) + [x for x in found if x != lr]
    for lr in lrs:
        groups = summarize(fedsum_jobs(root, seeds, rounds, lr))
        names = [f"fedsum_{p}" for p in PATTERNS]
        if groups:
            parts.append(f"### FedSUM comparison (eta_0 = {lr}, {rounds or FEDSUM_BASE['run']['rounds']} rounds)\n")
            parts.append("Summary: mean ± std over seeds at the last round\n")
            parts.append(compact(groups, names))
            parts.append(table(groups, names))
            plot_groups(groups, names, out / f"fedsum_comparison_eta{lr}.png", f"eta_0 = {lr}")
            baselines = ["FedAvg", "FedAU", "FedAWE", "FedVARP", "MIFA", "SCAFFOLD"]
            parts.append("Seed-paired differences, FedSUM and FedSUM-CR against each baseline "
                         "(wins: seeds on which the first is better)\n")
            parts.append(paired(groups, names, ["FedSUM", "FedSUM-CR"], baselines))
            parts.append("Within the FedSUM family\n")
            parts.append(paired(groups, names, ["FedSUM-CR", "FedSUM-B"], ["FedSUM"]))
    groups = summarize(fedadamom_jobs(root, seeds, rounds))
    if groups:
        parts.append(f"### FedAdamom vs FedAdam, FedAvgM ({rounds or FEDADAMOM_BASE['run']['rounds']} rounds)\n")
        parts.append(table(groups, ["fedadamom"], target=0.85))
        parts.append("Seed-paired differences\n")
        parts.append(paired(groups, ["fedadamom"], ["FedAdamom"],
                            ["FedAdam (eta=0.01)", "FedAdam (eta=0.1)", "FedAvgM", "FedAvgM (eta=0.1)",
                             "FedAvg"]))
        plot_groups(groups, ["fedadamom"], out / "fedadamom_comparison.png", "FedAdamom setup")
    (out / "tables.md").write_text("\n".join(parts))
    print("\n".join(parts))


def chosen_lr(root: Path) -> float:
    """The eta_0 with the best FedAvg test accuracy after LR_ROUNDS rounds (ties: the smaller)."""
    groups = summarize(lr_jobs(root)).get("lr", {})
    if len(groups) < len(LR_GRID):
        raise SystemExit("run the 'lr' step first (not all learning-rate runs are finished)")
    scores = {float(label.split("=")[1]): entry["runs"][0]["test_accuracy"][-1] for label, entry in groups.items()}
    return max(sorted(scores), key=lambda lr: scores[lr])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["lr", "fedsum", "fedadamom", "report"])
    parser.add_argument("--root", default=os.environ.get("FEDSUM_RUNS", "runs/experiments"),
                        help="where the run directories go (not committed)")
    parser.add_argument("--out", default=str(REPO / "docs" / "results"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, help="override the rounds of the setup (150 FedSUM, 200 FedAdamom)")
    parser.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=PATTERNS,
                        help="participation patterns of the FedSUM grid")
    parser.add_argument("--jobs", type=int, default=2, help="runs at the same time (one process each)")
    parser.add_argument("--lr", type=float, nargs="+",
                        help="eta_0 values for the FedSUM grid (default: the 'lr' step's choice)")
    args = parser.parse_args()
    root = Path(args.root).resolve()
    if args.step == "lr":
        run_all(lr_jobs(root), args.jobs)
        print(f"chosen eta_0 = {chosen_lr(root)}")
    elif args.step == "fedsum":
        for lr in args.lr or [chosen_lr(root)]:
            run_all(fedsum_jobs(root, args.seeds, args.rounds, lr, tuple(args.patterns)), args.jobs)
    elif args.step == "fedadamom":
        run_all(fedadamom_jobs(root, args.seeds, args.rounds), args.jobs)
    try:
        lr = chosen_lr(root)
    except SystemExit:
        lr = None
    report(root, Path(args.out), args.seeds, args.rounds, lr)


if __name__ == "__main__":
    main()
