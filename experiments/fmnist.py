"""The Fashion-MNIST comparisons of docs/results.md: the FedSUM family against its baselines and FedAdamom
against the adaptive server optimizers, with the FedSUM paper's MNIST CNN, ten reported seeds each.

    python experiments/fmnist.py all         # every step below in order (what docs/results.md rests on)
    python experiments/fmnist.py tune        # the learning-rate grids on the tuning seeds 100 and 101
    python experiments/fmnist.py tuned       # 9 algorithms, each at its own eta_0, x P1-P3 x seeds 0-9
    python experiments/fmnist.py fedadamom   # the adaptive servers at their chosen values x seeds 0-9
    python experiments/fmnist.py fadamgc     # FAdamGC against local Adam without correction x seeds 0-9
    python experiments/fmnist.py cases       # FedSUM and FedAvg under Cases 1-4 and biased sampling
    python experiments/fmnist.py case2p      # FedSUM under Case 2 at five participation probabilities p
    python experiments/fmnist.py fedsum      # 9 algorithms at FedAvg's eta_0 (the paper's protocol)
    python experiments/fmnist.py ablation    # FedAdamom's beta2
    python experiments/fmnist.py paper       # FedSUM, FedSUM-CR, MIFA, FedAvg at the paper's settings (N = 100)
    python experiments/fmnist.py case2p_constant  # Case 2 over p at Fig. 10's constant rates (eta_l = 0.01)
    python experiments/fmnist.py family128   # FedSUM-B, FedSUM, FedSUM-CR at H.5's batch 128, constant eta_l = 0.1
    python experiments/fmnist.py paper_grid  # the shared-eta0 comparison at FedAvg's choice on the paper's grid
    python experiments/fmnist.py ablation_iid  # FedAdamom's beta2 with an i.i.d. partition
    python experiments/fmnist.py family_small_batch  # the FedSUM family at H.5's rates with batch 16
    python experiments/fmnist.py fafed_full  # FAFED with every client in every round
    python experiments/fmnist.py probe       # the reconstruction probe: FedSUM's server step read other ways
    python experiments/fmnist.py diagnose    # why FedSUM trails: its y against the true gradient
    python experiments/fmnist.py flatness    # FedAdamom's flatness claim: sharpness of the trained models
    python experiments/fmnist.py flatness_same_loss  # the same, for models retrained to a common training loss
    python experiments/fmnist.py report      # tables, plots, claims from the summaries; fills docs/results.md

A step prints a line per run (done/total, elapsed, ETA); a long run (one that checkpoints: 'paper') also
prints fedrun's progress line every 25 rounds and resumes from its newest checkpoint. `--shard K/N` lets N
processes share a step. A step that needs a choice (an eta_0, a server lr) runs the grids it depends on
first. The grids, runs and choices are in experiments/fmnist_runs.py: a run is cached by its summary JSON
under docs/results/fmnist_10seeds/ (PAPER_OUT for 'paper'), so an interrupted step continues where it
stopped; the tables, plots and diagnosis are in experiments/fmnist_report.py; the flatness measures of the
FedAdamom comparison's final models (one JSON per run in flatness/ beside the summaries, resumed likewise)
and of its models at a common training loss (flatness_same_loss/) in experiments/fmnist_flatness.py.
"""

from __future__ import annotations

import argparse
import time

from fmnist_runs import (
    ALL_STAGES,
    ALPHAS,
    CHOOSE_AT,
    ablation_iid_specs,
    ablation_specs,
    case2p_constant_specs,
    case2p_specs,
    case_specs,
    fadamgc_specs,
    fafed_full_specs,
    family128_specs,
    family_small_batch_specs,
    fedadamom_specs,
    fedsum_specs,
    grid_specs,
    load,
    paper_grid_specs,
    paper_grid_tune_specs,
    paper_specs,
    probe_specs,
    run_all,
    tune_specs,
    tuned_specs,
)

# step -> its stages in order (the grids it reads its choices from first); a stage is a function so that
# it reads the choices only after the grids before it are done
STEPS = {
    "tune": (grid_specs,),
    "tuned": (tune_specs, tuned_specs),
    "fedsum": (tune_specs, fedsum_specs),
    "cases": (tune_specs, case_specs),
    "case2p": (tune_specs, case2p_specs),
    "fedadamom": (fedadamom_specs, lambda: fedadamom_specs(True, ALPHAS)),
    "fadamgc": (fadamgc_specs, lambda: fadamgc_specs(True)),
    "ablation": (ablation_specs,),
    "paper": (paper_specs,),
    "case2p_constant": (case2p_constant_specs,),
    "family128": (family128_specs,),
    "probe": (tune_specs, probe_specs),
    "paper_grid": (paper_grid_tune_specs, paper_grid_specs),
    "ablation_iid": (ablation_iid_specs,),
    "family_small_batch": (family_small_batch_specs,),
    "fafed_full": (fedadamom_specs, fafed_full_specs),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["all", *STEPS, "flatness", "flatness_same_loss", "diagnose", "report"])
    parser.add_argument("--dry-run", action="store_true", help="list the runs that are not finished yet")
    parser.add_argument("--shard", default="0/1", metavar="K/N",
                        help="run every N-th unfinished run starting at the K-th (N processes share a step)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    if args.step in ("report", "diagnose"):
        import fmnist_report

        getattr(fmnist_report, args.step)()
        return
    k, n = (int(v) for v in args.shard.split("/"))
    for stage in ALL_STAGES if args.step == "all" else STEPS.get(args.step, ()):
        while True:
            try:
                specs = stage()
                break
            except SystemExit as exc:  # a choice whose grid is unfinished
                if args.dry_run or n == 1:
                    raise
                print(f"waiting for the other shards: {exc}", flush=True)  # they are running that grid
                time.sleep(60)
        if args.dry_run:
            todo = [s for s in specs if load(s) is None]
            print(f"{len(todo)} of {len(specs)} runs to do")
            for s in todo:
                print(" ", s["summary"])
            continue
        run_all(specs[k::n])  # the same split in every shard, whatever each has finished
    if args.step in ("all", "flatness"):  # the trained runs of the FedAdamom comparison at Dirichlet 0.1
        from fmnist_flatness import flatness_all

        flatness_all(fedadamom_specs(True, (CHOOSE_AT,))[k::n], dry_run=args.dry_run)
    if args.step in ("all", "flatness_same_loss"):  # seeds, not runs, are shared between shards
        from fmnist_flatness import same_loss_all

        trained = fedadamom_specs(True, (CHOOSE_AT,))
        same_loss_all([s for s in trained if s["seed"] % n == k], dry_run=args.dry_run)


if __name__ == "__main__":
    main()
