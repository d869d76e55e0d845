"""The grids, the runs and the choices of the Fashion-MNIST comparisons (experiments/fmnist.py is the
command line; experiments/fmnist_report.py the tables, plots and diagnosis). Both import this module and
not each other.

Every run is ``fedrun.run`` on a base config of configs/fmnist/ plus dotted overrides, one at a time in
this process (the data set is read once). A finished run leaves a summary JSON under
docs/results/fmnist_10seeds/<group>/ (curves, communication, the train objective f(x)); a run whose summary
exists is not run again, so an interrupted grid continues where it stopped, and ``report`` needs only
the summaries. Run directories go to runs/fmnist_10seeds/ and runs/fedsum_paper/ (not committed).

Ten seeds (0-9) are reported. Every choice of a learning rate is made on separate tuning seeds (100 and
101), on the training objective f(x) = (1/N) sum_i f_i(x) at the last round averaged over them (each f_i
estimated on up to 500 of client i's examples), never on the test set and never on a reported seed.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

OUT = REPO / "docs" / "results" / "fmnist_10seeds"
FEDSUM_BASE = REPO / "configs" / "fmnist" / "fedsum_cnn.yaml"
FEDADAMOM_BASE = REPO / "configs" / "fmnist" / "fedadamom_cnn.yaml"
PAPER_BASE = REPO / "configs" / "fmnist" / "fedsum_paper.yaml"
SEEDS = tuple(range(10))  # the reported seeds
TUNE_SEEDS = (100, 101)  # every learning-rate choice is made on these, never on a reported seed
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
PAPER_LR_GRID = (0.01, 0.005, 0.001, 0.0005)  # the FedSUM paper's eta_0 grid, searched with FedAvg (Sec. 5)

FEDADAMOM_ALGORITHMS: dict[str, tuple[list[str], str, tuple[float, ...]]] = {
    # label -> (fixed overrides, the key of its grid, the grid); grids whose best value was at an edge
    # were extended by one value (FedAvgM 1.0, the adaptive servers 0.03, FAFED 0.001; on the tuning seeds
    # 100-101 FedAdagrad chose 0.03, its edge, so it gained 0.1)
    "FedAdamom": (["algorithm.name=fedadamom", "algorithm.beta2=0.05"], "algorithm.global_lr", (0.3, 1.0, 3.0)),
    "FedAvgM": (["algorithm.name=fedavgm", "algorithm.beta=0.9"], "algorithm.global_lr", (0.03, 0.1, 0.3, 1.0)),
    "FedAdam": (["algorithm.name=fedadam"], "algorithm.global_lr", (0.001, 0.003, 0.01, 0.03)),
    "FedYogi": (["algorithm.name=fedyogi"], "algorithm.global_lr", (0.001, 0.003, 0.01, 0.03)),
    "FedAdagrad": (["algorithm.name=fedadagrad"], "algorithm.global_lr", (0.001, 0.003, 0.01, 0.03, 0.1)),
    "FADAS": (["algorithm.name=fadas"], "algorithm.global_lr", (0.001, 0.003, 0.01, 0.03)),
    # client-side adaptive methods: plain averaging on the server, the grid is the client's lr
    "FedCAda": (["algorithm.name=fedcada"], "local.lr", (0.001, 0.003, 0.01)),
    "FAFED": (["algorithm.name=fafed"], "local.lr", (0.001, 0.003, 0.01, 0.03)),
    # plain FedAvg (server lr only): the no-momentum, non-adaptive reference of the flatness comparison
    "FedAvg": (["algorithm.name=fedavg"], "algorithm.global_lr", (0.3, 1.0, 3.0)),
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
CHOOSE_AT = 0.1  # the FedAdamom grids run at Dirichlet 0.1; Dirichlet 0.5 uses the same choices (CPU budget)
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


def run_dir(s: dict) -> Path:
    """The run directory of ``s`` (its run.dir override, relative to the repository)."""
    return REPO / next(o for o in s["overrides"] if o.startswith("run.dir=")).split("=", 1)[1]


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


def _provenance(run: Path) -> dict:
    """What the run's bits depend on beyond its config, from its runtime.json: the git commit, the CPU kind
    and the library versions (the same bits need the same of each; docs/results.md)."""
    record = json.loads((run / "runtime.json").read_text()).get("provenance", {})
    return {k: record.get(k) for k in ("git_commit", "git_dirty", "cpu", "python", "versions")}


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
    from fedrun.errors import NumericalError, RunInterrupted

    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.with_suffix(".error.txt").unlink(missing_ok=True)
    try:
        # a long run checkpoints (its base config's checkpoint.every), shows fedrun's progress line (every
        # run.log_every rounds) and continues from its newest checkpoint after an interruption; a short one
        # has none of these and starts again
        long_run = cfg.get("checkpoint", {}).get("every", 0) > 0
        result = fedrun.run(cfg, write_files=True, resume="auto", progress=long_run)
    except NumericalError as exc:  # diverged: a finished run whose outcome is "diverged"
        out = {k: s[k] for k in ("group", "label", "seed", "base", "overrides")}
        out.update({"finite": False, "error": str(exc), "train_objective": None, "test_accuracy": [],
                    "test_loss": [], "wall_s": round(time.time() - start, 2)})
        summary.write_text(json.dumps(out) + "\n")
        return "diverged"
    except RunInterrupted:  # a stop signal (SIGTERM, Ctrl-C): the run checkpointed; stop the whole step
        raise SystemExit(f"interrupted during {s['summary']}: run the same step again to continue") from None
    except Exception as exc:  # keep the grid going; the run stays unfinished and the report omits it
        (summary.with_suffix(".error.txt")).write_text(f"{type(exc).__name__}: {exc}\n")
        return f"error: {type(exc).__name__}: {exc}"
    wall = time.time() - start
    metrics_file = run_dir(s) / "metrics.jsonl"
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
        "provenance": _provenance(run_dir(s)),
    })
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text(json.dumps(out) + "\n")
    return "ok"


def run_all(specs: list[dict]) -> None:
    """Run every unfinished spec in order, with a progress line per run (done/total, elapsed, ETA)."""
    start = time.time()
    todo = [s for s in specs if load(s) is None]
    print(f"{len(specs) - len(todo)} of {len(specs)} runs finished already, {len(todo)} to do", flush=True)
    for i, s in enumerate(todo, 1):
        t = time.time()
        status = run_one(s)
        elapsed = time.time() - start
        eta = elapsed / i * (len(todo) - i)
        print(f"[{i}/{len(todo)} {elapsed:6.0f}s, ETA {eta / 60:4.0f} min] {status:6s} {time.time() - t:5.1f}s "
              f"{s['summary']}", flush=True)
    print(f"{len(todo)} runs, {time.time() - start:.0f} s wall", flush=True)


def load(s: dict) -> dict | None:
    p = REPO / s["summary"]
    return json.loads(p.read_text()) if p.is_file() else None


# ------------------------------------------------------------------------------------------- choices


def best(rows: dict[float, list[dict | None]]) -> float | None:
    """The grid value with the lowest final train objective averaged over the tuning seeds (a value with a
    non-finite run loses; ties: the smaller value); None while any run of the grid is unfinished."""
    if any(r is None for runs in rows.values() for r in runs):
        return None
    scores = {v: (float(np.mean([r["train_objective"] for r in runs]))
                  if all(r["finite"] and r["train_objective"] is not None for r in runs) else np.inf)
              for v, runs in rows.items()}
    return min(sorted(scores), key=lambda v: scores[v])


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
    """Every algorithm of the FedSUM comparison at every eta_0 of LR_GRID, P1, on the tuning seeds."""
    return [s for lr in LR_GRID for s in fedsum_specs(lr, seeds=TUNE_SEEDS, patterns=("p1",))]


def grid_specs() -> list[dict]:
    """Every tuning grid (the FedSUM comparison's eta_0, the FedAdamom comparison's server lr, FAdamGC's
    local lr), on the tuning seeds."""
    return tune_specs() + fedadamom_specs() + fadamgc_specs()


def tuned_lrs() -> dict[str, float | None]:
    """Each algorithm's eta_0: the lowest train objective on P1 averaged over the tuning seeds (None until
    its grid is finished)."""
    return {label: best({lr: [load(s) for s in fedsum_specs(lr, TUNE_SEEDS, ("p1",), [label])] for lr in LR_GRID})
            for label in FEDSUM_ALGORITHMS}


def shared_lr() -> float:
    """The eta_0 every algorithm shares in the paper's protocol: FedAvg's choice."""
    return own_lr("FedAvg")


def own_lr(label: str) -> float:
    lr = tuned_lrs()[label]
    if lr is None:
        raise SystemExit(f"{label}'s eta_0 is not chosen yet: run 'python experiments/fmnist.py tune' first")
    return lr


def paper_grid_tune_specs() -> list[dict]:
    """FedAvg at every eta_0 of the paper's grid PAPER_LR_GRID, P1, on the tuning seeds: the paper chooses
    the one eta_0 every algorithm shares with FedAvg."""
    return [s for lr in PAPER_LR_GRID for s in fedsum_specs(lr, TUNE_SEEDS, ("p1",), ["FedAvg"])]


def paper_grid_lr() -> float:
    """FedAvg's choice on the paper's grid (lowest mean f(x) on the tuning seeds, as for ``shared_lr``)."""
    lr = best({lr: [load(s) for s in fedsum_specs(lr, TUNE_SEEDS, ("p1",), ["FedAvg"])] for lr in PAPER_LR_GRID})
    if lr is None:
        raise SystemExit("FedAvg's eta_0 on the paper's grid is not chosen yet: run "
                         "'python experiments/fmnist.py paper_grid' first")
    return lr


def paper_grid_specs() -> list[dict]:
    """The FedSUM comparison (9 algorithms x P1-P3 x the reported seeds) at FedAvg's choice on the paper's
    grid: the shared-eta_0 table under the paper's own protocol."""
    return fedsum_specs(paper_grid_lr())


def tuned_specs(patterns=PATTERNS) -> list[dict]:
    """Every algorithm at its own eta_0 x ``patterns`` x the reported seeds."""
    return [s for label in FEDSUM_ALGORITHMS for s in fedsum_specs(own_lr(label), patterns=patterns, labels=[label])]


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


def _fadamgc(label: str, lr: float, seed: int) -> dict:
    return spec("fadamgc", f"{label} lr={lr}", FEDSUM_BASE, [*FADAMGC_ALGORITHMS[label], f"local.lr={lr}"], seed)


def fadamgc_specs(choose: bool = False) -> list[dict]:
    """The local-lr grid on the tuning seeds (P1); with ``choose``, each variant at its best lr on the
    reported seeds."""
    out = []
    for label in FADAMGC_ALGORITHMS:
        if not choose:
            out += [_fadamgc(label, lr, seed) for lr in ADAM_LR_GRID for seed in TUNE_SEEDS]
            continue
        lr = best({v: [load(_fadamgc(label, v, seed)) for seed in TUNE_SEEDS] for v in ADAM_LR_GRID})
        if lr is not None:
            out += [_fadamgc(label, lr, seed) for seed in SEEDS]
    return out


def _fedadamom(alpha: float, label: str, value: float, seed: int) -> dict:
    fixed, key, _ = FEDADAMOM_ALGORITHMS[label]
    return spec(f"fedadamom/alpha{alpha}", f"{label} {key.split('.')[-1]}={value}", FEDADAMOM_BASE,
                [*fixed, f"{key}={value}", f"data.alpha={alpha}"], seed)


def fedadamom_specs(choose: bool = False, alphas=ALPHAS) -> list[dict]:
    """The grids on the tuning seeds at Dirichlet 0.1; with ``choose``, each algorithm at its chosen value
    (chosen at 0.1 for every alpha) on the reported seeds."""
    out = []
    for alpha in alphas:
        for label, (_, _, grid) in FEDADAMOM_ALGORITHMS.items():
            if not choose:
                if alpha == CHOOSE_AT:
                    out += [_fedadamom(alpha, label, v, seed) for v in grid for seed in TUNE_SEEDS]
                continue
            c = fedadamom_choice(label)
            if c is not None:
                out += [_fedadamom(alpha, label, c, seed) for seed in SEEDS]
    return out


def fedadamom_choice(label: str) -> float | None:
    """The value of the algorithm's grid with the lowest mean f(x) over the tuning seeds, at CHOOSE_AT."""
    grid = FEDADAMOM_ALGORITHMS[label][2]
    return best({v: [load(_fedadamom(CHOOSE_AT, label, v, seed)) for seed in TUNE_SEEDS] for v in grid})


PAPER_OUT = REPO / "docs" / "results" / "fedsum_paper"
PAPER_ALGORITHMS = ("FedAvg", "FedSUM", "FedSUM-CR", "MIFA")


def paper_specs() -> list[dict]:
    """FedSUM at the paper's own settings (configs/fmnist/fedsum_paper.yaml), seed 0, P1 first."""
    return [spec(pattern, label, PAPER_BASE, [*FEDSUM_ALGORITHMS[label], f"participation.pattern={pattern}"], 0,
                 out=PAPER_OUT)
            for pattern in PATTERNS for label in PAPER_ALGORITHMS]


def ablation_specs() -> list[dict]:
    """FedAdamom's beta2 over BETA2_GRID at its base config (Dirichlet 0.1), on the reported seeds."""
    return [spec("fedadamom_beta2/alpha0.1", f"FedAdamom beta2={b}", FEDADAMOM_BASE,
                 ["algorithm.name=fedadamom", f"algorithm.beta2={b}", "data.alpha=0.1"], seed)
            for seed in SEEDS for b in BETA2_GRID]


# ------------------------------------------------------------------------- the claims as the seed states them

CASE2_CONSTANT = ["local.lr=0.01", "local.lr_schedule=constant", "algorithm.global_lr=1.0"]  # H.4, Fig. 10
FAMILY_ALGORITHMS = ("FedSUM-B", "FedSUM", "FedSUM-CR")
FAMILY_128 = ["local.batch_size=128", "local.lr=0.1", "local.lr_schedule=constant"]  # H.5, Fig. 11


def case2p_constant_specs() -> list[dict]:
    """FedSUM under Case 2 at every p of CASE2_PROBABILITIES with the constant rates Fig. 10 states
    (eta_g = 1, eta_l = 0.01), group case2p_constant."""
    return [spec("case2p_constant", f"FedSUM p={p}", FEDSUM_BASE,
                 [*FEDSUM_ALGORITHMS["FedSUM"], "participation.pattern=bernoulli", f"participation.probability={p}",
                  *CASE2_CONSTANT], seed)
            for seed in SEEDS for p in CASE2_PROBABILITIES]


def family128_specs() -> list[dict]:
    """FedSUM-B, FedSUM and FedSUM-CR at the conditions H.5 states for Fig. 11: batch 128 and a constant
    eta_l = 0.1, P1-P3 x the reported seeds (group family128/<pattern>)."""
    return [spec(f"family128/{pattern}", label, FEDSUM_BASE,
                 [*FEDSUM_ALGORITHMS[label], f"participation.pattern={pattern}", *FAMILY_128], seed)
            for seed in SEEDS for pattern in PATTERNS for label in FAMILY_ALGORITHMS]


def ablation_iid_specs() -> list[dict]:
    """FedAdamom's beta2 over BETA2_GRID with an i.i.d. partition (the paper's second beta2 row), on the
    reported seeds."""
    return [spec("fedadamom_beta2/iid", f"FedAdamom beta2={b}", FEDADAMOM_BASE,
                 ["algorithm.name=fedadamom", f"algorithm.beta2={b}", "data.partition=iid"], seed)
            for seed in SEEDS for b in BETA2_GRID]


SMALL_BATCH = 16  # H.5: "Under a smaller batch size (e.g., 8 or 16), the performance of FedSUM-B degrades"


def family_small_batch_specs() -> list[dict]:
    """The FedSUM family at H.5's constant eta_l = 0.1 with batch SMALL_BATCH instead of 128, P1-P3 x the
    reported seeds (group family16/<pattern>)."""
    return [spec(f"family{SMALL_BATCH}/{pattern}", label, FEDSUM_BASE,
                 [*FEDSUM_ALGORITHMS[label], f"participation.pattern={pattern}", f"local.batch_size={SMALL_BATCH}",
                  "local.lr=0.1", "local.lr_schedule=constant"], seed)
            for seed in SEEDS for pattern in PATTERNS for label in FAMILY_ALGORITHMS]


def fafed_full_specs() -> list[dict]:
    """FAFED at its chosen client lr with every client in every round (Dirichlet 0.1, the reported seeds),
    against its partial-participation runs of the FedAdamom comparison (group fedadamom/alpha0.1_full)."""
    fixed, key, _ = FEDADAMOM_ALGORITHMS["FAFED"]
    c = fedadamom_choice("FAFED")
    return [spec(f"fedadamom/alpha{CHOOSE_AT}_full", f"FAFED {key.split('.')[-1]}={c}", FEDADAMOM_BASE,
                 [*fixed, f"{key}={c}", f"data.alpha={CHOOSE_AT}", "participation.pattern=full"], seed)
            for seed in SEEDS]


PROBE_PATTERNS = ("p2", "p3")
PROBE_ARMS = {  # label -> overrides on FedSUM at the shared eta_0 (N = 20): the readings of the server step
    "FedSUM no-K": ["algorithm.global_lr=0.2"],  # x -= eta_l y / N: the step without K (global_lr = 1/K, K = 5)
    "FedSUM skip-empty": ["algorithm.skip_empty_rounds=true"],  # no stale step in a round without clients
}
# N = 100 with the N = 20 recipe: eta_0 = 0.3, K = 5, batch 32, 100 rounds, no checkpoints (short runs)
PROBE_N100 = ["local.lr=0.3", "local.steps=5", "local.batch_size=32", "run.rounds=100", "checkpoint.every=0"]


def probe_specs() -> list[dict]:
    """The reconstruction probe: FedSUM's reconstructed server step read two other ways at N = 20 (paired with
    MIFA's runs at the shared eta_0, which exist), and FedSUM and MIFA at N = 100 with the N = 20 recipe;
    P2 and P3 x the reported seeds (group probe/<pattern>)."""
    lr = shared_lr()  # arm by arm (all seeds of one arm before the next), so that a partial step reports arms
    out = [spec(f"probe/{pattern}", label, FEDSUM_BASE,
                [*FEDSUM_ALGORITHMS["FedSUM"], *ov, f"participation.pattern={pattern}", f"local.lr={lr}"], seed)
           for label, ov in PROBE_ARMS.items() for pattern in PROBE_PATTERNS for seed in SEEDS]
    out += [spec(f"probe/{pattern}", f"{label} N=100", PAPER_BASE,
                 [*FEDSUM_ALGORITHMS[label], f"participation.pattern={pattern}", *PROBE_N100], seed)
            for pattern in PROBE_PATTERNS for seed in SEEDS for label in ("FedSUM", "MIFA")]
    return out


ALL_STAGES: list[Callable[[], list[dict]]] = [
    # every step's runs in the order the results page needs them, each after the choices it reads: the
    # tuning grids, then the comparisons the claims rest on, the rest after
    grid_specs,
    tuned_specs,
    lambda: fedadamom_specs(True, (0.1,)),
    lambda: fadamgc_specs(True),
    case_specs,
    case2p_specs,
    fedsum_specs,
    lambda: fedadamom_specs(True, (0.5,)),
    ablation_specs,
    case2p_constant_specs,  # the claims as the seed states them, then the reconstruction probe
    family128_specs,
    probe_specs,
    paper_grid_tune_specs,  # the shared-eta_0 comparison again at the paper's own eta_0 grid
    paper_grid_specs,
    ablation_iid_specs,  # claims the earlier rounds did not run
    family_small_batch_specs,
    fafed_full_specs,
]
