"""The claims file of the results page: one entry per paper claim the page judges, evaluated from the run
files it names, Holm-adjusted over the page's family, and rendered as the page's verdict tables.

A claim is stated by a ``ClaimSpec`` (experiments/fmnist_claims.py lists the page's): the seed paper's
file name and its sentence verbatim, the conditions the sentence states and those of the runs here, every
deviation between them, the kind of claim, the metric (a key of the run files) and round, and the two
lists of run files a and b, paired by index (the same seed at the same index; paths from the repository
root). ``evaluate`` reads the files and adds:

* ``statistic`` "mean difference": delta = mean_s (a_s - b_s), ci95 its t-interval, p_wilcoxon the
  two-sided signed-rank p (experiments/stats.py ``paired``);
* ``statistic`` "sd ratio" (stability: spread over seeds): delta = sd(a) / sd(b), ci95 a paired percentile
  bootstrap (``sd_ratio``), no p-value;
* p_holm: Holm's step-down adjustment over every entry of the file that has a p-value (``stats.holm``);
* verdict, from the interval alone, against 0 (difference) or 1 (ratio): ``greater`` reproduces when the
  interval lies above, ``less`` when it lies below, does not reproduce when it lies wholly on the other
  side; with a ``margin`` they are non-inferiority claims, judged against -margin (greater: a - b > -margin)
  or +margin (less); ``equivalent`` (a claim of no effect, with ``margin``) reproduces when the interval
  lies inside (-margin, +margin) and does not reproduce when it lies wholly outside it; otherwise
  inconclusive.

Every value is in the run files' units (accuracy in [0, 1]); ``scale`` says how the page shows them (100:
points). A run that diverged (``finite`` false) counts as chance accuracy and has no loss: its seed drops
out of loss comparisons. A claim whose run files are not all there yet is not in the file: the page lists
it as "not yet run" with the command that runs it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from stats import holm, paired, sd_ratio

REPO = Path(__file__).resolve().parents[1]
CLAIMS = REPO / "docs" / "results" / "claims.json"
CHANCE = 0.1  # ten classes: the accuracy a diverged run counts as
COLLAPSED = 0.12  # a finite run whose final accuracy is at most this has collapsed to chance
ACCURACY = ("test_accuracy", "budget_accuracy")
REPRODUCES, DOES_NOT, INCONCLUSIVE = "reproduces", "does not reproduce", "inconclusive"
FIELDS = ("id", "seed", "quote", "stated", "run", "deviations", "kind", "margin", "statistic", "metric", "round",
          "a", "b", "scale", "delta", "ci95", "p_wilcoxon", "p_holm", "verdict")


@dataclass(frozen=True)
class ClaimSpec:
    """A claim before its numbers: everything of an entry but delta, ci95, the p-values and the verdict."""

    id: str
    seed: str
    quote: str
    stated: str
    run: str
    deviations: tuple[str, ...]
    kind: str  # greater | less | equivalent
    metric: str
    round: int | str  # an evaluation round, or "final"
    a: tuple[str, ...]
    b: tuple[str, ...]
    scale: float = 1.0
    margin: float | None = None  # equivalence / non-inferiority margin, in the metric's units
    statistic: str = "mean difference"  # or "sd ratio"
    command: str = ""  # what runs the files (shown while they are missing)

    def missing(self) -> list[str]:
        return [p for p in (*self.a, *self.b) if not (REPO / p).is_file()]


def load(path: str) -> dict:
    return json.loads((REPO / path).read_text())


def value(r: dict, metric: str, rnd: int | str, budget: float | None = None) -> float | None:
    """A run file's ``metric`` at ``rnd``: a list is an evaluation curve (indexed by ``eval_rounds``; "final"
    is its last point), a number is the run's final value. A diverged run (``finite`` false) has chance
    accuracy and no other value. ``budget_accuracy`` is test accuracy after ``budget`` floats (up + down),
    interpolated between the evaluations around it (from chance at 0 floats)."""
    if not r.get("finite", True):
        return CHANCE if metric in ACCURACY else None
    if metric == "budget_accuracy":
        floats = np.asarray(r["eval_cum_uplink"], float) + np.asarray(r["eval_cum_downlink"], float)
        if budget is None or budget > floats[-1] * (1 + 1e-12):
            return None
        return float(np.interp(budget, np.concatenate([[0.0], floats]), [CHANCE, *r["test_accuracy"]]))
    v = r[metric]
    if isinstance(v, list):
        return v[-1] if rnd == "final" else v[r["eval_rounds"].index(rnd)]
    if rnd != "final":
        raise ValueError(f"{metric} is a final value; round must be 'final', not {rnd}")
    return v


def final_floats(r: dict) -> float:
    """The floats a run communicated in all (up + down); a diverged run has no curve: infinity."""
    if not r.get("finite", True) or not r.get("eval_cum_uplink"):
        return float("inf")
    return float(r["eval_cum_uplink"][-1] + r["eval_cum_downlink"][-1])


def collapsed(r: dict) -> bool:
    """A run whose model stayed finite but whose final test accuracy is at chance."""
    return bool(r.get("finite", True) and r.get("test_accuracy") and r["test_accuracy"][-1] <= COLLAPSED)


def judge(kind: str, ci: Sequence[float], null: float = 0.0, margin: float | None = None) -> str:
    """The verdict word from the 95% interval alone (module docstring)."""
    lo, hi = ci
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return INCONCLUSIVE
    if kind == "equivalent":
        if margin is None:
            raise ValueError("an equivalence claim needs its margin")
        if null - margin < lo and hi < null + margin:
            return REPRODUCES
        return DOES_NOT if lo >= null + margin or hi <= null - margin else INCONCLUSIVE
    sign = {"greater": 1, "less": -1}[kind]
    null -= sign * (margin or 0.0)  # non-inferiority: a - b > -margin (greater), < +margin (less)
    lo, hi = sorted((sign * (lo - null), sign * (hi - null)))
    return REPRODUCES if lo > 0 else DOES_NOT if hi < 0 else INCONCLUSIVE


def evaluate(spec: ClaimSpec) -> dict:
    """The entry of ``spec`` (without p_holm, which needs the whole family)."""
    ra, rb = [load(p) for p in spec.a], [load(p) for p in spec.b]
    if spec.metric == "budget_accuracy":  # both at the float count both runs reached
        budgets = [min(final_floats(x), final_floats(y)) for x, y in zip(ra, rb, strict=True)]
        va = [value(r, spec.metric, spec.round, f) for r, f in zip(ra, budgets, strict=True)]
        vb = [value(r, spec.metric, spec.round, f) for r, f in zip(rb, budgets, strict=True)]
    else:
        va = [value(r, spec.metric, spec.round) for r in ra]
        vb = [value(r, spec.metric, spec.round) for r in rb]
    a, b = dict(enumerate(va)), dict(enumerate(vb))
    if spec.statistic == "sd ratio":
        s = sd_ratio(a, b)
        delta, ci, p, null = s.ratio, s.ci, None, 1.0
    else:
        c = paired(a, b)
        delta, ci, p, null = c.mean, c.ci, c.wilcoxon_p, 0.0
    entry = {k: getattr(spec, k) for k in FIELDS if hasattr(spec, k)}
    entry.update(a=list(spec.a), b=list(spec.b), deviations=list(spec.deviations), delta=_num(delta),
                 ci95=[_num(ci[0]), _num(ci[1])], p_wilcoxon=_num(p), p_holm=None,
                 verdict=judge(spec.kind, ci, null, spec.margin))
    return {k: entry[k] for k in FIELDS}


def _num(v: float | None) -> float | None:
    return None if v is None or not np.isfinite(v) else float(v)


def build(specs: Sequence[ClaimSpec]) -> tuple[list[dict], list[ClaimSpec]]:
    """(the entries of every claim whose files are all there, Holm-adjusted together; the claims not run yet)."""
    ready = [s for s in specs if not s.missing()]
    entries = [evaluate(s) for s in ready]
    for e, p in zip(entries, holm([e["p_wilcoxon"] for e in entries]), strict=True):
        e["p_holm"] = p
    return entries, [s for s in specs if s.missing()]


def write(entries: list[dict], path: Path = CLAIMS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)


# ------------------------------------------------------------------------------------------- rendering


def _cell(e: dict) -> str:
    s = e["scale"]
    digits = 1 if s == 100 else 2 if e["statistic"] == "sd ratio" else 3
    if e["delta"] is None:
        return "–"
    lo, hi = (("–" if v is None else f"{s * v:+.{digits}f}") for v in e["ci95"])
    if e["statistic"] == "sd ratio":
        lo, hi = (("–" if v is None else f"{v:.{digits}f}") for v in e["ci95"])
        return f"{e['delta']:.{digits}f} ({lo}, {hi})"
    return f"{s * e['delta']:+.{digits}f} ({lo}, {hi})"


def _p(v: float | None) -> str:
    return "–" if v is None else f"{v:.2g}"


def _expect(e: dict) -> str:
    if e["kind"] == "equivalent":
        return f"within ±{e['scale'] * e['margin']:g}"
    if e["margin"] is not None:  # non-inferiority
        return f"Δ > −{e['scale'] * e['margin']:g}" if e["kind"] == "greater" else f"Δ < +{e['scale'] * e['margin']:g}"
    if e["statistic"] == "sd ratio":
        return "ratio < 1" if e["kind"] == "less" else "ratio > 1"
    return "Δ > 0" if e["kind"] == "greater" else "Δ < 0"


def render(entries: list[dict], pending: Sequence[ClaimSpec] = ()) -> str:
    """The page's verdict tables: per seed sentence (in the file's order) the conditions stated and run,
    the deviations, and one row per entry; then a count of the verdicts, then the claims not run yet."""
    groups: dict[str, list[dict]] = {}
    for e in entries:
        groups.setdefault(e["quote"], []).append(e)
    out = [f"{len(entries)} entries in `docs/results/claims.json`; "
           f"{sum(e['p_wilcoxon'] is not None for e in entries)} with a Wilcoxon p, Holm-adjusted together. "
           "Δ is a − b (sd ratio: sd(a)/sd(b) over the seeds) with its 95% interval; the verdict is read "
           "from the interval alone.\n",
           "| claim (id prefix) | entries | reproduces | does not reproduce | inconclusive |", "|---|---|---|---|---|"]
    prefixes: dict[str, list[dict]] = {}
    for e in entries:
        prefixes.setdefault(e["id"].split("/")[0], []).append(e)
    for name, rows in [*prefixes.items(), ("**all**", entries)]:
        counts = " | ".join(str(sum(e["verdict"] == w for e in rows)) for w in (REPRODUCES, DOES_NOT, INCONCLUSIVE))
        out.append(f"| {name} | {len(rows)} | {counts} |")
    for quote, rows in groups.items():
        first = rows[0]
        out += ["", f"> {quote}", "", f"*{first['seed']}*. Stated: {first['stated']}. Run: {first['run']}.",
                "Deviations: " + "; ".join(first["deviations"]) + ".", "",
                "| id | metric, round | claimed | Δ (95% interval) | Wilcoxon p | Holm p | verdict |",
                "|---|---|---|---|---|---|---|"]
        for e in rows:
            unit = " (pp)" if e["scale"] == 100 and e["statistic"] != "sd ratio" else ""
            out.append(f"| {e['id']} | {e['metric']}{unit}, {e['round']} | {_expect(e)} | {_cell(e)} | "
                       f"{_p(e['p_wilcoxon'])} | {_p(e['p_holm'])} | **{e['verdict']}** |")
    if pending:
        out += ["", "**Not yet run** (no verdict until their run files exist):", "",
                "| claims | files missing | command |", "|---|---|---|"]
        by_command: dict[str, list[ClaimSpec]] = {}
        for s in pending:
            by_command.setdefault(s.command, []).append(s)
        for command, specs in by_command.items():
            missing = len({p for s in specs for p in s.missing()})
            ids = ", ".join(dict.fromkeys(s.id.split("/")[0] for s in specs)) + f" ({len(specs)} entries)"
            out.append(f"| {ids} | {missing} | `{command}` |")
    return "\n".join(out) + "\n"
