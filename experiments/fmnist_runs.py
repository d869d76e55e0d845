"""The grids, the runs and the choices of the Fashion-MNIST comparisons (experiments/fmnist.py is the
command line; experiments/fmnist_report.py the tables, plots and diagnosis). Both import this module and
not each other.

Every run is ``fedrun.run`` on a base config of configs/fmnist/ plus dotted overrides, one at a time in
this process (the data set is read once). A finished run leaves a summary JSON under
docs/results/fmnist/<group>/ (curves, communication, the train objective f(x)); a run whose summary
exists is not run again, so an interrupted grid continues where it stopped, and ``report`` needs only
the summaries. Run directories go to runs/fmnist/ (not committed).

Choices are made on the training objective f(x) = (1/N) sum_i f_i(x) at the last round of seed 0
(estimated on up to 500 examples of each client), never on the test set.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OUT = REPO / "docs" / "results" / "fmnist"
FEDSUM_BASE = REPO / "configs" / "fmnist" / "fedsum_cnn.yaml"
FEDADAMOM_BASE = REPO / "configs" / "fmnist" / "fedadamom_cnn.yaml"
PAPER_BASE = REPO / "configs" / "fmnist" / "fedsum_paper.yaml"
SEEDS = (0, 1, 2)
PATTERNS = ("p1", "p2", "p3")

# ------------------------------------------------------------------------------------------ the grids

FEDSUM_ALGORITHMS = {  # label -> algorithm overrides
    "FedAvg": ["algorithm.name=fedavg"],
    "FedAU": ["algorithm.name=fedau", "algorithm.cutoff=50"],
    "FedAWE": ["algorithm.name=fedawe"],
    "FedVARP": ["algorithm.name=fedvarp"],
    "MIFA": ["algorithm.name=mifa"],
    "SCAFFOLD": ["algorithm.name=scaffold"],  # form original; single_uplink gives the same iterates
    "FedSUM-B": ["algorithm.name=fedsum_b"],
    "FedSUM": ["algorithm.name=fedsum"],
    "FedSUM-CR": ["algorithm.name=fedsum_cr"],
}
LR_GRID = (0.01, 0.03, 0.1, 0.3, 1.0)  # eta_0

FEDADAMOM_ALGORITHMS: dict[str, tuple[list[str], str, tuple[float, ...]]] = {
    # label -> (fixed overrides, the key of its grid, the grid); grids whose best value was at an edge
    # were extended by one value (FedAvgM 1.0, the adaptive servers 0.03, FAFED 0.001)
    "FedAdamom": (["algorithm.name=fedadamom", "algorithm.beta2=0.05"], "algorithm.global_lr", (0.3, 1.0, 3.0)),
    "FedAvgM": (["algorithm.name=fedavgm", "algorithm.beta=0.9"], "algorithm.global_lr", (0.03, 0.1, 0.3, 1.0)),
    "FedAdam": (["algorithm.name=fedadam"], "algorithm.global_lr", (0.001, 0.003, 0.01, 0.03)),
    "FedYogi": (["algorithm.name=fedyogi"], "algorithm.global_lr", (0.001, 0.003, 0.01, 0.03)),
    "FedAdagrad": (["algorithm.name=fedadagrad"], "algorithm.global_lr", (0.001, 0.003, 0.01, 0.03)),
    "FADAS": (["algorithm.name=fadas"], "algorithm.global_lr", (0.001, 0.003, 0.01, 0.03)),
    # client-side adaptive methods: plain averaging on the server, the grid is the client's lr
    "FedCAda": (["algorithm.name=fedcada"], "local.lr", (0.001, 0.003, 0.01)),
    "FAFED": (["algorithm.name=fafed"], "local.lr", (0.001, 0.003, 0.01, 0.03)),
}
# The participation cases of the FedSUM paper (S = 4 of N = 20 where S is used). Biased sampling is H.8's
# profile, ten groups of clients from p = 0.50 down to 0.05 in steps of 0.05, compressed from N = 100 to
# N = 20 (two clients per group): H.8's literal p_i at N = 20 would be 0.50 and 0.45 only, no bias.
CASES = {
    "Case 1": ["participation.pattern=uniform"],
    "Case 2": ["participation.pattern=bernoulli"],  # p = S/N = 0.2
    "Case 3": ["participation.pattern=cyclic"],
    "Case 4": ["participation.pattern=reshuffled_cyclic"],
    "Biased": ["participation.pattern=bernoulli", "participation.probability_file=configs/fmnist/biased_n20.csv"],
}
CASE_ALGORITHMS = ("FedSUM", "FedAvg")
CASE2_PROBABILITIES = (0.05, 0.1, 0.2, 0.5, 0.8)
# FAdamGC (P1, the FedSUM setup): its corrected local AMSGrad against the same without the correction;
# FedAvg and SCAFFOLD at their own eta_0 come from the tuned FedSUM comparison
FADAMGC_ALGORITHMS = {
    "FAdamGC": ["algorithm.name=fadamgc"],
    "Local Adam": ["algorithm.name=fadamgc", "algorithm.correction=false"],
}
ADAM_LR_GRID = (0.0003, 0.001, 0.003)
ALPHAS = (0.1, 0.5)
CHOOSE_FROM = {0.5: 0.1}  # Dirichlet 0.5 ran at the values chosen at 0.1 (no grid of its own: CPU budget)
BETA2_GRID = (0.01, 0.05, 0.1, 0.3, 0.9)


# ------------------------------------------------------------------------------------------- running


def base_config(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def spec(group: str, label: str, base: Path, overrides: list[str], seed: int, out: Path = OUT) -> dict:
    """One run: ``base`` plus ``overrides`` at ``seed``; its summary goes to ``out/group/<name>.json``."""
    name = f"{label}_s{seed}".replace(" ", "").replace("(", "_").replace(")", "").replace("=", "")
    return {"group": group, "label": label, "seed": seed, "base": str(base.relative_to(REPO)),
            "overrides": [*overrides, f"run.seed={seed}", f"run.name={name}",
                          f"run.dir=runs/{out.name}/{group}/{name}"],
            "summary": str((out / group / f"{name}.json").relative_to(REPO))}


_TASKS: dict = {}


def _cache_datasets() -> None:
    """Read each on-disk data set once per process (its arrays do not depend on the seed)."""
    import fedrun.data as fdata

    original = getattr(fdata, "load_dataset", None)
    if original is None or getattr(original, "cached", False):
        return

    def cached(name, root, seed, test_fraction):
        key = (name, root, test_fraction)
        if key not in _TASKS:
            _TASKS[key] = original(name, root, seed, test_fraction)
        return _TASKS[key]

    cached.cached = True
    fdata.load_dataset = cached


def objective(cfg_dict: dict, x: np.ndarray, per_client: int = 500) -> float:
    """f(x) = (1/N) sum_i f_i(x), each f_i estimated on up to ``per_client`` of client i's examples (a
    fixed seeded choice), with the model in evaluation mode (no dropout)."""
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
    rng = np.random.default_rng(12345)
    torch.manual_seed(0)
    model = FlatModel(build_model(cfg.model.name, task.x_train.shape[1:], task.num_classes))
    model.module.eval()
    xt = torch.as_tensor(x, dtype=torch.float32)
    losses = []
    with torch.no_grad():
        for p in parts:
            idx = np.sort(rng.choice(p, size=min(per_client, len(p)), replace=False))
            out = model.forward(xt, torch.as_tensor(task.x_train[idx]))
            losses.append(float(F.cross_entropy(out, torch.as_tensor(task.y_train[idx])).item()))
    return float(np.mean(losses))


def run_one(s: dict) -> str:
    import fedrun
    from fedrun.config import apply_override

    summary = REPO / s["summary"]
    if summary.is_file():
        return "cached"
    _cache_datasets()
    cfg = base_config(REPO / s["base"])
    for item in s["overrides"]:
        apply_override(cfg, item)
    start = time.time()
    from fedrun.errors import NumericalError

    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.with_suffix(".error.txt").unlink(missing_ok=True)
    try:
        # a long run checkpoints (its base config's checkpoint.every) and continues from its newest
        # checkpoint after an interruption; a short one has none and starts again
        result = fedrun.run(cfg, write_files=True, resume="auto")
    except NumericalError as exc:  # diverged: a finished run whose outcome is "diverged"
        out = {k: s[k] for k in ("group", "label", "seed", "base", "overrides")}
        out.update({"finite": False, "error": str(exc), "train_objective": None, "test_accuracy": [],
                    "test_loss": [], "wall_s": round(time.time() - start, 2)})
        summary.write_text(json.dumps(out) + "\n")
        return "diverged"
    except Exception as exc:  # keep the grid going; the run stays unfinished and the report omits it
        (summary.with_suffix(".error.txt")).write_text(f"{type(exc).__name__}: {exc}\n")
        return f"error: {type(exc).__name__}: {exc}"
    wall = time.time() - start
    metrics_file = REPO / next(o for o in s["overrides"] if o.startswith("run.dir=")).split("=", 1)[1] / "metrics.jsonl"
    m = [json.loads(line) for line in metrics_file.read_text().splitlines()]  # every round, resumed ones too
    evals = [r for r in m if "test_accuracy" in r]
    x = np.asarray(result.x)
    out = {k: s[k] for k in ("group", "label", "seed", "base", "overrides")}
    out.update({
        "rounds": len(m),
        "eval_rounds": [r["round"] for r in evals],  # rounds count from 1
        "test_accuracy": [r["test_accuracy"] for r in evals],
        "test_loss": [r["test_loss"] for r in evals],
        "eval_cum_uplink": [r["cum_uplink_floats"] for r in evals],
        "eval_cum_downlink": [r["cum_downlink_floats"] for r in evals],
        "train_loss": [r["train_loss"] if r["train_loss"] == r["train_loss"] else None for r in m],
        "active_clients": [r["active_clients"] for r in m],
        "train_objective": objective(cfg, x) if np.isfinite(x).all() else None,
        "finite": bool(np.isfinite(x).all()),
        "wall_s": round(wall, 2),
    })
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text(json.dumps(out) + "\n")
    return "ok"


def run_all(specs: list[dict]) -> None:
    start = time.time()
    for i, s in enumerate(specs, 1):
        t = time.time()
        status = run_one(s)
        if status != "cached":
            print(f"[{i}/{len(specs)} {time.time() - start:6.0f}s] {status:6s} {time.time() - t:5.1f}s "
                  f"{s['summary']}", flush=True)
    print(f"{len(specs)} runs, {time.time() - start:.0f} s wall", flush=True)


def load(s: dict) -> dict | None:
    p = REPO / s["summary"]
    return json.loads(p.read_text()) if p.is_file() else None


# ------------------------------------------------------------------------------------------- choices


def lr_specs() -> list[dict]:
    """FedAvg on P1, seed 0, at every eta_0 of the grid (these runs are also part of the 'tune' step)."""
    return [s for lr in LR_GRID for s in fedsum_specs(lr, seeds=(0,), patterns=("p1",), labels=["FedAvg"])]


def best(rows: dict[float, dict | None]) -> float | None:
    """The grid value with the lowest final train objective (non-finite runs lose; ties: the smaller)."""
    scores = {v: (r["train_objective"] if r and r["finite"] and r["train_objective"] is not None else np.inf)
              for v, r in rows.items()}
    if any(r is None for r in rows.values()):
        return None
    return min(sorted(scores), key=lambda v: scores[v])


def shared_lr() -> float:
    """The eta_0 every algorithm shares: the configured one (set from the 'lr' step's choice)."""
    return float(base_config(FEDSUM_BASE)["local"]["lr"])


def fedsum_specs(lr: float | None = None, seeds=SEEDS, patterns=PATTERNS, labels=None) -> list[dict]:
    """The FedSUM comparison at eta_0 = ``lr`` (default: the shared one), group eta<lr>/<pattern>."""
    lr = shared_lr() if lr is None else lr
    out = []
    for seed in seeds:
        for pattern in patterns:
            for label, ov in FEDSUM_ALGORITHMS.items():
                if labels is None or label in labels:
                    out.append(spec(f"eta{lr}/{pattern}", label, FEDSUM_BASE,
                                    [*ov, f"participation.pattern={pattern}", f"local.lr={lr}"], seed))
    return out


def tune_specs() -> list[dict]:
    """Every algorithm at the shared eta_0's neighbours in LR_GRID (P1, seed 0); a second call adds the
    next value down for an algorithm whose best so far is the lowest value it was run at."""
    i = LR_GRID.index(shared_lr())
    values = set(LR_GRID[max(0, i - 1):i + 2])
    out = []
    for label in FEDSUM_ALGORITHMS:
        mine = set(values)
        best_lr = tuned_lrs(done_only=True).get(label)
        tried = sorted(lr for lr in LR_GRID if load(fedsum_specs(lr, (0,), ("p1",), [label])[0]) is not None)
        if best_lr is not None and tried and best_lr == tried[0] and LR_GRID.index(best_lr) > 0:
            mine.add(LR_GRID[LR_GRID.index(best_lr) - 1])
        out += [s for lr in sorted(mine) for s in fedsum_specs(lr, seeds=(0,), patterns=("p1",), labels=[label])]
    return out


def tuned_lrs(done_only: bool = False) -> dict[str, float | None]:
    """Each algorithm's eta_0 with the lowest train objective on P1, seed 0, among the values it was run
    at (its tuning grid: the shared eta_0 and its neighbours, extended downwards while the best is the
    lowest); None until the neighbours are done (``done_only``: whatever has been run)."""
    i = LR_GRID.index(shared_lr())
    needed = set(LR_GRID[max(0, i - 1):i + 2])
    out = {}
    for label in FEDSUM_ALGORITHMS:
        rows = {lr: load(fedsum_specs(lr, (0,), ("p1",), [label])[0]) for lr in LR_GRID}
        done = {lr: r for lr, r in rows.items() if r is not None}
        if not done_only and not needed <= set(done):
            out[label] = None
            continue
        out[label] = best(done) if done else None
    return out


def tuned_specs(patterns=PATTERNS) -> list[dict]:
    out = []
    for label, lr in tuned_lrs().items():
        if lr is not None:
            out += fedsum_specs(lr, patterns=patterns, labels=[label])
    return out


def own_lr(label: str) -> float:
    lr = tuned_lrs()[label]
    if lr is None:
        raise SystemExit(f"{label}'s eta_0 is not chosen yet: run 'python experiments/fmnist.py tune' first")
    return lr


def case_specs() -> list[dict]:
    """FedSUM and FedAvg, each at its own eta_0, under every case x seeds (group cases/<case>)."""
    return [spec(f"cases/{case.replace(' ', '')}", label, FEDSUM_BASE,
                 [*FEDSUM_ALGORITHMS[label], *ov, f"local.lr={own_lr(label)}"], seed)
            for seed in SEEDS for case, ov in CASES.items() for label in CASE_ALGORITHMS]


def case2p_specs() -> list[dict]:
    """FedSUM at its own eta_0 under Case 2 with every client's p in CASE2_PROBABILITIES (group case2p)."""
    return [spec("case2p", f"FedSUM p={p}", FEDSUM_BASE,
                 [*FEDSUM_ALGORITHMS["FedSUM"], "participation.pattern=bernoulli", f"participation.probability={p}",
                  f"local.lr={own_lr('FedSUM')}"], seed)
            for seed in SEEDS for p in CASE2_PROBABILITIES]


def fadamgc_specs(choose: bool = False) -> list[dict]:
    """The local-lr grid on seed 0 (P1); with ``choose``, each variant at its best lr on every seed."""
    out = []
    for label, ov in FADAMGC_ALGORITHMS.items():
        grid = {lr: spec("fadamgc", f"{label} lr={lr}", FEDSUM_BASE, [*ov, f"local.lr={lr}"], 0) for lr in ADAM_LR_GRID}
        if not choose:
            out += grid.values()
            continue
        lr = best({v: load(s) for v, s in grid.items()})
        if lr is not None:
            out += [spec("fadamgc", f"{label} lr={lr}", FEDSUM_BASE, [*ov, f"local.lr={lr}"], seed) for seed in SEEDS]
    return out


def fedadamom_specs(seeds=(0,), choose: bool = False, alphas=ALPHAS, choose_from: float | None = None) -> list[dict]:
    """The grids on seed 0; with ``choose``, each algorithm at its chosen value on ``seeds`` (chosen at the
    same alpha, or at ``choose_from`` when given)."""
    out = []
    for alpha in alphas:
        for label, (fixed, key, grid) in FEDADAMOM_ALGORITHMS.items():
            values = grid
            if choose:
                c = fedadamom_choice(alpha if choose_from is None else choose_from, label)
                if c is None:
                    continue
                values = (c,)
            for v in values:
                for seed in seeds:
                    out.append(spec(f"fedadamom/alpha{alpha}", f"{label} {key.split('.')[-1]}={v}",
                                    FEDADAMOM_BASE, [*fixed, f"{key}={v}", f"data.alpha={alpha}"], seed))
    return out


def fedadamom_choice(alpha: float, label: str) -> float | None:
    fixed, key, grid = FEDADAMOM_ALGORITHMS[label]
    rows = {v: load(spec(f"fedadamom/alpha{alpha}", f"{label} {key.split('.')[-1]}={v}", FEDADAMOM_BASE,
                         [*fixed, f"{key}={v}", f"data.alpha={alpha}"], 0)) for v in grid}
    return best(rows)


PAPER_OUT = REPO / "docs" / "results" / "fedsum_paper"
PAPER_ALGORITHMS = ("FedAvg", "FedSUM", "FedSUM-CR", "MIFA")


def paper_specs() -> list[dict]:
    """FedSUM at the paper's own settings (configs/fmnist/fedsum_paper.yaml), seed 0, P1 first."""
    return [spec(pattern, label, PAPER_BASE, [*FEDSUM_ALGORITHMS[label], f"participation.pattern={pattern}"], 0,
                 out=PAPER_OUT)
            for pattern in PATTERNS for label in PAPER_ALGORITHMS]


def ablation_specs() -> list[dict]:
    return [spec("fedadamom_beta2/alpha0.1", f"FedAdamom beta2={b}", FEDADAMOM_BASE,
                 ["algorithm.name=fedadamom", f"algorithm.beta2={b}", "data.alpha=0.1"], 0) for b in BETA2_GRID]
