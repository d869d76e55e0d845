"""Tables, plots and the FedSUM diagnosis of experiments/fmnist.py (``report`` and ``diagnose`` steps).

Reads only the committed run summaries under docs/results/fmnist/; writes docs/results/fmnist/tables.md,
summary.json and the PNGs. Mean ± standard deviation over seeds; "wins" count the seeds on which the first
method is better (same seed: same partition, participation draws and minibatches).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from fmnist_runs import (
    ADAM_LR_GRID,
    ALPHAS,
    BETA2_GRID,
    CASE2_PROBABILITIES,
    CASE_ALGORITHMS,
    CASES,
    CHOOSE_FROM,
    FADAMGC_ALGORITHMS,
    FEDADAMOM_ALGORITHMS,
    FEDSUM_ALGORITHMS,
    FEDSUM_BASE,
    LR_GRID,
    OUT,
    PATTERNS,
    REPO,
    SEEDS,
    ablation_specs,
    case2p_specs,
    case_specs,
    fadamgc_specs,
    fedadamom_choice,
    fedadamom_specs,
    fedsum_specs,
    load,
    run_all,
    shared_lr,
    spec,
    tuned_lrs,
)

BASELINES = ["FedAvg", "FedAU", "FedAWE", "FedVARP", "MIFA", "SCAFFOLD"]
OURS = ["FedSUM", "FedSUM-CR", "FedSUM-B"]


def collect(specs: list[dict], key=lambda s: (s["group"], s["label"])) -> dict:
    """key -> {seed: summary} of the finished runs."""
    out: dict = {}
    for s in specs:
        r = load(s)
        if r is not None:
            out.setdefault(key(s), {})[s["seed"]] = r
    return out


def ms(values, scale: float = 1.0, digits: int = 2) -> str:
    """Mean ± std of the finite values; None marks a diverged run and is counted, not averaged."""
    values = list(values)
    bad = sum(1 for x in values if x is None)
    v = np.asarray([x for x in values if x is not None], dtype=float) * scale
    note = f" ({bad}/{len(values)} diverged)" if bad else ""
    if len(v) == 0:
        return "diverged" if bad else "–"
    if len(v) == 1:
        return f"{v[0]:.{digits}f}{note}"
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}{note}"


def final(r: dict, key: str):
    if key == "train_objective":
        return r["train_objective"]
    return r[key][-1] if r["finite"] else None


def total_floats(r: dict) -> np.ndarray:
    return np.asarray(r["eval_cum_uplink"], float) + np.asarray(r["eval_cum_downlink"], float)


def acc_at_budget(r: dict, budget: float) -> float | None:
    """Test accuracy at ``budget`` communicated floats (up + down), linear between evaluations; None if
    the run never spent that much."""
    f = total_floats(r)
    acc = np.asarray(r["test_accuracy"], float)
    if not r["finite"] or budget > f[-1]:
        return None
    if budget <= f[0]:
        return float(acc[0] * budget / f[0])  # from 0 floats, 10% at 0 is a guess: keep it simple and linear
    return float(np.interp(budget, f, acc))


# ------------------------------------------------------------------------------------------- FedSUM


def fedsum_table(runs: dict, lr_of: dict[str, float]) -> tuple[str, dict]:
    """Per pattern: final test accuracy, test loss and f(x) per algorithm (mean ± std over seeds)."""
    lines = ["| algorithm | η0 | " + " | ".join(f"{p.upper()} test acc. (%) | {p.upper()} test loss | {p.upper()} f(x)"
                                              for p in PATTERNS) + " |",
             "|---|---|" + "---|---|---|" * len(PATTERNS)]
    data: dict = {}
    for label in FEDSUM_ALGORITHMS:
        cells = []
        for p in PATTERNS:
            rs = list(runs.get((p, label), {}).values())
            acc = [final(r, "test_accuracy") for r in rs]
            loss = [final(r, "test_loss") for r in rs]
            obj = [final(r, "train_objective") for r in rs]
            chance = sum(1 for a in acc if a is not None and a < 0.15)  # ended at chance level (10 classes)
            cells += [ms(acc, 100, 1) + (f" [{chance} at chance]" if chance else ""), ms(loss, digits=3),
                      ms(obj, digits=3)]
            data[f"{p}/{label}"] = {"seeds": sorted(runs.get((p, label), {})), "test_accuracy": acc,
                                    "test_loss": loss, "train_objective": obj}
        lines.append(f"| {label} | {lr_of[label]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", data


def early_table(runs: dict) -> str:
    """Test accuracy (%) at every evaluation, mean ± std over the seeds that did not diverge."""
    rounds = next(r["eval_rounds"] for seeds in runs.values() for r in seeds.values() if r["finite"])
    lines = ["| algorithm | " + " | ".join(f"{p.upper()} r{t}" for p in PATTERNS for t in rounds) + " |",
             "|---|" + "---|" * (len(PATTERNS) * len(rounds))]
    for label in FEDSUM_ALGORITHMS:
        cells = []
        for p in PATTERNS:
            rs = [r for r in runs.get((p, label), {}).values() if r["finite"]]
            for i in range(len(rounds)):
                cells.append(ms([r["test_accuracy"][i] for r in rs], 100, 1) if rs else "–")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def paired_difference(a: dict, b: dict, key: str) -> tuple[str, str]:
    """Seed-paired mean difference a − b of the final ``key`` (accuracy in points) and the seeds on which a is
    better (higher accuracy, lower loss or f(x)); ("–", "–") when no seed has both finite."""
    d = [final(a[s], key) - final(b[s], key) for s in sorted(set(a) & set(b))
         if final(a[s], key) is not None and final(b[s], key) is not None]
    if not d:
        return "–", "–"
    sign, scale = (1, 100) if key == "test_accuracy" else (-1, 1)
    return f"{scale * np.mean(d):+.{1 if scale == 100 else 3}f}", f"{sum(1 for x in d if sign * x > 0)}/{len(d)}"


def paired(runs: dict, ours: list[str], others: list[str]) -> str:
    lines = ["| pattern | comparison | Δ test acc. (pp) | wins | Δ test loss | wins | Δ f(x) | wins |",
             "|---|---|---|---|---|---|---|---|"]
    for p in PATTERNS:
        for a in ours:
            for b in others:
                ra, rb = runs.get((p, a), {}), runs.get((p, b), {})
                common = sorted(set(ra) & set(rb))
                if not common or a == b:
                    continue
                cells = [cell for key in ("test_accuracy", "test_loss", "train_objective")
                         for cell in paired_difference(ra, rb, key)]
                lines.append(f"| {p.upper()} | {a} − {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def communication(runs: dict, budget_label: str = "FedAvg") -> tuple[str, dict]:
    """Floats per active client per round, and test accuracy at FedAvg's 100-round budget of floats."""
    lines = ["| algorithm | up / down floats per active client per round (d = 21,840) | " +
             " | ".join(f"{p.upper()} acc. (%) at FedAvg's budget (None: not reached or diverged)"
                        for p in PATTERNS) + " |",
             "|---|---|" + "---|" * len(PATTERNS)]
    data: dict = {}
    for label in FEDSUM_ALGORITHMS:
        per = "–"
        cells = []
        for p in PATTERNS:
            rs = runs.get((p, label), {})
            base = runs.get((p, budget_label), {})
            vals = []
            for s, r in rs.items():
                if s in base and base[s]["finite"]:
                    vals.append(acc_at_budget(r, float(total_floats(base[s])[-1])) if r["finite"] else None)
            cells.append(ms(vals, 100, 1))
            data[f"{p}/{label}"] = vals
            finite = [r for r in rs.values() if r["finite"]]
            if finite and per == "–":
                r = finite[0]
                active = np.asarray(r["active_clients"], float)
                up = r["eval_cum_uplink"][-1] / active.sum() / 21840
                down = r["eval_cum_downlink"][-1] / active.sum() / 21840
                per = f"{up:.2f} d / {down:.2f} d"
        lines.append(f"| {label} | {per} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", data


def plot_fedsum(runs: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, len(PATTERNS), figsize=(5.2 * len(PATTERNS), 12), squeeze=False)
    colors = plt.get_cmap("tab10")
    for j, p in enumerate(PATTERNS):
        for k, label in enumerate(FEDSUM_ALGORITHMS):
            rs = [r for r in runs.get((p, label), {}).values() if r["finite"]]
            if not rs:
                continue
            style = "-" if label.startswith("FedSUM") else "--"
            c = colors(k % 10)
            acc = np.stack([r["test_accuracy"] for r in rs]) * 100
            rounds = rs[0]["eval_rounds"]
            axes[0, j].plot(rounds, acc.mean(0), style, color=c, label=label, marker="o", ms=3)
            floats = np.stack([total_floats(r) for r in rs]).mean(0)
            axes[1, j].plot(floats, acc.mean(0), style, color=c, label=label, marker="o", ms=3)
            loss = np.stack([_smooth(r["train_loss"], 10) for r in rs]).mean(0)
            axes[2, j].plot(np.arange(len(loss)) + 10, loss, style, color=c, label=label, lw=1)
        axes[0, j].set_title(f"{title}: {p.upper()}")
        axes[0, j].set_xlabel("round")
        axes[0, j].set_ylabel("test accuracy (%), mean over seeds")
        axes[1, j].set_xlabel("floats communicated, up + down, all clients")
        axes[1, j].set_ylabel("test accuracy (%)")
        axes[1, j].set_xscale("log")
        axes[2, j].set_xlabel("round")
        axes[2, j].set_ylabel("loss on active clients' minibatches\n(during local steps, 10-round mean)")
        axes[2, j].set_yscale("log")
        for row in range(3):
            axes[row, j].grid(alpha=0.3)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colors(k % 10), ls="-" if label.startswith("FedSUM") else "--", label=label)
               for k, label in enumerate(FEDSUM_ALGORITHMS)]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=70)
    plt.close(fig)


def _smooth(y, w: int) -> np.ndarray:
    y = np.asarray([np.nan if v is None else v for v in y], dtype=float)
    ok = np.isfinite(y)
    total = np.convolve(np.where(ok, y, 0.0), np.ones(w), mode="valid")
    count = np.convolve(ok.astype(float), np.ones(w), mode="valid")
    return np.divide(total, count, out=np.full_like(total, np.nan), where=count > 0)


# ----------------------------------------------------------------------------------------- FedAdamom


def final_fedadamom_specs() -> list[dict]:
    return [s for alpha in ALPHAS
            for s in fedadamom_specs(seeds=SEEDS, choose=True, alphas=(alpha,), choose_from=CHOOSE_FROM.get(alpha))]


def fedadamom_tables() -> tuple[str, dict]:
    parts, data = [], {}
    grid = collect(fedadamom_specs(), key=lambda s: (s["group"], s["label"]))
    for alpha in ALPHAS:
        group = f"fedadamom/alpha{alpha}"
        if alpha in CHOOSE_FROM:
            parts.append(f"**Dirichlet {alpha}**: no grid; each algorithm runs at its value chosen at Dirichlet "
                         f"{CHOOSE_FROM[alpha]}.\n")
            continue
        parts.append(f"**Grids, Dirichlet {alpha}, seed 0** (f(x) and test accuracy at the last round; "
                     "chosen: lowest f(x))\n")
        parts.append("| algorithm | knob | values: f(x) / test acc. (%) | chosen |")
        parts.append("|---|---|---|---|")
        for label, (_fixed, key, values) in FEDADAMOM_ALGORITHMS.items():
            cells = []
            for v in values:
                r = grid.get((group, f"{label} {key.split('.')[-1]}={v}"), {}).get(0)
                if r is None:
                    cells.append(f"{v}: –")
                elif not r["finite"]:
                    cells.append(f"{v}: diverged")
                else:
                    cells.append(f"{v}: {r['train_objective']:.3f} / {100 * r['test_accuracy'][-1]:.1f}")
            parts.append(f"| {label} | {key} | " + "; ".join(cells) + f" | {fedadamom_choice(alpha, label)} |")
        parts.append("")
    final_runs = collect(final_fedadamom_specs(), key=lambda s: (s["group"], s["label"]))
    for alpha in ALPHAS:
        group = f"fedadamom/alpha{alpha}"
        rows = []
        for (g, label), seeds in final_runs.items():
            if g != group:
                continue
            rs = list(seeds.values())
            acc = [final(r, "test_accuracy") for r in rs]
            rows.append((np.mean([a for a in acc if a is not None] or [0]), label, rs, acc))
            data[f"alpha{alpha}/{label}"] = {"seeds": sorted(seeds), "test_accuracy": acc,
                                             "test_loss": [final(r, "test_loss") for r in rs],
                                             "train_objective": [final(r, "train_objective") for r in rs]}
        parts.append(f"**Dirichlet {alpha}, each at its chosen value, seeds {', '.join(map(str, SEEDS))}** "
                     "(last round; best first)\n")
        parts.append("| algorithm | seeds | test acc. (%) | test loss | f(x) | Δ acc. FedAdamom − it (pp), wins |")
        parts.append("|---|---|---|---|---|---|")
        ours = next((seeds for (g, label), seeds in final_runs.items() if g == group and label.startswith("FedAdamom")),
                    {})
        for _, label, rs, acc in sorted(rows, key=lambda t: -t[0]):
            dtxt = "–" if label.startswith("FedAdamom") else _delta(ours, final_runs[(group, label)])
            loss = ms([final(r, "test_loss") for r in rs], digits=3)
            parts.append(f"| {label} | {len(rs)} | {ms(acc, 100, 1)} | {loss} | "
                         f"{ms([final(r, 'train_objective') for r in rs], digits=3)} | {dtxt} |")
        parts.append("")
    abl = collect(ablation_specs(), key=lambda s: s["label"])
    if abl:
        parts.append("**FedAdamom's β2, Dirichlet 0.1, seed 0** (η = 1, ε = 1e-3)\n")
        parts.append("| β2 | test acc. (%) | test loss | f(x) |")
        parts.append("|---|---|---|---|")
        for b in BETA2_GRID:
            r = abl.get(f"FedAdamom beta2={b}", {}).get(0)
            if r is not None:
                parts.append(f"| {b} | {ms([final(r, 'test_accuracy')], 100, 1)} | "
                             f"{ms([final(r, 'test_loss')], digits=3)} | {ms([r['train_objective']], digits=3)} |")
                data[f"beta2/{b}"] = {"test_accuracy": final(r, "test_accuracy"),
                                      "train_objective": r["train_objective"]}
        parts.append("")
    return "\n".join(parts), data


def plot_fedadamom(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    final_runs = collect(final_fedadamom_specs(), key=lambda s: (s["group"], s["label"]))
    if not final_runs:
        return
    fig, axes = plt.subplots(2, len(ALPHAS), figsize=(6 * len(ALPHAS), 8), squeeze=False)
    colors = plt.get_cmap("tab10")
    for j, alpha in enumerate(ALPHAS):
        group = f"fedadamom/alpha{alpha}"
        for k, ((g, label), seeds) in enumerate(sorted(final_runs.items())):
            if g != group:
                continue
            rs = [r for r in seeds.values() if r["finite"]]
            if not rs:
                continue
            style = "-" if label.startswith("FedAdamom") else "--"
            c = colors(k % 10)
            acc = np.stack([r["test_accuracy"] for r in rs]) * 100
            axes[0, j].plot(rs[0]["eval_rounds"], acc.mean(0), style, color=c, label=label, marker="o", ms=3)
            loss = np.stack([_smooth(r["train_loss"], 10) for r in rs]).mean(0)
            axes[1, j].plot(np.arange(len(loss)) + 10, loss, style, color=c, label=label, lw=1)
        axes[0, j].set_title(f"FedAdamom comparison, Dirichlet {alpha}")
        axes[0, j].set_ylabel("test accuracy (%), mean over seeds")
        axes[1, j].set_ylabel("loss on active clients' minibatches (10-round mean)")
        axes[1, j].set_yscale("log")
        for row in range(2):
            axes[row, j].set_xlabel("round")
            axes[row, j].grid(alpha=0.3)
        axes[0, j].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


# ------------------------------------------------------------------ Cases 1-4, the sweep over p, FAdamGC


def _row(rs: list[dict]) -> list[str]:
    """Final test accuracy (%), test loss and f(x), mean ± std over ``rs``."""
    return [ms([final(r, "test_accuracy") for r in rs], 100, 1), ms([final(r, "test_loss") for r in rs], digits=3),
            ms([final(r, "train_objective") for r in rs], digits=3)]


def _delta(a: dict, b: dict, key: str = "test_accuracy") -> str:
    """``paired_difference`` as one cell, "mean, wins"."""
    mean, wins = paired_difference(a, b, key)
    return mean if wins == "–" else f"{mean}, {wins}"


def cases_tables() -> tuple[str, dict]:
    """FedSUM against FedAvg under every participation case, and FedSUM under Case 2 at every p."""
    parts, data = [], {}
    runs = collect(case_specs(), key=lambda s: (s["group"].split("/")[1], s["label"]))
    if runs:
        ours, other = CASE_ALGORITHMS
        parts.append(f"**{ours} and {other} under the participation cases** (each at its own η0, round 100, "
                     "mean ± std over seeds)\n")
        parts.append(f"| case | {ours} acc. (%) | {other} acc. (%) | Δ acc. (pp), wins | {ours} f(x) | {other} f(x) "
                     "| Δ f(x), wins |")
        parts.append("|---|---|---|---|---|---|---|")
        for case in CASES:
            key = case.replace(" ", "")
            a, b = runs.get((key, ours), {}), runs.get((key, other), {})
            if not a or not b:
                continue
            ra, rb = _row(list(a.values())), _row(list(b.values()))
            parts.append(f"| {case} | {ra[0]} | {rb[0]} | {_delta(a, b)} | {ra[2]} | {rb[2]} | "
                         f"{_delta(a, b, 'train_objective')} |")
            data[case] = {label: {"test_accuracy": [final(r, "test_accuracy") for r in seeds.values()],
                                  "train_objective": [final(r, "train_objective") for r in seeds.values()]}
                          for label, seeds in ((ours, a), (other, b))}
        parts.append("")
    sweep = collect(case2p_specs(), key=lambda s: s["label"])
    if sweep:
        parts.append("**FedSUM under Case 2 at every client's p** (η0 = FedSUM's own, round 100, mean ± std over "
                     "seeds)\n")
        parts.append("| p | mean active clients per round | test acc. (%) | test loss | f(x) |")
        parts.append("|---|---|---|---|---|")
        for p in CASE2_PROBABILITIES:
            rs = list(sweep.get(f"FedSUM p={p}", {}).values())
            if rs:
                active = np.mean([np.mean(r["active_clients"]) for r in rs])
                parts.append(f"| {p} | {active:.1f} | " + " | ".join(_row(rs)) + " |")
                data[f"case2/p{p}"] = {"test_accuracy": [final(r, "test_accuracy") for r in rs],
                                       "train_objective": [final(r, "train_objective") for r in rs]}
        parts.append("")
    return "\n".join(parts), data


def plot_cases(path: Path) -> None:
    """Test accuracy against rounds: FedSUM and FedAvg under each case (left), FedSUM at each p (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = collect(case_specs(), key=lambda s: (s["group"].split("/")[1], s["label"]))
    sweep = collect(case2p_specs(), key=lambda s: s["label"])
    if not runs or not sweep:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.get_cmap("tab10")

    def curve(ax, seeds: dict, label: str, color, style: str) -> None:
        rs = [r for r in seeds.values() if r["finite"]]
        if rs:
            acc = np.stack([r["test_accuracy"] for r in rs]) * 100
            ax.errorbar(rs[0]["eval_rounds"], acc.mean(0), yerr=acc.std(0, ddof=1) if len(rs) > 1 else None,
                        fmt=style, color=color, label=label, marker="o", ms=3, capsize=2)

    for k, case in enumerate(CASES):
        for label, style in zip(CASE_ALGORITHMS, ("-", "--"), strict=True):
            curve(left, runs.get((case.replace(" ", ""), label), {}), f"{label}, {case}", colors(k), style)
    for k, p in enumerate(CASE2_PROBABILITIES):
        curve(right, sweep.get(f"FedSUM p={p}", {}), f"p = {p}", colors(k), "-")
    left.set_title("FedSUM (solid) and FedAvg (dashed) under the participation cases")
    right.set_title("FedSUM under Case 2 at every client's p")
    for ax in (left, right):
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy (%), mean ± 1 std over seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def fadamgc_tables(tuned_runs: dict) -> tuple[str, dict]:
    """FAdamGC against local Adam without the correction (each at its best lr) and FedAvg / SCAFFOLD at their
    own η0, under P1."""
    parts, data = [], {}
    grid = collect(fadamgc_specs(), key=lambda s: s["label"])
    if not grid:
        return "", data
    parts.append("**FAdamGC's local lr (P1, seed 0, round 100)**: f(x) / test acc. (%); chosen: lowest f(x)\n")
    parts.append("| variant | " + " | ".join(f"lr = {lr}" for lr in ADAM_LR_GRID) + " |")
    parts.append("|---|" + "---|" * len(ADAM_LR_GRID))
    for label in FADAMGC_ALGORITHMS:
        cells = []
        for lr in ADAM_LR_GRID:
            r = grid.get(f"{label} lr={lr}", {}).get(0)
            cells.append("–" if r is None else "diverged" if not r["finite"] else
                         f"{r['train_objective']:.3f} / {100 * r['test_accuracy'][-1]:.1f}")
        parts.append(f"| {label} | " + " | ".join(cells) + " |")
    parts.append("")
    chosen = collect(fadamgc_specs(choose=True), key=lambda s: s["label"])
    rows = dict(chosen)
    lrs = tuned_lrs()
    rows.update({f"{label} η0={lrs[label]}": tuned_runs.get(("p1", label), {}) for label in ("FedAvg", "SCAFFOLD")})
    ours = next((seeds for label, seeds in rows.items() if label.startswith("FAdamGC")), {})
    parts.append(f"**P1, seeds {', '.join(map(str, SEEDS))}, round 100**\n")
    parts.append("| method | seeds | test acc. (%) | test loss | f(x) | Δ acc. FAdamGC − it (pp), wins |")
    parts.append("|---|---|---|---|---|---|")
    for label, seeds in rows.items():
        if not seeds:
            continue
        rs = list(seeds.values())
        dtxt = "–" if label.startswith("FAdamGC") else _delta(ours, seeds)
        parts.append(f"| {label} | {len(rs)} | " + " | ".join(_row(rs)) + f" | {dtxt} |")
        data[label] = {"test_accuracy": [final(r, "test_accuracy") for r in rs],
                       "train_objective": [final(r, "train_objective") for r in rs]}
    parts.append("")
    return "\n".join(parts), data


# ---------------------------------------------------------------------------------------------- report


def report() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    parts: list[str] = []
    summary: dict = {}
    lr0 = shared_lr()
    fedavg = collect([s for lr in LR_GRID for s in fedsum_specs(lr, seeds=(0,), patterns=("p1",), labels=["FedAvg"])],
                     key=lambda s: s["group"])
    parts.append("### FedAvg's η0 (P1, seed 0, round 100)\n")
    parts.append("| η0 | test acc. (%) | test loss | f(x) |")
    parts.append("|---|---|---|---|")
    for lr in LR_GRID:
        r = fedavg.get(f"eta{lr}/p1", {}).get(0)
        if r is not None:
            parts.append(f"| {lr} | {ms([final(r, 'test_accuracy')], 100, 1)} | "
                         f"{ms([final(r, 'test_loss')], digits=3)} | {ms([r['train_objective']], digits=3)} |")
    parts.append("")

    shared = collect(fedsum_specs(lr0), key=lambda s: (s["group"].split("/")[1], s["label"]))
    if shared:
        text, data = fedsum_table(shared, dict.fromkeys(FEDSUM_ALGORITHMS, lr0))
        summary["fedsum_shared"] = data
        parts += [f"### FedSUM comparison, shared η0 = {lr0}, round 100, mean ± std over seeds\n", text]
        parts += ["Test accuracy (%) at each evaluation (diverged runs left out)\n", early_table(shared)]
        parts += ["Seed-paired differences against the baselines\n", paired(shared, OURS, BASELINES)]
        parts += ["Within the FedSUM family\n", paired(shared, ["FedSUM-CR", "FedSUM-B"], ["FedSUM"])]
        text, data = communication(shared)
        summary["fedsum_shared_budget"] = data
        parts += ["Communication\n", text]
        plot_fedsum(shared, OUT / "fedsum_shared.png", f"shared η0 = {lr0}")

    tuned = tuned_lrs()
    summary["tuned_lr"] = tuned
    grid = collect([s for lr in LR_GRID for s in fedsum_specs(lr, seeds=(0,), patterns=("p1",))],
                   key=lambda s: (s["group"].split("/")[0], s["label"]))
    if grid:
        parts.append("### Each algorithm's own η0 (P1, seed 0, round 100): f(x) / test acc. (%)\n")
        parts.append("| algorithm | " + " | ".join(f"η0 = {lr}" for lr in LR_GRID) + " | chosen (lowest f(x)) |")
        parts.append("|---|" + "---|" * len(LR_GRID) + "---|")
        for label in FEDSUM_ALGORITHMS:
            cells = []
            for lr in LR_GRID:
                r = grid.get((f"eta{lr}", label), {}).get(0)
                if r is None:
                    cells.append("–")
                elif not r["finite"] or r["train_objective"] is None:
                    cells.append("diverged")
                else:
                    cells.append(f"{r['train_objective']:.3f} / {100 * r['test_accuracy'][-1]:.1f}")
            parts.append(f"| {label} | " + " | ".join(cells) + f" | {tuned[label]} |")
        parts.append("")
    tuned_runs = {}
    for label, lr in tuned.items():
        if lr is None:
            continue
        for (p, lab), seeds in collect(fedsum_specs(lr, labels=[label]),
                                        key=lambda s: (s["group"].split("/")[1], s["label"])).items():
            tuned_runs[(p, lab)] = seeds
    if tuned_runs and all(v is not None for v in tuned.values()):
        text, data = fedsum_table(tuned_runs, tuned)
        summary["fedsum_tuned"] = data
        parts += ["### FedSUM comparison, each algorithm at its own η0, round 100, mean ± std over seeds\n", text]
        parts += ["Seed-paired differences against the baselines (tuned)\n", paired(tuned_runs, OURS, BASELINES)]
        plot_fedsum(tuned_runs, OUT / "fedsum_tuned.png", "each at its own η0")

    text, data = cases_tables()
    if data:
        summary["cases"] = data
        parts += ["### Participation cases 1-4, biased sampling, and Case 2 over p\n", text]
        plot_cases(OUT / "cases.png")
    text, data = fadamgc_tables(tuned_runs)
    if data:
        summary["fadamgc"] = data
        parts += ["### FAdamGC against local Adam without correction\n", text]

    text, data = fedadamom_tables()
    if data:
        summary["fedadamom"] = data
        parts += ["### FedAdamom comparison\n", text]
        plot_fedadamom(OUT / "fedadamom.png")
    diag = OUT / "diagnosis.json"
    if diag.is_file():
        summary["diagnosis"] = json.loads(diag.read_text())
    (OUT / "tables.md").write_text("\n".join(parts))
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n".join(parts))


# -------------------------------------------------------------------------------------------- diagnose


def diagnose() -> None:
    """Why FedSUM trails: (1) full participation for 50 rounds (no absent clients, so no h_i older than one
    round) for FedSUM and FedAvg, and FedSUM at eta_0 = 0.06 and 0.1 (its server step eta_0 K = 0.3 and 0.5);
    (2) in the P1 run, the relative error of FedSUM's direction y/N
    against the gradient of f at the same x, every 10 rounds."""
    import torch

    full = [spec("diagnose/full", label, FEDSUM_BASE,
                 [*FEDSUM_ALGORITHMS[label], "participation.pattern=full", f"local.lr={shared_lr()}",
                  "run.rounds=50"], 0)
            for label in ("FedAvg", "FedSUM")]
    # the step-size test: FedSUM's one server step of eta_0 K along y/N at full participation, with eta_0
    # lowered so that eta_0 K = 0.3 (FedAvg's local step) and in between
    full += [spec("diagnose/full", f"FedSUM eta0={lr}", FEDSUM_BASE,
                  [*FEDSUM_ALGORITHMS["FedSUM"], "participation.pattern=full", f"local.lr={lr}", "run.rounds=50"], 0)
             for lr in (0.06, 0.1)]
    ckpt = [spec("diagnose/ckpt", label, FEDSUM_BASE,
                 [*FEDSUM_ALGORITHMS[label], "participation.pattern=p1", f"local.lr={shared_lr()}",
                  "checkpoint.every=10", "checkpoint.keep=20"], 0)
            for label in ("FedSUM",)]
    run_all(full + ckpt)
    out: dict = {"full": {}, "direction_error": {}}
    for s in full:
        r = load(s)
        if r is not None:
            out["full"][s["label"]] = {"test_accuracy": r["test_accuracy"], "test_loss": r["test_loss"],
                                       "train_objective": r["train_objective"], "eval_rounds": r["eval_rounds"]}
    torch.set_num_threads(1)
    for s in ckpt:
        run_dir = REPO / next(o.split("=", 1)[1] for o in s["overrides"] if o.startswith("run.dir="))
        out["direction_error"][s["label"]] = direction_error(s, run_dir)
    (OUT / "diagnosis.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


def direction_error(s: dict, run_dir: Path) -> list[dict]:
    """For each checkpoint of a FedSUM run (round r, after its server step): the direction d = y/N that the
    step x_post = x_pre - eta_g eta_l(r-1) K d used, the gradient of f at x_pre (recovered by inverting that
    step) and at x_post, their cosines and relative errors, and f at both points. grad f = (1/N) sum_i
    grad f_i on up to 500 examples per client (train mode, dropout on, as the clients' gradients are
    taken); f in evaluation mode on the same examples."""
    import h5py
    import torch
    import torch.nn.functional as F
    import yaml

    from fedrun.config import apply_override, config_from_dict
    from fedrun.data import load_task
    from fedrun.data.partition import partition
    from fedrun.models import build_model
    from fedrun.training.flat_model import FlatModel
    from fedrun.training.schedule import local_lr

    cfg_dict = yaml.safe_load((REPO / s["base"]).read_text())
    for item in s["overrides"]:
        apply_override(cfg_dict, item)
    cfg = config_from_dict(cfg_dict)
    task = load_task(cfg.data, cfg.run.seed)
    parts = partition(task, cfg.data, cfg.run.seed)
    rng = np.random.default_rng(7)
    picks = [np.sort(rng.choice(p, size=min(500, len(p)), replace=False)) for p in parts]
    torch.manual_seed(0)
    model = FlatModel(build_model(cfg.model.name, task.x_train.shape[1:], task.num_classes))
    n, k_steps, eta_g = cfg.data.num_clients, cfg.local.steps, cfg.algorithm.hparams.global_lr

    def grad_and_loss(x: torch.Tensor) -> tuple[torch.Tensor, float]:
        grads, losses = [], []
        for idx in picks:
            inputs, targets = torch.as_tensor(task.x_train[idx]), torch.as_tensor(task.y_train[idx])
            model.module.train()
            xv = x.clone().requires_grad_(True)
            (g,) = torch.autograd.grad(F.cross_entropy(model.forward(xv, inputs), targets), xv)
            grads.append(g)
            model.module.eval()
            with torch.no_grad():
                losses.append(float(F.cross_entropy(model.forward(x, inputs), targets)))
        model.module.train()
        return torch.stack(grads).mean(0), float(np.mean(losses))

    def cos(a: torch.Tensor, b: torch.Tensor) -> float:
        return float(torch.dot(a, b) / (a.norm() * b.norm() + 1e-30))

    rows = []
    for path in sorted(run_dir.glob("ckpt_*.h5")):
        with h5py.File(path, "r") as f:
            rnd = int(f["meta/round"][()])
            x_post = torch.as_tensor(f["server/x"][()], dtype=torch.float32)
            d = torch.as_tensor(f["server/y"][()], dtype=torch.float32) / n
        step = eta_g * local_lr(cfg.local, rnd - 1) * k_steps
        x_pre = x_post + step * d
        g_pre, f_pre = grad_and_loss(x_pre)
        g_post, f_post = grad_and_loss(x_post)
        rows.append({"round": rnd, "step_size": step, "step_norm": float(step * d.norm()),
                     "cos_pre": cos(d, g_pre), "relative_error_pre": float((d - g_pre).norm() / g_pre.norm()),
                     "cos_post": cos(d, g_post), "cos_grad_pre_post": cos(g_pre, g_post),
                     "f_pre": f_pre, "f_post": f_post, "grad_norm_pre": float(g_pre.norm()),
                     "direction_norm": float(d.norm())})
    return rows
