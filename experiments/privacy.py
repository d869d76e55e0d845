"""DP-FedAvg and DP-FedAdam on Fashion-MNIST over 1,000 clients: test accuracy against epsilon, and fedrun's
epsilon against pfl-research's accountant (docs/results_privacy.md).

    python experiments/privacy.py run [--seeds 0 1 2] [--summary summary.json]   # the grid, one process, one core
    python experiments/privacy.py report                  # the plot and the table from the summary
    python experiments/privacy.py pfl-check --pfl PYTHON  # fedrun's epsilon against pfl's accountants

Setup (fixed for every run): Fashion-MNIST (60,000 training images) split IID over N = 1,000 clients,
multinomial logistic regression (d = 7,850), participation ``p2`` (every client independently with
q = S/N = 0.1 each round: Poisson sampling, the setting of DP-FedAvg's amplification), 20 rounds of
5 local SGD steps (batch 10, lr 0.05; the cohort trained as one vmap call), central DP with clip
C = 0.5 and sigma calibrated by fedrun (``privacy.target_epsilon``) so that the 20 rounds spend epsilon
in {1, 2, 4, 8} at delta = 1e-5 (RDP accountant); inf is the same run without privacy. The server steps
are FedAvg (eta_g = 1) and FedAdam (eta_g = 0.01, beta1 0.9, beta2 0.99, tau 1e-3), both normalizing
the noised sum by the expected cohort m = 100 (docs/privacy.md). Three seeds each (data split,
sampling, noise and initialization all follow the seed).

``pfl-check`` runs, in the given Python (a throwaway environment with ``pip install pfl``), pfl-research's
``PLDPrivacyAccountant`` and ``RDPPrivacyAccountant`` for the same settings (population 1,000, cohort 100,
20 compositions, delta 1e-5, each calibrated sigma) and compares their epsilon with fedrun's final
epsilon of the run (RDP) and with fedrun's PLD accountant on the same events.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "results" / "privacy"
PLOT = OUT / "accuracy_vs_epsilon.png"
EPSILONS = [1.0, 2.0, 4.0, 8.0, math.inf]
ALGORITHMS = {"DP-FedAvg": ["algorithm.name=fedavg", "algorithm.global_lr=1.0"],
              "DP-FedAdam": ["algorithm.name=fedadam", "algorithm.global_lr=0.01"]}
N, COHORT, ROUNDS, DELTA = 1000, 100, 20, 1e-5
BASE = ["data.name=fashion_mnist", f"data.num_clients={N}", "data.partition=iid", "model.name=logistic",
        "local.steps=5", "local.batch_size=10", "local.lr=0.05", "local.strategy=vmap", "eval.every=0",
        f"run.rounds={ROUNDS}", "participation.pattern=p2", f"participation.clients_per_round={COHORT}"]


def overrides(algorithm: str, epsilon: float, seed: int) -> list[str]:
    """A run's settings: sigma is the one fedrun calibrates for ``epsilon`` (:func:`sigma_of`, computed once per
    epsilon rather than at every run's start-up: the same number), with ``epsilon`` as the run's budget."""
    dp = [] if math.isinf(epsilon) else ["privacy.mode=central", f"privacy.noise_multiplier={sigma_of(epsilon)!r}",
                                          f"privacy.target_epsilon={epsilon}", "privacy.clip=0.5",
                                          f"privacy.delta={DELTA}"]
    return [*BASE, *ALGORITHMS[algorithm], f"run.seed={seed}", *dp]


def run_grid(seeds: list[int], summary: Path) -> None:
    """Every (algorithm, epsilon, seed) in this process, one after another, into ``summary`` after each run (a
    second process takes other seeds into another file; the report reads every summary*.json)."""
    import fedrun  # here: report and pfl-check need no torch

    OUT.mkdir(parents=True, exist_ok=True)
    rows = json.loads(summary.read_text())["runs"] if summary.exists() else []
    done = {(r["algorithm"], r["epsilon_target"], r["seed"]) for r in rows}
    for seed in seeds:
        for algorithm in ALGORITHMS:
            for eps in EPSILONS:
                key = (algorithm, "inf" if math.isinf(eps) else eps, seed)
                if key in done:
                    continue
                started = time.perf_counter()
                result = fedrun.run({}, overrides(algorithm, eps, seed), write_files=False)
                last = result.metrics[-1]
                rows.append({"algorithm": algorithm, "epsilon_target": key[1], "seed": seed,
                             "test_accuracy": last["test_accuracy"], "epsilon": last.get("epsilon"),
                             "noise_multiplier": None if math.isinf(eps) else sigma_of(eps),
                             "seconds": round(time.perf_counter() - started, 1)})
                print(json.dumps(rows[-1]), flush=True)
                summary.write_text(json.dumps({"setup": " ".join(BASE), "runs": rows}, indent=1) + "\n")


@functools.cache
def sigma_of(epsilon: float) -> float:
    """The sigma fedrun calibrates for ``epsilon`` in this setup (what the run's start-up line prints)."""
    from fedrun.privacy.accountant import calibrate
    from fedrun.privacy.config import PrivacyConfig

    cfg = PrivacyConfig(mode="central", target_epsilon=epsilon, delta=DELTA)
    return calibrate(cfg, "poisson", N, COHORT, [COHORT / N] * ROUNDS, 0)


def report() -> None:
    """The plot (mean and min-max over seeds) and the markdown table, from the summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = list({(r["algorithm"], r["epsilon_target"], r["seed"]): r for path in sorted(OUT.glob("summary*.json"))
                 for r in json.loads(path.read_text())["runs"]}.values())
    labels = [str(int(e)) if not math.isinf(e) else "inf" for e in EPSILONS]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    print("| algorithm | " + " | ".join(f"eps {x}" for x in labels) + " |")
    print("|---|" + "---|" * len(labels))
    for algorithm in ALGORITHMS:
        means, lo, hi, cells = [], [], [], []
        for eps in EPSILONS:
            key = "inf" if math.isinf(eps) else eps
            acc = [r["test_accuracy"] for r in rows if r["algorithm"] == algorithm and r["epsilon_target"] == key]
            if not acc:
                cells.append("not run")
                means.append(np.nan), lo.append(np.nan), hi.append(np.nan)
                continue
            means.append(np.mean(acc)), lo.append(min(acc)), hi.append(max(acc))
            cells.append(f"{100 * np.mean(acc):.2f} ({100 * min(acc):.2f}-{100 * max(acc):.2f}, n={len(acc)})")
        print(f"| {algorithm} | " + " | ".join(cells) + " |")
        x = np.arange(len(EPSILONS))
        ax.errorbar(x, 100 * np.array(means), yerr=[100 * (np.array(means) - lo), 100 * (np.array(hi) - means)],
                    marker="o", capsize=3, label=algorithm)
    ax.set_xticks(np.arange(len(EPSILONS)), labels)
    ax.set_xlabel("epsilon at delta = 1e-5 (20 rounds, q = 0.1)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Fashion-MNIST, 1,000 clients, logistic regression")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(PLOT, dpi=120)
    print(f"\nplot: {PLOT.relative_to(REPO)}")


PFL_SCRIPT = """
import json, sys
from pfl.privacy import PLDPrivacyAccountant, RDPPrivacyAccountant
out = []
for sigma, eps in json.loads(sys.argv[1]):
    row = {}
    for name, cls in (("pld", PLDPrivacyAccountant), ("rdp", RDPPrivacyAccountant)):
        common = dict(mechanism="gaussian", **json.loads(sys.argv[2]))
        row[name] = cls(noise_parameter=sigma, **common).epsilon
        row[name + "_sigma"] = cls(epsilon=eps, **common).noise_parameter
    out.append(row)
print(json.dumps(out))
"""


def pfl_check(python: str) -> None:
    """fedrun's epsilon (its RDP and PLD accountants on the run's 20 Poisson rounds at its calibrated sigma)
    against pfl's accountants at the same sigma, and the sigma each calibrates for the same epsilon."""
    from fedrun.privacy.accountant import Accountant

    targets = [e for e in EPSILONS if not math.isinf(e)]
    sigmas = [sigma_of(e) for e in targets]
    ours = []
    for sigma in sigmas:
        row = {"sigma": sigma}
        for kind in ("rdp", "pld"):
            acc = Accountant(kind, DELTA, "poisson", N, COHORT, sigma)
            for _ in range(ROUNDS):
                acc.record(COHORT / N, [])
            row[kind] = acc.epsilon()
        ours.append(row)
    settings = {"num_compositions": ROUNDS, "sampling_probability": COHORT / N, "delta": DELTA}
    proc = subprocess.run([python, "-c", PFL_SCRIPT, json.dumps(list(zip(sigmas, targets, strict=True))),
                           json.dumps(settings)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"pfl-check: {python} could not run pfl's accountants: {proc.stderr.strip()[-300:]}")
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    print("| target epsilon | fedrun sigma | pfl rdp sigma | fedrun rdp eps | pfl rdp eps | fedrun pld eps | "
          "pfl pld eps | pfl pld sigma |")
    print("|---|---|---|---|---|---|---|---|")
    for eps, row, t in zip(targets, ours, theirs, strict=True):
        print(f"| {eps:g} | {row['sigma']:.4f} | {t['rdp_sigma']:.4f} | {row['rdp']:.4f} | {t['rdp']:.4f} | "
              f"{row['pld']:.4f} | {t['pld']:.4f} | {t['pld_sigma']:.4f} |")
    (OUT / "pfl_check.json").write_text(json.dumps({"fedrun": ours, "pfl": theirs}, indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("--summary", default="summary.json", help="file name under docs/results/privacy/")
    sub.add_parser("report")
    c = sub.add_parser("pfl-check")
    c.add_argument("--pfl", default=sys.executable, help="a Python with pfl installed")
    args = p.parse_args()
    if args.command == "run":
        run_grid(args.seeds, OUT / args.summary)
    elif args.command == "report":
        report()
    else:
        pfl_check(args.pfl)


if __name__ == "__main__":
    main()
