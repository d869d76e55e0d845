"""FedAvg against the robust aggregators under corrupted clients, on the embedded MNIST (docs/results_robust.md).

    python experiments/robust.py [--out docs/results/robust] [--runs runs/robust]

The quickstart setting (the FedSUM MNIST CNN, mnist5k: 4000 train / 1000 test digits, 50 clients, 10 per
round drawn uniformly, K = 10 steps of batch 32, lr 0.05) with Dirichlet(1.0) label skew, 30 rounds,
for fedavg, fedmedian, fedtrimmedavg (beta 0.2) and Multi-Krum (f = 3, m = 4), each under three settings:
no corruption, 20% of the clients (10 of 50, fixed by the seed) uploading -4 x their delta
(``sign_flip``), and the same clients uploading N(0, I) noise (``gaussian``, scale 1). Two seeds each,
one process, one thread: about 10 minutes of one core. Finished runs (result.json, or diverged.json for
a run stopped by NaN/Inf, which counts as accuracy 0.1, chance) are not rerun. Writes ``table.md``
(final test accuracy, mean and both seeds) and one PNG of test accuracy per round per setting into
``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ALGORITHMS = {
    "FedAvg": ["algorithm.name=fedavg"],
    "FedMedian": ["algorithm.name=fedmedian"],
    "FedTrimmedAvg (beta 0.2)": ["algorithm.name=fedtrimmedavg", "algorithm.beta=0.2"],
    "Multi-Krum (f 3, m 4)": ["algorithm.name=krum", "algorithm.num_malicious=3", "algorithm.num_keep=4"],
}
ATTACKS = {
    "none": [],
    "sign_flip x4": ["corruption.kind=sign_flip", "corruption.fraction=0.2", "corruption.scale=4"],
    "gaussian 1.0": ["corruption.kind=gaussian", "corruption.fraction=0.2", "corruption.scale=1.0"],
}
SEEDS = (0, 1)
ROUNDS, EVERY, CHANCE = 30, 5, 0.1
BASE = ["data.alpha=1.0", f"run.rounds={ROUNDS}", f"eval.every={EVERY}", "local.strategy=sequential",
        "checkpoint.every=0"]


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_")


def main() -> None:
    import fedrun
    from fedrun.errors import NumericalError

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "docs" / "results" / "robust"))
    p.add_argument("--runs", default=str(REPO / "runs" / "robust"))
    args = p.parse_args()
    out, runs = Path(args.out), Path(args.runs)
    curves: dict[tuple[str, str, int], list[tuple[int, float]]] = {}
    for attack, attack_overrides in ATTACKS.items():
        for algorithm, algorithm_overrides in ALGORITHMS.items():
            for seed in SEEDS:
                run_dir = runs / f"{slug(attack)}-{slug(algorithm)}-seed{seed}"
                diverged = run_dir / "diverged.json"
                if not (run_dir / "result.json").is_file() and not diverged.is_file():
                    try:
                        fedrun.run(REPO / "configs" / "quickstart.yaml",
                                   [*BASE, *attack_overrides, *algorithm_overrides, f"run.seed={seed}",
                                    f"run.dir={run_dir}"])
                    except NumericalError as exc:  # the model became NaN/Inf: the run failed outright
                        diverged.write_text(json.dumps({"error": str(exc)}) + "\n")
                rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
                curve = [(i + 1, r["test_accuracy"]) for i, r in enumerate(rows) if "test_accuracy" in r]
                if diverged.is_file():  # chance level from the failure on
                    curve += [(r, CHANCE) for r in range(len(rows) + 1, ROUNDS + 1) if r % EVERY == 0]
                curves[attack, algorithm, seed] = curve  # (round r, test accuracy after round r)
                print(f"{attack:14s} {algorithm:26s} seed {seed}: {curves[attack, algorithm, seed][-1][1]:.3f}",
                      flush=True)
    write_table(out / "table.md", curves)
    plot(out, curves)


def write_table(path: Path, curves: dict) -> None:
    lines = ["| algorithm | " + " | ".join(f"{a}: mean (seeds)" for a in ATTACKS) + " |",
             "|---|" + "---|" * len(ATTACKS)]
    for algorithm in ALGORITHMS:
        cells = []
        for attack in ATTACKS:
            finals = [curves[attack, algorithm, s][-1][1] for s in SEEDS]
            cells.append(f"{sum(finals) / len(finals):.3f} ({', '.join(f'{f:.3f}' for f in finals)})")
        lines.append(f"| {algorithm} | " + " | ".join(cells) + " |")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(path.read_text())


def plot(out: Path, curves: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for attack in ATTACKS:
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for i, algorithm in enumerate(ALGORITHMS):
            for j, seed in enumerate(SEEDS):
                rounds, acc = zip(*curves[attack, algorithm, seed], strict=True)
                ax.plot(rounds, acc, color=f"C{i}", linestyle="-" if j == 0 else "--",
                        label=algorithm if j == 0 else None, marker="o", markersize=3)
        ax.set(xlabel="round", ylabel="test accuracy", ylim=(0, 1), title=f"MNIST (5k), corruption: {attack}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
        fig.savefig(out / f"accuracy_{slug(attack)}.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    main()
