"""Tables, plots, claims and the FedSUM diagnosis of experiments/fmnist.py (``report`` and ``diagnose`` steps).

Reads only the run summaries under docs/results/fmnist_10seeds/ (and those of the paper-settings runs,
``fmnist_runs.PAPER_OUT``, and the flatness measurements in its ``flatness`` and ``flatness_same_loss``
folders); writes
docs/results/fmnist_10seeds/tables.md, summary.json and the PNGs, and copies every table block into
docs/results.md between its markers ``<!-- tables.md: NAME -->`` and ``<!-- end NAME -->``, so that
``python experiments/fmnist.py report`` is the one command that regenerates the page's numbers.

Every comparison is seed-paired (experiments/stats.py): the same seed means the same partition,
participation draws, minibatches and dropout. A cell "Δ a − b" reads "mean (95% t-interval), Wilcoxon p,
wins/n"; summary.json holds every comparison with its per-seed differences and a seeded percentile
bootstrap interval beside the t-interval. A run that diverged counts as chance accuracy (10%, ten
classes) in every accuracy comparison, and has no f(x) or test loss: its seed drops out of those
comparisons; a run that stayed finite but ended at chance is flagged "collapsed" beside the mean. A
section whose runs are not all finished prints "pending: k of n runs finished" and no numbers.

The verdicts are not made here: ``report`` evaluates the claims of experiments/fmnist_claims.py
(experiments/claims.py), writes them to docs/results/claims.json, and renders the page's verdict tables
from that file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

import claims
import numpy as np
import yaml
from fmnist_claims import page_claims
from fmnist_flatness import LABELS as FLATNESS_METHODS
from fmnist_flatness import SAME_LOSS_LABELS
from fmnist_runs import (
    ADAM_LR_GRID,
    ALPHAS,
    CASE2_PROBABILITIES,
    CASE_ALGORITHMS,
    CASES,
    FADAMGC_ALGORITHMS,
    FEDADAMOM_ALGORITHMS,
    FEDSUM_ALGORITHMS,
    FEDSUM_BASE,
    LR_GRID,
    OUT,
    PAPER_ALGORITHMS,
    PAPER_BASE,
    PAPER_LR_GRID,
    PATTERNS,
    PROBE_ARMS,
    PROBE_PATTERNS,
    REPO,
    SEEDS,
    TUNE_SEEDS,
    ablation_specs,
    best,
    case2p_specs,
    case_specs,
    fadamgc_specs,
    fedadamom_choice,
    fedadamom_specs,
    fedsum_specs,
    load,
    paper_grid_lr,
    paper_grid_specs,
    paper_grid_tune_specs,
    paper_specs,
    probe_specs,
    run_all,
    shared_lr,
    spec,
    tune_specs,
    tuned_lrs,
)
from stats import Paired, paired

PAGE = REPO / "docs" / "results.md"
CHANCE = 0.1  # the accuracy a diverged run counts as (ten classes)
BASELINES = ["FedAvg", "FedAU", "FedAWE", "FedVARP", "MIFA", "SCAFFOLD"]
N = len(SEEDS)

# ------------------------------------------------------------------------------------------- values


def metric(r: dict, key: str) -> float | None:
    """A run's final ``key``: a diverged run (non-finite model) has chance accuracy and no loss or f(x).

    Keys: test_accuracy (last evaluation), first_accuracy (first evaluation), best_accuracy (over the
    evaluations), test_loss, train_objective."""
    ok = r["finite"] and r["test_accuracy"]
    if key in ("test_accuracy", "first_accuracy", "best_accuracy"):
        if not ok:
            return CHANCE
        acc = r["test_accuracy"]
        return {"test_accuracy": acc[-1], "first_accuracy": acc[0], "best_accuracy": max(acc)}[key]
    if key == "test_loss":
        return r["test_loss"][-1] if ok else None
    return r["train_objective"] if r["finite"] else None


HIGHER = {"test_accuracy": True, "first_accuracy": True, "best_accuracy": True, "budget_accuracy": True,
          "test_loss": False, "train_objective": False, "top_eigenvalue": False, "loss_increase": False}
SCALE = {"test_accuracy": (100, 1), "first_accuracy": (100, 1), "best_accuracy": (100, 1),
         "budget_accuracy": (100, 1), "test_loss": (1, 3), "train_objective": (1, 3)}


def ms(values, scale: float = 1.0, digits: int = 2) -> str:
    """Mean ± std (ddof 1) of the values that are not None; the Nones are counted."""
    values = list(values)
    v = np.asarray([x for x in values if x is not None], dtype=float) * scale
    miss = len(values) - len(v)
    note = f" ({miss} without)" if miss else ""
    if len(v) == 0:
        return "–"
    if len(v) == 1:
        return f"{v[0]:.{digits}f}{note}"
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}{note}"


def acc_cell(runs: dict[int, dict], digits: int = 1) -> str:
    """Mean ± std of the final test accuracy (%), with the runs that diverged (counted as chance) and those
    that collapsed to chance with a finite model (``claims.collapsed``) flagged and counted."""
    cell = ms(values(runs, "test_accuracy").values(), 100, digits)
    flags = [f"{n} {word}" for n, word in ((sum(not r["finite"] for r in runs.values()), "diverged"),
                                           (sum(claims.collapsed(r) for r in runs.values()), "collapsed"))
             if n]
    return cell + (f" ⚠ {', '.join(flags)}" if flags else "")


def delta(p: Paired, scale: float = 1.0, digits: int = 2) -> str:
    """One comparison as a cell: mean (95% interval), Wilcoxon p, wins/n."""
    if p.n == 0:
        return "–"
    lo, hi = (scale * v for v in p.ci)
    ci = f"{lo:+.{digits}f}, {hi:+.{digits}f}" if np.isfinite(lo) else "n < 2"
    return f"{scale * p.mean:+.{digits}f} ({ci}), p = {p.wilcoxon_p:.2g}, {p.wins}/{p.n}"


def values(runs: dict[int, dict], key: str) -> dict[int, float | None]:
    return {s: metric(r, key) for s, r in runs.items()}


def compare(a: dict[int, dict], b: dict[int, dict], key: str) -> Paired:
    """Seed-paired a - b on ``key``, with the bootstrap interval beside the t-interval (summary.json)."""
    return paired(values(a, key), values(b, key), higher_is_better=HIGHER[key], bootstrap=True)


def collect(specs: list[dict], key: Callable[[dict], object]) -> dict:
    """key(spec) -> {seed: summary} of the finished runs."""
    out: dict = {}
    for s in specs:
        r = load(s)
        if r is not None:
            out.setdefault(key(s), {})[s["seed"]] = r
    return out


def pending(specs: list[dict]) -> str | None:
    """"pending: k of n runs finished" while any of ``specs`` is unfinished, else None."""
    done = sum(1 for s in specs if load(s) is not None)
    return None if done == len(specs) else f"pending: {done} of {len(specs)} runs finished"


def choose(make: Callable[[], list[dict]], grid: list[dict]) -> tuple[list[dict], str | None]:
    """The specs of a step that reads a choice, or the grid's pending line while the choice is not made."""
    try:
        return make(), None
    except SystemExit:
        return [], (pending(grid) or "pending") + " (the tuning grid)"


# ----------------------------------------------------------------------------------- comparison tables


def comparison_table(rows: dict[str, dict[int, dict]], refs: list[str], keys=("test_accuracy", "train_objective"),
                     extra: dict[str, str] | None = None, extra_name: str = "η0") -> tuple[str, dict]:
    """One row per method: mean ± std of test accuracy, test loss, f(x); then for every reference r and
    key, the seed-paired Δ r − method. ``extra`` adds a column (e.g. each row's η0)."""
    head = ["method"] + ([extra_name] if extra else []) + ["test acc. (%)", "test loss", "f(x)"]
    head += [f"Δ {'acc. (pp)' if k.endswith('accuracy') else 'f(x)'} {r} − it" for r in refs for k in keys]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    data: dict = {}
    for label, runs in rows.items():
        cells = [label] + ([extra[label]] if extra else [])
        cells += [acc_cell(runs, SCALE["test_accuracy"][1])]
        cells += [ms(values(runs, k).values(), *SCALE[k]) for k in ("test_loss", "train_objective")]
        data[label] = {k: values(runs, k) for k in ("test_accuracy", "test_loss", "train_objective")}
        for r in refs:
            for k in keys:
                if r == label:
                    cells.append("–")
                    continue
                p = compare(rows[r], runs, k)
                cells.append(delta(p, *SCALE[k]))
                data[label][f"{r} - it/{k}"] = p.as_dict()
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n", data


def family(rows: dict[str, dict[int, dict]], a: str, others, key: str = "test_accuracy") -> dict[str, Paired]:
    return {f"{a} − {b}": compare(rows[a], rows[b], key) for b in others if b != a and b in rows}


# ---------------------------------------------------------------------------------------------- sections


@dataclass
class Report:
    blocks: dict[str, str] = field(default_factory=dict)
    summary: dict = field(default_factory=dict)


def tuning(rep: Report) -> None:
    """The values chosen on the tuning seeds, with each grid's mean f(x) over them."""
    parts = [f"Every value is chosen by the lowest final f(x) averaged over the tuning seeds "
             f"{', '.join(map(str, TUNE_SEEDS))} (a value with a diverged run loses). Cells: mean f(x) / mean "
             "test accuracy (%) over the tuning seeds.\n"]

    def cell(rs: list[dict | None]) -> str:
        if any(r is None for r in rs):
            return "–"
        if not all(r["finite"] and r["train_objective"] is not None for r in rs):
            return f"diverged ({sum(not r['finite'] for r in rs)}/{len(rs)})"
        return (f"{np.mean([r['train_objective'] for r in rs]):.3f} / "
                f"{100 * np.mean([r['test_accuracy'][-1] for r in rs]):.1f}")

    def fedsum_grid() -> list[str]:
        lrs = tuned_lrs()
        rep.summary["tuned_lr"] = lrs
        lines = ["| algorithm | " + " | ".join(f"η0 = {v}" for v in LR_GRID) + " | chosen |",
                 "|---|" + "---|" * (len(LR_GRID) + 1)]
        for label in FEDSUM_ALGORITHMS:
            cells = [cell([load(s) for s in fedsum_specs(v, TUNE_SEEDS, ("p1",), [label])]) for v in LR_GRID]
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {lrs[label]} |")
        paper = [cell([load(s) for s in fedsum_specs(v, TUNE_SEEDS, ("p1",), ["FedAvg"])]) for v in PAPER_LR_GRID]
        return [*lines, f"\nThe shared η0 (the paper's protocol: every algorithm at FedAvg's choice): {shared_lr()}. "
                "FedAvg on the paper's own grid (the `paper-grid/` rows): "
                + "; ".join(f"η0 = {v}: {c}" for v, c in zip(PAPER_LR_GRID, paper, strict=True))
                + f"; chosen {paper_grid_lr()}.\n"]

    def fedadamom_grid() -> list[str]:
        rep.summary["fedadamom_choice"] = {}
        lines = ["| algorithm | knob | values: mean f(x) / mean test acc. (%) | chosen |", "|---|---|---|---|"]
        grid = fedadamom_specs()
        for label, (_fixed, key, grid_values) in FEDADAMOM_ALGORITHMS.items():
            chosen = rep.summary["fedadamom_choice"][label] = fedadamom_choice(label)
            knob = key.split(".")[-1]
            cells = [f"{v}: {cell([load(s) for s in grid if s['label'] == f'{label} {knob}={v}'])}"
                     for v in grid_values]
            lines.append(f"| {label} | {key} | " + "; ".join(cells) + f" | {chosen} |")
        return [*lines, ""]

    def fadamgc_grid() -> list[str]:
        lines = ["| variant | " + " | ".join(f"lr = {v}" for v in ADAM_LR_GRID) + " | chosen |",
                 "|---|" + "---|" * (len(ADAM_LR_GRID) + 1)]
        grid = fadamgc_specs()
        for label in FADAMGC_ALGORITHMS:
            rows = {v: [load(s) for s in grid if s["label"] == f"{label} lr={v}"] for v in ADAM_LR_GRID}
            lines.append(f"| {label} | " + " | ".join(cell(rows[v]) for v in ADAM_LR_GRID) + f" | {best(rows)} |")
        return [*lines, ""]

    for title, grid, table in (
            ("**The FedSUM comparison's η0** (P1, 100 rounds)", tune_specs(), fedsum_grid),
            ("**The FedAdamom comparison's server lr** (client lr for FedCAda and FAFED; Dirichlet 0.1, 60 rounds; "
             "Dirichlet 0.5 uses the same values)", fedadamom_specs(), fedadamom_grid),
            ("**FAdamGC's local lr** (P1, 100 rounds)", fadamgc_specs(), fadamgc_grid)):
        status = pending(grid)
        parts += [title + "\n", *([status + "\n"] if status else table())]
    rep.blocks["tuning"] = "\n".join(parts)


def fedsum_rows(specs: list[dict]) -> dict[str, dict[str, dict[int, dict]]]:
    """pattern -> label -> {seed: summary}."""
    out: dict = {p: {} for p in PATTERNS}
    for (p, label), runs in collect(specs, key=lambda s: (s["group"].split("/")[1], s["label"])).items():
        out[p][label] = runs
    return {p: {label: out[p][label] for label in FEDSUM_ALGORITHMS if label in out[p]} for p in PATTERNS}


def fedsum_section(rep: Report, name: str) -> dict | None:
    """The FedSUM comparison at each algorithm's own η0 (``tuned``), at the shared η0 (``shared``), or at
    FedAvg's choice on the paper's η0 grid (``paper_grid``)."""
    from fmnist_runs import tuned_specs

    make = {"tuned": tuned_specs, "shared": fedsum_specs, "paper_grid": paper_grid_specs}[name]
    specs, status = choose(make, tune_specs() if name != "paper_grid" else paper_grid_tune_specs())
    status = status or pending(specs)
    if status:
        rep.blocks[f"fedsum_{name}"] = status + "\n"
        return None
    rows = fedsum_rows(specs)
    lrs = {label: str(next(float(o.split("=")[1]) for o in s["overrides"] if o.startswith("local.lr=")))
           for s in specs for label in [s["label"]]}
    parts, data = [], {}
    for p in PATTERNS:
        text, data[p] = comparison_table(rows[p], ["FedSUM", "FedSUM-CR"], extra=lrs)
        parts += [f"**{p.upper()}**, round 100, seeds {SEEDS[0]}-{SEEDS[-1]}\n", text]
    rep.summary[f"fedsum_{name}"] = data
    rep.blocks[f"fedsum_{name}"] = "\n".join(parts)
    titles = {"tuned": "each at its own η0", "shared": "shared η0", "paper_grid": "η0 from the paper's grid"}
    plot_fedsum(rows, OUT / f"fedsum_{name}.png", titles[name])
    return rows if name == "tuned" else None


def total_floats(r: dict) -> np.ndarray:
    return np.asarray(r["eval_cum_uplink"], float) + np.asarray(r["eval_cum_downlink"], float)


def acc_at_budget(r: dict, budget: float) -> float | None:
    """Test accuracy after ``budget`` floats (up + down), interpolated linearly between the two evaluations
    around it (before the first: from chance at 0 floats); chance if the run diverged; None if it never
    spent that much."""
    if not r["finite"] or not r["test_accuracy"]:
        return CHANCE
    f = total_floats(r)
    if budget > f[-1] * (1 + 1e-12):
        return None
    return float(np.interp(budget, np.concatenate([[0.0], f]), np.concatenate([[CHANCE], r["test_accuracy"]])))


def budget_section(rep: Report, rows: dict | None) -> None:
    """Test accuracy at FedAvg's 100-round budget of floats (same seed), each algorithm at its own η0."""
    if rows is None:
        rep.blocks["budget"] = rep.blocks["fedsum_tuned"]
        return
    head = ["algorithm", "up / down floats per active client per round (d = 21,840)"]
    for p in PATTERNS:
        head += [f"{p.upper()} acc. (%) at FedAvg's budget", f"{p.upper()} Δ FedSUM-CR − it"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    at: dict = {p: {} for p in PATTERNS}
    for p in PATTERNS:
        base = rows[p]["FedAvg"]
        for label, runs in rows[p].items():
            at[p][label] = {s: acc_at_budget(r, float(total_floats(base[s])[-1])) for s, r in runs.items()
                            if s in base and base[s]["finite"]}
    comps: dict[str, Paired] = {}
    for label in FEDSUM_ALGORITHMS:
        r = next((r for p in PATTERNS for r in rows[p].get(label, {}).values() if r["finite"]), None)
        per = "–"
        if r is not None:
            active = float(np.sum(r["active_clients"]))
            up, down = (r[f"eval_cum_{w}link"][-1] / active / 21840 for w in ("up", "down"))
            per = f"{up:.2f} d / {down:.2f} d"
        cells = [label, per]
        for p in PATTERNS:
            cells.append(ms(at[p][label].values(), 100, 1))
            if label == "FedSUM-CR":
                cells.append("–")
                continue
            c = paired(at[p]["FedSUM-CR"], at[p][label])
            comps[f"{p.upper()}: FedSUM-CR − {label}"] = c
            cells.append(delta(c, 100, 1))
        lines.append("| " + " | ".join(cells) + " |")
    rep.blocks["budget"] = "\n".join(lines) + "\n"
    rep.summary["budget_accuracy"] = at


def cases_section(rep: Report) -> None:
    specs, status = choose(case_specs, tune_specs())
    status = status or pending(specs)
    ours, other = CASE_ALGORITHMS
    if status:
        rep.blocks["cases"] = status + "\n"
    else:
        runs = collect(specs, key=lambda s: (s["group"].split("/")[1], s["label"]))
        lines = [f"| case | {ours} acc. (%) | {other} acc. (%) | Δ acc. (pp) {ours} − {other} | {ours} f(x) | "
                 f"{other} f(x) | Δ f(x) {ours} − {other} |", "|---|---|---|---|---|---|---|"]
        comps, data = {}, {}
        for case in CASES:
            a, b = runs[(case.replace(" ", ""), ours)], runs[(case.replace(" ", ""), other)]
            pa, pf = compare(a, b, "test_accuracy"), compare(a, b, "train_objective")
            comps[case] = pa
            lines.append(f"| {case} | {acc_cell(a)} | {acc_cell(b)} | {delta(pa, 100, 1)} | "
                         f"{ms(values(a, 'train_objective').values(), 1, 3)} | "
                         f"{ms(values(b, 'train_objective').values(), 1, 3)} | {delta(pf, 1, 3)} |")
            data[case] = {"acc": pa.as_dict(), "f(x)": pf.as_dict()}
        biased = compare(runs[("Biased", ours)], runs[("Case1", ours)], "test_accuracy")
        lines += ["", f"{ours} under biased sampling − {ours} under Case 1 (same seed), test acc. (pp): "
                      f"{delta(biased, 100, 1)}"]
        data["biased - case1"] = biased.as_dict()
        rep.summary["cases"] = data
        rep.blocks["cases"] = "\n".join(lines) + "\n"
    specs, status = choose(case2p_specs, tune_specs())
    status = status or pending(specs)
    if status:
        rep.blocks["case2p"] = status + "\n"
        return
    sweep = collect(specs, key=lambda s: s["label"])
    lines = ["| p | mean active clients per round | test acc. (%) | f(x) | Δ acc. (pp) against the next smaller p | "
             "Δ f(x) against the next smaller p |", "|---|---|---|---|---|---|"]
    acc_steps, obj_steps, data = {}, {}, {}
    previous = None
    for p in CASE2_PROBABILITIES:
        rs = sweep[f"FedSUM p={p}"]
        active = np.mean([np.mean(r["active_clients"]) for r in rs.values() if r["finite"]])
        cells = ["–", "–"]
        if previous is not None:
            pa, pf = compare(rs, sweep[f"FedSUM p={previous}"], "test_accuracy"), compare(
                rs, sweep[f"FedSUM p={previous}"], "train_objective")
            acc_steps[f"p = {p} − {previous}"], obj_steps[f"p = {p} − {previous}"] = pa, pf
            cells = [delta(pa, 100, 1), delta(pf, 1, 3)]
            data[f"{p} - {previous}"] = {"acc": pa.as_dict(), "f(x)": pf.as_dict()}
        lines.append(f"| {p} | {active:.1f} | {acc_cell(rs)} | "
                     f"{ms(values(rs, 'train_objective').values(), 1, 3)} | " + " | ".join(cells) + " |")
        previous = p
    rep.summary["case2p"] = data
    rep.blocks["case2p"] = "\n".join(lines) + "\n"


def fadamgc_section(rep: Report, tuned: dict | None) -> None:
    specs = fadamgc_specs(choose=True)
    status = pending(fadamgc_specs()) or pending(specs) or (None if tuned else rep.blocks["fedsum_tuned"].strip())
    if status:
        rep.blocks["fadamgc"] = status + "\n"
        return
    rows = {label.split(" lr=")[0]: runs for label, runs in collect(specs, key=lambda s: s["label"]).items()}
    lrs = {label: s["label"].split("=")[1] for s in specs for label in [s["label"].split(" lr=")[0]]}
    lrs.update({label: str(tuned_lrs()[label]) for label in ("FedAvg", "SCAFFOLD")})
    rows.update({label: tuned["p1"][label] for label in ("FedAvg", "SCAFFOLD")})
    text, data = comparison_table(rows, ["FAdamGC"], extra=lrs, extra_name="lr (η0)")
    rep.summary["fadamgc"] = data
    rep.blocks["fadamgc"] = text


def fedadamom_section(rep: Report) -> None:
    for alpha in ALPHAS:
        specs = fedadamom_specs(True, (alpha,))
        status = pending(fedadamom_specs()) or pending(specs)
        if status:
            rep.blocks[f"fedadamom_{alpha}"] = status + "\n"
            continue
        rows = {label.split(" ")[0]: runs for label, runs in collect(specs, key=lambda s: s["label"]).items()}
        rows = dict(sorted(rows.items(), key=lambda kv: -np.mean(list(values(kv[1], "test_accuracy").values()))))
        chosen = {label: label_value for s in specs for label, label_value in [s["label"].split(" ")]}
        table, data = comparison_table(rows, ["FedAdamom"], extra=chosen, extra_name="chosen value")
        rep.summary[f"fedadamom_{alpha}"] = data
        rep.blocks[f"fedadamom_{alpha}"] = table
        if alpha == ALPHAS[0]:
            plot_fedadamom(OUT / "fedadamom.png")
    specs = ablation_specs()
    status = pending(specs)
    if status:
        rep.blocks["beta2"] = status + "\n"
        return
    rows = {f"β2 = {label.split('=')[1]}": runs for label, runs in collect(specs, key=lambda s: s["label"]).items()}
    table, data = comparison_table(rows, ["β2 = 0.05"])
    rep.summary["beta2"] = data
    rep.blocks["beta2"] = table


def flatness_section(rep: Report, key: str = "flatness", methods: tuple[str, ...] = FLATNESS_METHODS) -> None:
    """Top Hessian eigenvalue, loss increase at each rho, training loss and test accuracy of the FedAdamom
    comparison's models measured in ``OUT / key`` (``flatness``: the final models; ``flatness_same_loss``:
    the models at each seed's common training loss, with the round each reached it), and FedAdamom − each
    other method, seed-paired."""
    folder = OUT / key
    rows: dict[str, dict[int, dict]] = {}
    for path in sorted(folder.glob("**/*.json")) if folder.is_dir() else []:
        r = json.loads(path.read_text())
        rows.setdefault(r["label"].split(" ")[0], {})[int(r["seed"])] = r
    done = sum(len(rows.get(m, {})) for m in methods)
    if done < len(methods) * N:
        status = f"pending: {done} of {len(methods) * N} measurements finished"
        rep.blocks[key] = status + "\n"
        return
    rows = {m: rows[m] for m in methods}
    rhos = next(iter(rows["FedAdamom"].values()))["rho"]
    same_loss = "target_loss" in next(iter(rows["FedAdamom"].values()))  # measured at a common loss: show the round

    def get(runs: dict[int, dict], key: str, i: int | None = None) -> dict[int, float | None]:
        return {s: (r[key] if i is None else r[key][i]) for s, r in runs.items()}

    # the loss increases are of order 1e-3 (their spread over directions larger than their mean): shown in
    # units of 1e-3 so that the table keeps their digits
    head = ["method", *(["round"] if same_loss else []), "train loss", "top eigenvalue"]
    head += [f"loss increase (1e-3), ρ = {rho}" for rho in rhos] + ["test acc. (%)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m, runs in rows.items():
        cells = [m, *([ms(get(runs, "round").values(), 1, 1)] if same_loss else []),
                 ms(get(runs, "train_loss").values(), 1, 3), ms(get(runs, "top_eigenvalue").values(), 1, 2)]
        cells += [ms(get(runs, "loss_increase", i).values(), 1e3, 2) for i in range(len(rhos))]
        cells.append(ms(get(runs, "test_accuracy").values(), 100, 1))
        lines.append("| " + " | ".join(cells) + " |")
    head = ["FedAdamom − it", "Δ top eigenvalue"] + [f"Δ loss increase (1e-3), ρ = {rho}" for rho in rhos]
    head += ["Δ test acc. (pp)"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    data: dict = {}
    ours = rows["FedAdamom"]
    for m, runs in rows.items():
        if m == "FedAdamom":
            continue
        eig = paired(get(ours, "top_eigenvalue"), get(runs, "top_eigenvalue"), higher_is_better=False)
        inc = [paired(get(ours, "loss_increase", i), get(runs, "loss_increase", i), higher_is_better=False)
               for i in range(len(rhos))]
        acc = paired(get(ours, "test_accuracy"), get(runs, "test_accuracy"))
        lines.append(f"| {m} | {delta(eig, 1, 2)} | " + " | ".join(delta(p, 1e3, 2) for p in inc)
                     + f" | {delta(acc, 100, 1)} |")
        data[m] = {"top_eigenvalue": eig.as_dict(), "loss_increase": [p.as_dict() for p in inc],
                   "test_accuracy": acc.as_dict()}
    rep.summary[key] = data
    rep.blocks[key] = "\n".join(lines) + "\n"


def paper_section(rep: Report, tuned: dict | None) -> None:
    """FedSUM, FedSUM-CR, MIFA and FedAvg at the paper's settings (one seed) beside the N = 20 ordering."""
    specs = paper_specs()
    status = pending(specs)
    cfg = yaml.safe_load(PAPER_BASE.read_text())
    scale = (f"N = {cfg['data']['num_clients']}, S = {cfg['participation']['clients_per_round']} (P2, P3: the same "
             f"rate), K = {cfg['local']['steps']}, batch {cfg['local']['batch_size']}, η0 = {cfg['local']['lr']}, "
             f"{cfg['run']['rounds']} rounds, seed 0 (`{PAPER_BASE.relative_to(REPO)}`)")
    if status:
        rep.blocks["paper"] = f"Scale: {scale}.\n\n{status}\n"
        return
    runs = {(s["group"], s["label"]): load(s) for s in specs}
    lines = [f"Scale: {scale}.\n", "| pattern | algorithm | final test acc. (%) | best test acc. (%) | f(x) | "
             "rank here | rank at N = 20 (own η0, mean of 10 seeds) |", "|---|---|---|---|---|---|---|"]
    data: dict = {}
    for p in PATTERNS:
        here = {a: runs[(p, a)] for a in PAPER_ALGORITHMS}
        rank = sorted(PAPER_ALGORITHMS, key=lambda a: -metric(here[a], "test_accuracy"))
        small = sorted(PAPER_ALGORITHMS, key=lambda a: -np.mean(list(values(tuned[p][a], "test_accuracy").values()))
                       ) if tuned else None
        for a in PAPER_ALGORITHMS:
            obj = metric(here[a], "train_objective")
            lines.append(f"| {p.upper()} | {a} | {100 * metric(here[a], 'test_accuracy'):.1f} | "
                         f"{100 * metric(here[a], 'best_accuracy'):.1f} | {'–' if obj is None else f'{obj:.3f}'} | "
                         f"{rank.index(a) + 1} | {small.index(a) + 1 if small else 'pending'} |")
        data[p] = {"ordering": rank, "ordering_n20": small,
                   **{a: {k: metric(here[a], k) for k in ("test_accuracy", "best_accuracy", "train_objective")}
                      for a in PAPER_ALGORITHMS}}
        lines.append(f"| {p.upper()} | ordering | {' > '.join(rank)} | | | | "
                     f"{' > '.join(small) if small else 'pending'} |")
    rep.summary["fedsum_paper"] = data
    rep.blocks["paper"] = "\n".join(lines) + "\n"
    plot_fedsum({p: {a: {0: runs[(p, a)]} for a in PAPER_ALGORITHMS} for p in PATTERNS}, OUT / "paper.png",
                "paper settings, seed 0", PAPER_ALGORITHMS)


def probe_section(rep: Report) -> None:
    """The reconstruction probe: each reading of FedSUM's server step against MIFA, seed-paired, under P2
    and P3 (N = 20 at the shared η0; N = 100 with the N = 20 recipe). An arm whose runs are not all
    finished gets a pending row."""
    specs, status = choose(probe_specs, tune_specs())
    if status:
        rep.blocks["probe"] = f"{status} (`python experiments/fmnist.py probe`)\n"
        return
    lr = shared_lr()
    lines = ["| pattern | arm | reading of the paper | FedSUM arm acc. (%) | MIFA acc. (%) | Δ acc. (pp) arm − MIFA |",
             "|---|---|---|---|---|---|"]
    readings = {"FedSUM": "x −= η_g η_l K y/N, stale step in an empty round (the page's reconstruction)",
                "FedSUM no-K": "x −= η_l y/N (no K in the server step: global_lr = 1/K)",
                "FedSUM skip-empty": "no server step in a round without clients",
                "FedSUM N=100": "the reconstruction at N = 100 with the N = 20 recipe (MIFA at N = 100 too)"}
    data: dict = {}
    for p in PROBE_PATTERNS:
        base = fedsum_specs(lr, patterns=(p,), labels=["FedSUM", "MIFA"])
        mifa = [s for s in base if s["label"] == "MIFA"]
        arms = {"FedSUM": ([s for s in base if s["label"] == "FedSUM"], mifa),
                **{label: ([s for s in specs if s["group"] == f"probe/{p}" and s["label"] == label], mifa)
                   for label in PROBE_ARMS},
                "FedSUM N=100": tuple([s for s in specs if s["group"] == f"probe/{p}" and s["label"] == f"{a} N=100"]
                                      for a in ("FedSUM", "MIFA"))}
        for label, (sa, sb) in arms.items():
            waiting = pending(sa) or pending(sb)
            if waiting:
                lines.append(f"| {p.upper()} | {label} | {readings[label]} | {waiting} | | |")
                continue
            a, b = (collect(x, key=lambda s: 0)[0] for x in (sa, sb))
            c = compare(a, b, "test_accuracy")
            data[f"{p}/{label}"] = c.as_dict()
            lines.append(f"| {p.upper()} | {label} | {readings[label]} | {acc_cell(a)} | {acc_cell(b)} | "
                         f"{delta(c, 100, 1)} |")
    rep.summary["probe"] = data
    rep.blocks["probe"] = "\n".join(lines) + "\n"


def escape_section(rep: Report) -> None:
    """The momentum-neutrality row, from docs/results/escape_rate/momentum_neutrality.json."""
    path = REPO / "docs" / "results" / "escape_rate" / "momentum_neutrality.json"
    if not path.is_file():
        rep.blocks["neutrality"] = "pending: run experiments/momentum_neutrality.py\n"
        return
    r = json.loads(path.read_text())
    (a, va), (b, vb) = r["variants"].items()
    ratio = r["ratio"]
    word = "reproduces" if ratio["neutral"] else "does not reproduce"
    rep.blocks["neutrality"] = (
        "| paper's claim | here | where |\n|---|---|---|\n"
        f"| FedAdamom: FedAvgM's escape depends on η/(1−β) only (momentum neutrality) | **{word}** at k = {r['k']:g}: "
        f"{a} escapes at {va['rate']:.2e} ({va['ci95'][0]:.2e}–{va['ci95'][1]:.2e}) per round, {b} at "
        f"{vb['rate']:.2e} ({vb['ci95'][0]:.2e}–{vb['ci95'][1]:.2e}); ratio {ratio['value']:.2f} "
        f"({ratio['ci95'][0]:.2f}–{ratio['ci95'][1]:.2f}), {r['particles']} particles each | "
        "`docs/results/escape_rate/momentum_neutrality.json` |\n")


def diagnosis_section(rep: Report) -> None:
    diag = OUT / "diagnosis.json"
    if not diag.is_file():
        rep.blocks["diagnosis"] = "pending: run `python experiments/fmnist.py diagnose`\n"
        return
    d = json.loads(diag.read_text())
    rep.summary["diagnosis"] = d
    lines = ["| run (full participation, seed 0, 50 rounds) | test acc. (%) at round 25 / 50 | f(x) |", "|---|---|---|"]
    for label, r in d["full"].items():
        obj = "–" if r["train_objective"] is None else f"{r['train_objective']:.3f}"
        lines.append(f"| {label} | {' / '.join(f'{100 * a:.1f}' for a in r['test_accuracy'])} | {obj} |")
    for label, rows in d["direction_error"].items():
        if not rows:
            continue
        cos = np.array([r["cos_pre"] for r in rows])
        after = np.array([r["cos_post"] for r in rows])
        rose = sum(r["f_post"] > r["f_pre"] for r in rows)
        lines += ["", f"{label} under P1 (seed 0, {len(rows)} checkpoints): cosine of y/N with ∇f where the step is "
                      f"taken, median {np.median(cos):.2f} ({cos.min():.2f} to {cos.max():.2f}); after the step "
                      f"negative at {int((after < 0).sum())} of {len(rows)}; f rose over the step at {rose} of "
                      f"{len(rows)}."]
    rep.blocks["diagnosis"] = "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------------------- plots


def _smooth(y, w: int) -> np.ndarray:
    y = np.asarray([np.nan if v is None else v for v in y], dtype=float)
    ok = np.isfinite(y)
    total = np.convolve(np.where(ok, y, 0.0), np.ones(w), mode="valid")
    count = np.convolve(ok.astype(float), np.ones(w), mode="valid")
    return np.divide(total, count, out=np.full_like(total, np.nan), where=count > 0)


def plot_fedsum(rows: dict, path: Path, title: str, algorithms: Collection[str] = FEDSUM_ALGORITHMS) -> None:
    """Per pattern: test accuracy against rounds and against floats communicated, the local minibatch loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(3, len(PATTERNS), figsize=(5.2 * len(PATTERNS), 12), squeeze=False)
    colors = plt.get_cmap("tab10")
    several = any(len(seeds) > 1 for p in PATTERNS for seeds in rows[p].values())
    for j, p in enumerate(PATTERNS):
        for k, label in enumerate(algorithms):
            rs = [r for r in rows[p].get(label, {}).values() if r["finite"]]
            if not rs:
                continue
            style, c = ("-" if label.startswith("FedSUM") else "--"), colors(k % 10)
            acc = np.stack([r["test_accuracy"] for r in rs]) * 100
            axes[0, j].plot(rs[0]["eval_rounds"], acc.mean(0), style, color=c, marker="o", ms=3)
            axes[1, j].plot(np.stack([total_floats(r) for r in rs]).mean(0), acc.mean(0), style, color=c, marker="o",
                            ms=3)
            loss = np.stack([_smooth(r["train_loss"], 10) for r in rs]).mean(0)
            axes[2, j].plot(np.arange(len(loss)) + 10, loss, style, color=c, lw=1)
        axes[0, j].set_title(f"{title}: {p.upper()}")
        axes[0, j].set_xlabel("round")
        axes[0, j].set_ylabel("test accuracy (%)" + (", mean over the seeds that did not diverge" if several else ""))
        axes[1, j].set_xlabel("floats communicated, up + down, all clients")
        axes[1, j].set_ylabel("test accuracy (%)")
        axes[1, j].set_xscale("log")
        axes[2, j].set_xlabel("round")
        axes[2, j].set_ylabel("loss on active clients' minibatches\n(during local steps, 10-round mean)")
        axes[2, j].set_yscale("log")
        for row in range(3):
            axes[row, j].grid(alpha=0.3)
    handles = [Line2D([], [], color=colors(k % 10), ls="-" if label.startswith("FedSUM") else "--", label=label)
               for k, label in enumerate(algorithms)]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=70)
    plt.close(fig)


def plot_fedadamom(path: Path) -> None:
    """Test accuracy and local minibatch loss against rounds, every method at its chosen value, per alpha."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(ALPHAS), figsize=(6 * len(ALPHAS), 8), squeeze=False)
    colors = plt.get_cmap("tab10")
    for j, alpha in enumerate(ALPHAS):
        runs = collect(fedadamom_specs(True, (alpha,)), key=lambda s: s["label"])
        for k, (label, seeds) in enumerate(sorted(runs.items())):
            rs = [r for r in seeds.values() if r["finite"]]
            if not rs:
                continue
            style = "-" if label.startswith("FedAdamom") else "--"
            acc = np.stack([r["test_accuracy"] for r in rs]) * 100
            axes[0, j].plot(rs[0]["eval_rounds"], acc.mean(0), style, color=colors(k % 10), label=label, marker="o",
                            ms=3)
            loss = np.stack([_smooth(r["train_loss"], 10) for r in rs]).mean(0)
            axes[1, j].plot(np.arange(len(loss)) + 10, loss, style, color=colors(k % 10), label=label, lw=1)
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


# ---------------------------------------------------------------------------------------------- report

BLOCKS = ("claims", "neutrality", "tuning", "fedsum_tuned", "fedsum_shared", "fedsum_paper_grid", "budget",
          "diagnosis", "cases", "case2p", "fadamgc", "fedadamom_0.1", "fedadamom_0.5", "beta2", "flatness",
          "flatness_same_loss", "paper", "probe")
PLOTS = {"fedsum_tuned": "FedSUM comparison, each at its own eta_0", "fedsum_shared": "FedSUM comparison, shared eta_0",
         "fedsum_paper_grid": "FedSUM comparison, eta_0 from the paper's grid",
         "fedadamom": "FedAdamom comparison", "paper": "FedSUM at its paper's settings, seed 0",
         }  # written by their sections once all their runs are finished
MARK = re.compile(r"(<!-- tables\.md: ([\w.]+) -->\n)(.*?)(<!-- end \2 -->)", re.S)


def fill_page(blocks: dict[str, str], page: Path = PAGE) -> list[str]:
    """Copy every block into ``page`` between its markers; returns the names the page has markers for."""
    text = page.read_text()
    found = [m.group(2) for m in MARK.finditer(text)]
    missing = [name for name in found if name not in blocks]
    if missing:
        raise SystemExit(f"{page}: markers name unknown table blocks {missing} (known: {sorted(blocks)})")
    page.write_text(MARK.sub(lambda m: m.group(1) + "\n" + blocks[m.group(2)].strip() + "\n\n" + m.group(4), text))
    return found


def report() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rep = Report()
    tuning(rep)
    tuned = fedsum_section(rep, "tuned")
    fedsum_section(rep, "shared")
    fedsum_section(rep, "paper_grid")
    budget_section(rep, tuned)
    diagnosis_section(rep)
    cases_section(rep)
    fadamgc_section(rep, tuned)
    fedadamom_section(rep)
    flatness_section(rep)
    flatness_section(rep, "flatness_same_loss", SAME_LOSS_LABELS)
    paper_section(rep, tuned)
    probe_section(rep)
    escape_section(rep)
    entries = claims.build(page_claims())
    claims.write(entries)  # the page's verdicts are rendered from the file, read back
    rep.blocks["claims"] = claims.render(json.loads(claims.CLAIMS.read_text()))
    (OUT / "tables.md").write_text("".join(f"<!-- {name} -->\n{rep.blocks[name].strip()}\n\n" for name in BLOCKS))
    (OUT / "summary.json").write_text(json.dumps(rep.summary, indent=1) + "\n")
    page = dict(rep.blocks)  # the plots only on the page (tables.md lives elsewhere: its links would differ)
    for name, title in PLOTS.items():
        png = OUT / f"{name}.png"
        page[f"plot_{name}"] = (f"![{title}]({png.relative_to(PAGE.parent)})" if png.is_file()
                                else "(the plot is drawn once every run of its section has finished)")
    found = fill_page(page)
    print((OUT / "tables.md").read_text())
    print(f"copied {len(found)} table blocks into {PAGE.relative_to(REPO)}")


# -------------------------------------------------------------------------------------------- diagnose


def diagnose() -> None:
    """Why FedSUM trails, at the shared eta_0 and on seed 0 (one seed is enough for a diagnosis): (1) full
    participation for 50 rounds (no absent clients, so no h_i older than one round) for FedSUM and FedAvg,
    and FedSUM at eta_0 = 0.06 and 0.1 (its server step eta_0 K = 0.3 and 0.5); (2) in the P1 run, the
    relative error of FedSUM's direction y/N against the gradient of f at the same x, every 10 rounds."""
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
