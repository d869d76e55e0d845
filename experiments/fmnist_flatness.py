"""The flatness step of the Fashion-MNIST FedAdamom comparison (``python experiments/fmnist.py flatness``).

FedAdamom's claim is that momentum plus adaptivity find flatter minima that generalize better. For the
final global model of every run of the comparison at Dirichlet 0.1 (FedAdamom, FADAS, FedAdam, FedAvgM and
FedAvg, each at its chosen value, seeds 0-9), ``fedrun.flatness.measure_flatness`` gives the top Hessian
eigenvalue of the training loss and the loss increase under random perturbations of relative radius rho,
beside train and test accuracy (docs/evaluation.md, "Flatness"). One JSON per run goes to
docs/results/fmnist_10seeds/flatness/<the run's summary name>; a run whose JSON exists is not measured
again, and runs not trained yet are listed, not failed on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from fmnist_runs import OUT, REPO, load, run_dir

LABELS = ("FedAdamom", "FADAS", "FedAdam", "FedAvgM", "FedAvg")
FLATNESS_OUT = OUT / "flatness"
SETTINGS = {"examples": 2000, "rho": (0.01, 0.05, 0.1), "directions": 10, "max_hvps": 200, "seed": 0}


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (the JSONs are committed)."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def flatness_file(s: dict, out: Path = FLATNESS_OUT) -> Path:
    return out / Path(s["summary"]).name


def measure(s: dict, out: Path = FLATNESS_OUT) -> dict:
    """The flatness of run ``s``'s final model, written to its JSON (atomically) and returned."""
    from fedrun.flatness import measure_flatness

    start = time.time()
    f = measure_flatness(run_dir(s), **SETTINGS)
    label, _, setting = s["label"].partition(" ")
    record = {"label": label, "setting": setting, "seed": s["seed"], "checkpoint": _shown(Path(f.checkpoint)),
              "round": f.round, "top_eigenvalue": f.top_eigenvalue, "hvps": f.hvps, "residual": f.residual,
              "converged": f.converged, "rho": f.rho,
              "loss_increase": f.loss_increase, "loss_increase_std": f.loss_increase_std,
              "train_loss": f.train_loss, "train_accuracy": f.train_accuracy, "test_accuracy": f.test_accuracy,
              "examples": f.examples, "directions": f.directions, "flatness_seed": f.seed,
              "wall_s": round(time.time() - start, 2)}
    path = flatness_file(s, out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record) + "\n")
    tmp.replace(path)
    return record


def flatness_all(specs: list[dict], out: Path = FLATNESS_OUT, dry_run: bool = False) -> None:
    """Measure every trained run of ``specs`` (labels in LABELS) without a flatness JSON yet, with a
    progress line (``dry_run``: list them); list the runs not trained yet (no summary) and those that
    diverged."""
    specs = [s for s in specs if s["label"].split(" ")[0] in LABELS]
    todo = [s for s in specs if not flatness_file(s, out).is_file()]
    untrained = [s for s in todo if load(s) is None]
    diverged = [s for s in todo if s not in untrained and not load(s)["finite"]]
    ready = [s for s in todo if s not in untrained and s not in diverged]
    print(f"flatness: {len(specs) - len(todo)} of {len(specs)} runs measured already, {len(ready)} to do, "
          f"{len(untrained)} not trained yet, {len(diverged)} diverged", flush=True)
    start = time.time()
    for i, s in enumerate([] if dry_run else ready, 1):
        r = measure(s, out)
        elapsed = time.time() - start
        print(f"[{i}/{len(ready)}] {s['label']} seed {s['seed']}: lambda_max {r['top_eigenvalue']:.4g} "
              f"({r['hvps']} Hv, residual {r['residual']:.1g}), test acc {r['test_accuracy']:.4f}, {r['wall_s']:.1f}s; "
              f"elapsed {elapsed:.0f}s, ETA {elapsed / i * (len(ready) - i):.0f}s", flush=True)
    for s in ready if dry_run else []:
        print(f"  to measure: {s['label']} seed {s['seed']}")
    for s in untrained:
        print(f"  not trained yet: {s['label']} seed {s['seed']} (no {s['summary']})")
    for s in diverged:
        print(f"  diverged, no minimum to measure: {s['label']} seed {s['seed']}")
    for label in LABELS:
        if not any(s["label"].split(" ")[0] == label for s in specs):
            print(f"  no runs of {label} yet: its value is not chosen (its grid on the tuning seeds is unfinished)")
