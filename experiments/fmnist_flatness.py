"""The flatness steps of the Fashion-MNIST FedAdamom comparison (``python experiments/fmnist.py flatness``
and ``flatness_same_loss``).

FedAdamom's claim is that momentum plus adaptivity find flatter minima that generalize better. For the
final global model of every run of the comparison at Dirichlet 0.1 (FedAdamom, FADAS, FedAdam, FedAvgM and
FedAvg, each at its chosen value, seeds 0-9), ``fedrun.flatness.measure_flatness`` gives the top Hessian
eigenvalue of the training loss and the loss increase under random perturbations of relative radius rho,
beside train and test accuracy (docs/evaluation.md, "Flatness"). One JSON per run goes to
docs/results/fmnist_10seeds/flatness/<the run's summary name>; a run whose JSON exists is not measured
again, and runs not trained yet are listed, not failed on.

Models at the same round need not be at the same point of training: a method that trains faster sits
lower in the loss, where the landscape differs. ``flatness_same_loss`` therefore compares the claim's three
methods (FedAdamom, FedAdam, FedAvgM) at a common training loss as well. For each seed, each run is
retrained with a checkpoint after every round, and ``fedrun.flatness.sample_losses`` gives the loss L_t on
the flatness sample at every round t. The seed's target is the lowest loss all three reach,

    L*(seed) = max over methods of min_t L_t,

and each method is measured at its first round with L_t <= L* (the method that sets L* at its lowest
point). One JSON per method and seed goes to a ``flatness_same_loss`` folder beside ``flatness``, with the
target, the round and the whole loss curve; the retrained runs are deleted once their seed is measured.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

from fmnist_runs import OUT, REPO, load, run_dir, run_one

LABELS = ("FedAdamom", "FADAS", "FedAdam", "FedAvgM", "FedAvg")
FLATNESS_OUT = OUT / "flatness"
SETTINGS = {"examples": 2000, "rho": (0.01, 0.05, 0.1), "directions": 10, "max_hvps": 200, "seed": 0}
SAME_LOSS_LABELS = ("FedAdamom", "FedAdam", "FedAvgM")  # the methods the claim names
SAME_LOSS_OUT = OUT / "flatness_same_loss"
RETRAINED = REPO / "runs" / OUT.name / "flatness_same_loss"  # the retrained runs, while their seed is measured
EVERY_CHECKPOINT = 100_000  # checkpoint.keep: more than any run's rounds, so that every round's model stays


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (the JSONs are committed)."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def flatness_file(s: dict, out: Path = FLATNESS_OUT) -> Path:
    return out / Path(s["summary"]).name


def measure(s: dict, out: Path = FLATNESS_OUT, checkpoint: Path | None = None, extra: dict | None = None,
            trained: dict | None = None) -> dict:
    """The flatness of run ``s``'s final model (or of ``checkpoint`` of the run ``trained``, with ``extra``
    fields), written to its JSON (atomically) and returned. The JSON names the training run that wrote the
    checkpoint (its base config and overrides), so that ``fedrun reproduce`` can rerun it."""
    from fedrun.flatness import measure_flatness

    start = time.time()
    trained = trained or s
    f = measure_flatness(checkpoint or run_dir(s), **SETTINGS)
    label, _, setting = s["label"].partition(" ")
    overrides = [f"run.dir={_shown(run_dir(trained))}" if o.startswith("run.dir=") else o
                 for o in trained["overrides"]]
    record = {"label": label, "setting": setting, "seed": s["seed"], "checkpoint": _shown(Path(f.checkpoint)),
              "base": trained["base"], "overrides": overrides,
              "round": f.round, "top_eigenvalue": f.top_eigenvalue, "hvps": f.hvps, "residual": f.residual,
              "converged": f.converged, "rho": f.rho,
              "loss_increase": f.loss_increase, "loss_increase_std": f.loss_increase_std,
              "train_loss": f.train_loss, "train_accuracy": f.train_accuracy, "test_accuracy": f.test_accuracy,
              "examples": f.examples, "directions": f.directions, "flatness_seed": f.seed,
              **(extra or {}), "wall_s": round(time.time() - start, 2)}
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


def trajectory_spec(s: dict, runs: Path = RETRAINED) -> dict:
    """``s`` retrained with a checkpoint after every round, all kept, in a run directory of its own under
    ``runs`` (its summary inside it: the committed summary stays the run's record)."""
    folder = runs / Path(s["summary"]).stem
    overrides = [o for o in s["overrides"] if not o.startswith("run.dir=")]
    return {**s, "overrides": [*overrides, f"run.dir={folder}", "checkpoint.every=1",
                               f"checkpoint.keep={EVERY_CHECKPOINT}"], "summary": f"{folder}/summary.json"}


def first_at_or_below(losses: list[float], target: float) -> int:
    """The index of the first loss <= ``target`` (a NaN is never at or below it)."""
    return next(i for i, v in enumerate(losses) if v <= target)


def same_loss_seed(specs: list[dict], out: Path = SAME_LOSS_OUT, runs: Path = RETRAINED) -> str:
    """Measure the runs ``specs`` (one per method, one seed) at their common training loss L* (the module's
    docstring); returns what happened, for the progress line."""
    from fedrun.flatness import sample_losses

    if all(flatness_file(s, out).is_file() for s in specs):
        return "measured already"
    retrained = [trajectory_spec(s, runs) for s in specs]
    for r in retrained:
        status, summary = run_one(r), load(r)
        if summary is None:  # the run failed (its error is in the summary's .error.txt)
            return f"{r['label']} did not finish in the retraining ({status}): no common loss"
        if not summary["finite"]:
            return f"{r['label']} diverged in the retraining: no common loss"
    curves = []
    for r in retrained:
        checkpoints = sorted(run_dir(r).glob("ckpt_*.h5"))
        curves.append((checkpoints, sample_losses(checkpoints, SETTINGS["examples"], SETTINGS["seed"])))
    target = max(min((v for v in losses if math.isfinite(v)), default=math.inf) for _, losses in curves)
    if not math.isfinite(target):
        return "a loss curve without a finite value: no common loss"
    for s, r, (checkpoints, losses) in zip(specs, retrained, curves, strict=True):
        at = first_at_or_below(losses, target)
        measure(s, out, checkpoints[at], {"target_loss": target, "rounds_trained": len(losses),
                                          "loss_curve": losses}, trained=r)
    for r in retrained:
        shutil.rmtree(run_dir(r))
    return f"L* = {target:.4f}"


def same_loss_all(specs: list[dict], out: Path = SAME_LOSS_OUT, runs: Path = RETRAINED,
                  dry_run: bool = False) -> None:
    """``same_loss_seed`` for every seed of ``specs`` whose three methods (SAME_LOSS_LABELS) have run, with a
    progress line per seed (``dry_run``: list the seeds to measure)."""
    by_seed: dict[int, dict[str, dict]] = {}
    for s in specs:
        label = s["label"].split(" ")[0]
        if label in SAME_LOSS_LABELS:
            by_seed.setdefault(s["seed"], {})[label] = s
    ready = {seed: [methods[m] for m in SAME_LOSS_LABELS] for seed, methods in sorted(by_seed.items())
             if len(methods) == len(SAME_LOSS_LABELS)}
    todo = [seed for seed, seed_specs in ready.items()
            if not all(flatness_file(s, out).is_file() for s in seed_specs)]
    print(f"flatness at the same loss: {len(ready) - len(todo)} of {len(ready)} seeds measured already, "
          f"{len(todo)} to do", flush=True)
    start = time.time()
    for i, seed in enumerate([] if dry_run else todo, 1):
        status = same_loss_seed(ready[seed], out, runs)
        elapsed = time.time() - start
        print(f"[{i}/{len(todo)}] seed {seed}: {status}; elapsed {elapsed:.0f}s, "
              f"ETA {elapsed / i * (len(todo) - i):.0f}s", flush=True)
    for seed in todo if dry_run else []:
        print(f"  to measure: seed {seed}")
