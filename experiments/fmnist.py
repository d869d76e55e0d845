"""The Fashion-MNIST comparisons of docs/results.md: the FedSUM family against its baselines and FedAdamom
against the adaptive server optimizers, with the FedSUM paper's MNIST CNN.

    python experiments/fmnist.py lr          # FedAvg's eta_0 over a grid (P1, seed 0): the shared eta_0
    python experiments/fmnist.py fedsum      # 9 algorithms x P1, P2, P3 x seeds 0-2 at the shared eta_0
    python experiments/fmnist.py tune        # every FedSUM-comparison algorithm at the other eta_0 (P1, seed 0)
    python experiments/fmnist.py tuned       # every algorithm at its own best eta_0 x P1-P3 x seeds 0-2
    python experiments/fmnist.py fedadamom   # server-lr grids (seed 0), then 3 seeds at the choices
    python experiments/fmnist.py ablation    # FedAdamom's beta2 (seed 0)
    python experiments/fmnist.py diagnose    # why FedSUM trails: its y against the true gradient
    python experiments/fmnist.py cases       # FedSUM and FedAvg under Cases 1-4 and biased sampling x 3 seeds
    python experiments/fmnist.py case2p      # FedSUM under Case 2 at five participation probabilities p
    python experiments/fmnist.py fadamgc     # FAdamGC against local Adam without correction (lr grid, 3 seeds)
    python experiments/fmnist.py paper       # FedSUM, FedSUM-CR, MIFA, FedAvg at the paper's settings (N = 100)
    python experiments/fmnist.py report      # tables and plots from the committed summaries only

The grids, runs and choices are in experiments/fmnist_runs.py (runs are cached by their summary JSON
under docs/results/fmnist/); the tables, plots and diagnosis in experiments/fmnist_report.py.
"""

from __future__ import annotations

import argparse

from fmnist_report import diagnose, report
from fmnist_runs import (
    ALPHAS,
    FEDSUM_BASE,
    LR_GRID,
    PATTERNS,
    SEEDS,
    ablation_specs,
    best,
    case2p_specs,
    case_specs,
    fadamgc_specs,
    fedadamom_specs,
    fedsum_specs,
    load,
    paper_specs,
    lr_specs,
    run_all,
    tune_specs,
    tuned_specs,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["lr", "fedsum", "tune", "tuned", "fedadamom", "ablation", "diagnose",
                                         "cases", "case2p", "fadamgc", "paper", "report"])
    parser.add_argument("--dry-run", action="store_true", help="list the runs that are not finished yet")
    parser.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=PATTERNS,
                        help="'tuned': the patterns to run")
    parser.add_argument("--alphas", type=float, nargs="+", default=list(ALPHAS), help="'fedadamom': Dirichlet alphas")
    parser.add_argument("--choose-from", type=float, default=None,
                        help="'fedadamom': skip the grids and use the values chosen at this alpha")
    parser.add_argument("--shard", default="0/1", metavar="K/N",
                        help="run every N-th unfinished run starting at the K-th (N processes share a step)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    if args.step == "report":
        report()
        return
    if args.step == "diagnose":
        diagnose()
        return
    if args.step == "lr":
        specs = lr_specs()
    elif args.step == "fedsum":
        specs = fedsum_specs()
    elif args.step == "tune":
        specs = tune_specs()
        if not args.dry_run:
            run_all(specs)
            specs = tune_specs()  # extended downwards where the best was the lowest value
    elif args.step == "tuned":
        specs = tuned_specs(tuple(args.patterns))
    elif args.step == "fedadamom":
        if args.choose_from is None:
            specs = fedadamom_specs(alphas=args.alphas)
            if not args.dry_run:
                run_all(specs)
        specs = fedadamom_specs(seeds=SEEDS, choose=True, alphas=args.alphas, choose_from=args.choose_from)
    elif args.step == "cases":
        specs = case_specs()
    elif args.step == "paper":
        specs = paper_specs()
    elif args.step == "case2p":
        specs = case2p_specs()
    elif args.step == "fadamgc":
        specs = fadamgc_specs()
        if not args.dry_run:
            run_all(specs)
        specs = fadamgc_specs(choose=True)
    else:
        specs = ablation_specs()
    if args.dry_run:
        todo = [s for s in specs if load(s) is None]
        print(f"{len(todo)} of {len(specs)} runs to do")
        for s in todo:
            print(" ", s["summary"])
        return
    k, n = (int(v) for v in args.shard.split("/"))
    run_all([sp for sp in specs if load(sp) is None][k::n])
    if args.step == "lr":
        rows = {lr: load(s) for lr, s in zip(LR_GRID, specs, strict=True)}  # noqa: B020
        print(f"FedAvg's best eta_0 (lowest f(x), P1, seed 0): {best(rows)}; set local.lr in {FEDSUM_BASE}")


if __name__ == "__main__":
    main()
