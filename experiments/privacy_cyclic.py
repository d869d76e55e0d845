"""Accuracy against epsilon under cyclic participation: the Gaussian mechanism composed over each client's
rounds against DP-FTRL with a banded matrix factorization (``privacy.mechanism=bandmf``), on Fashion-MNIST
over 1,000 clients (docs/privacy.md; the results belong in docs/results_privacy.md).

    python experiments/privacy_cyclic.py run [--seeds 0 1 2] [--summary summary.json]   # the grid, one process
    python experiments/privacy_cyclic.py report                                         # table and plot
    python experiments/privacy_cyclic.py run --clients 40 --cohort 4 --rounds 20 --epsilons 8 --seeds 0 \\
        --out /tmp/cyclic                                                               # a tiny check

Setup (fixed for every run unless the options say otherwise): Fashion-MNIST (60,000 training images, the
10,000 test images as the test set) split IID over N = 1,000 clients, multinomial logistic regression
(d = 7,850), participation ``cyclic`` with S = 100 clients a round (a client returns every N/S = 10 rounds:
the schedule's separation), 50 rounds (every client takes part k = 5 times), 5 local SGD steps (batch 10,
lr 0.05, the cohort trained as one vmap call), FedAvg with eta_g = 1 (the model is the prefix sum of the
noised rounds: the workload the factorization is made for), central DP with clip C = 0.5. Per target
epsilon in {2, 4, 8, 16} at delta = 1e-5 (RDP accountant), fedrun calibrates sigma at start-up
(``privacy.target_epsilon``) for each mechanism: ``gaussian`` (the worst client's k Gaussians) and
``bandmf`` with b = the separation (``privacy.bands`` null; one Gaussian at sigma / (sqrt(k) ||c||_2)); inf
is the same run without privacy. Three seeds (split, noise and initialization follow the seed).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "results" / "privacy_cyclic"
MECHANISMS = ("gaussian", "bandmf")
DELTA = 1e-5


def settings(args: argparse.Namespace, mechanism: str, epsilon: float, seed: int) -> list[str]:
    """One run's overrides: the fixed setup, the seed, and the mechanism calibrated for ``epsilon`` (none: inf)."""
    base = ["data.name=fashion_mnist", f"data.num_clients={args.clients}", "data.partition=iid",
            "model.name=logistic", "local.steps=5", "local.batch_size=10", "local.lr=0.05", "local.strategy=vmap",
            f"eval.every={args.rounds}", f"run.rounds={args.rounds}", "participation.pattern=cyclic",
            f"participation.clients_per_round={args.cohort}", "algorithm.name=fedavg", "algorithm.global_lr=1.0",
            f"run.seed={seed}"]
    if math.isinf(epsilon):
        return base
    return [*base, "privacy.mode=central", f"privacy.mechanism={mechanism}", f"privacy.target_epsilon={epsilon}",
            "privacy.clip=0.5", f"privacy.delta={DELTA}"]


def grid(args: argparse.Namespace) -> list[tuple[str, float, int]]:
    """(mechanism, target epsilon, seed) of every run; the non-private run once per seed, as mechanism "none"."""
    cells = [(m, e, s) for s in args.seeds for e in args.epsilons for m in MECHANISMS if not math.isinf(e)]
    return cells + [("none", math.inf, s) for s in args.seeds]


def run_grid(args: argparse.Namespace) -> None:
    """Every run of :func:`grid` in this process, appended to the summary after each (a run already in it is
    skipped: a second process can take other seeds into another summary file, the report reads them all)."""
    import fedrun  # here: report needs no torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = out / args.summary
    rows = json.loads(summary.read_text())["runs"] if summary.exists() else []
    done = {(r["mechanism"], r["epsilon_target"], r["seed"]) for r in rows}
    for mechanism, epsilon, seed in grid(args):
        target = "inf" if math.isinf(epsilon) else epsilon
        if (mechanism, target, seed) in done:
            continue
        started = time.perf_counter()
        result = fedrun.run({}, settings(args, mechanism, epsilon, seed), write_files=False)
        last = result.metrics[-1]
        rows.append({"mechanism": mechanism, "epsilon_target": target, "seed": seed,
                     "test_accuracy": last["test_accuracy"], "epsilon": last.get("epsilon"),
                     "rounds_run": len(result.metrics), "seconds": round(time.perf_counter() - started, 1)})
        print(json.dumps(rows[-1]), flush=True)
        summary.write_text(json.dumps({"setup": {k: getattr(args, k) for k in ("clients", "cohort", "rounds")},
                                            "runs": rows}, indent=1) + "\n")


def report(args: argparse.Namespace) -> None:
    """The markdown table (mean and min-max test accuracy over seeds, the epsilon reached) and the plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(args.out)
    runs = {(r["mechanism"], r["epsilon_target"], r["seed"]): r for path in sorted(out.glob("summary*.json"))
            for r in json.loads(path.read_text())["runs"]}
    targets = sorted({t for (_, t, _) in runs if t != "inf"})
    plain = [r["test_accuracy"] for (m, _, _), r in runs.items() if m == "none"]
    print("| mechanism | " + " | ".join(f"eps {t:g}" for t in targets) + " | eps inf |")
    print("|---|" + "---|" * (len(targets) + 1))
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for mechanism in MECHANISMS:
        cells, xs, means = [], [], []
        for t in targets:
            acc = [r["test_accuracy"] for (m, e, _), r in runs.items() if m == mechanism and e == t]
            if not acc:
                cells.append("not run")
                continue
            xs.append(t), means.append(100 * statistics.mean(acc))
            cells.append(f"{means[-1]:.2f} ({100 * min(acc):.2f}-{100 * max(acc):.2f}, n={len(acc)})")
        none = f"{100 * statistics.mean(plain):.2f} (n={len(plain)})" if plain else "not run"
        print(f"| {mechanism} | " + " | ".join(cells) + f" | {none} |")
        ax.plot(xs, means, marker="o", label=mechanism)
    if plain:
        ax.axhline(100 * statistics.mean(plain), color="grey", linestyle="--", label="no privacy")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"epsilon at delta = {DELTA:g} (cyclic participation)")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "accuracy_vs_epsilon.png", dpi=120)
    print(f"\nplot: {out / 'accuracy_vs_epsilon.png'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=("run", "report"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--epsilons", type=float, nargs="+", default=[2.0, 4.0, 8.0, 16.0, math.inf])
    p.add_argument("--clients", type=int, default=1000)
    p.add_argument("--cohort", type=int, default=100)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--out", default=str(OUT), help="the folder of the summaries and the plot")
    p.add_argument("--summary", default="summary.json", help="this process's summary file name under --out")
    args = p.parse_args()
    if args.command == "run":
        run_grid(args)
    else:
        report(args)


if __name__ == "__main__":
    main()
