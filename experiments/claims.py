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

Beyond the interval, three rules (the page states them):

* the opponent rule: an entry that names an ``opponent`` (the method b stands for) is **not evidence**
  when that opponent diverged or collapsed in any seed, or when its seed-paired mean final test accuracy
  is more than ``OPPONENT_MARGIN`` below FedAvg's in the same runs (``reference``): a win over a baseline
  that failed in that setting says nothing about the claim. ``interval_verdict`` keeps the interval's
  word and ``reason`` says which part of the rule applied;
* ``role``: "confirmatory" (the claim as planned), "probe" (an arm that reads a reconstructed rule
  another way), "exploratory" (an analysis added after seeing a result: its verdict is not a test), or
  "not run" (a claim the runs here cannot test, with the ``reason``; no numbers);
* ``power`` (entries with a margin): the sd of the seed differences and the seeds an interval needs to
  fit inside the margin with 80% probability when the true difference is 0:
  n >= ((t_{0.975, n-1} + t_{q, n-1}) sd / margin)^2, q = 0.90 (equivalence, both sides) or 0.80
  (non-inferiority); ``margin_basis`` says how the margin was set (every margin here is post hoc).

Statistics beyond the two above: "difference of differences" (an interaction: delta = mean_s
[(a_s - b_s) - (c_s - d_s)], with its t-interval and signed-rank p), and "exact ratio" (a count that does
not vary by seed, e.g. floats per active client per round: delta the mean of the per-seed ratios a_s /
b_s, ci95 their range, judged against ``null``). Metrics computed from the stored curves:
``within_run_change`` (mean |ln l_t - ln l_{t-1}| of the training loss l over the run's second half),
and ``rounds_to_accuracy`` (per seed, the first round each run reaches the test accuracy both runs reach
by their end, the lower of the two final ones, on the curve interpolated between evaluations from chance
at round 0).

Every value is in the run files' units (accuracy in [0, 1]); ``scale`` says how the page shows them (100:
points). A run that diverged (``finite`` false) counts as chance accuracy and has no loss: its seed drops
out of loss comparisons. A claim whose run files are not all there yet is in the file as "pending" (its
run files and the ``command`` that runs them, no numbers); the page lists it under "not yet run".
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
NOT_EVIDENCE, NOT_RUN, PENDING = "not evidence", "not run", "pending"
VERDICTS = (REPRODUCES, DOES_NOT, INCONCLUSIVE, NOT_EVIDENCE, NOT_RUN, PENDING)
# an opponent whose mean final accuracy trails FedAvg's in the same runs by more than this is no fair
# opponent; set in the fifth round with the results on the page (post hoc), like the margins
OPPONENT_MARGIN = 0.05
FIELDS = ("id", "seed", "quote", "stated", "run", "deviations", "kind", "margin", "statistic", "metric", "round",
          "a", "b", "scale", "delta", "ci95", "p_wilcoxon", "p_holm", "verdict",
          "role", "interval_verdict", "reason", "opponent", "power", "margin_basis", "null", "c", "d",
          "measured_rounds", "command")


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
    statistic: str = "mean difference"  # or "sd ratio", "difference of differences", "exact ratio"
    command: str = ""  # what runs the files (every entry carries it; the page shows it while they are missing)
    role: str = "confirmatory"  # | probe | exploratory | not run
    opponent: str = ""  # the method b stands for, where the opponent rule applies
    reference: tuple[str, ...] = ()  # FedAvg's run files in the same setting (the opponent rule)
    margin_basis: str | None = None
    null: float | None = None  # default 0 (a difference) or 1 (a ratio)
    c: tuple[str, ...] = ()  # the second pair of an interaction
    d: tuple[str, ...] = ()
    reason: str = ""  # why a "not run" claim is not run, or why a pending one has not run yet

    def missing(self) -> list[str]:
        return [p for p in (*self.a, *self.b, *self.c, *self.d, *self.reference) if not (REPO / p).is_file()]


def load(path: str) -> dict:
    return json.loads((REPO / path).read_text())


def value(r: dict, metric: str, rnd: int | str, budget: float | None = None) -> float | None:
    """A run file's ``metric`` at ``rnd``: a list is an evaluation curve (indexed by ``eval_rounds``; "final"
    is its last point), a number is the run's final value. A diverged run (``finite`` false) has chance
    accuracy and no other value. ``budget_accuracy`` is test accuracy after ``budget`` floats (up + down),
    interpolated between the evaluations around it (from chance at 0 floats)."""
    if not r.get("finite", True):
        return CHANCE if metric in ACCURACY else None
    if metric == "within_run_change":
        loss = np.log(np.asarray(r["train_loss"], float))
        half = loss[len(loss) // 2 - 1:]
        return float(np.mean(np.abs(np.diff(half)))) if np.all(np.isfinite(half)) else None
    if metric in ("uplink_per_client", "downlink_per_client", "floats_per_client"):
        return floats_per_client(r, metric.split("_")[0])
    if metric == "budget_accuracy":
        floats = np.asarray(r["eval_cum_uplink"], float) + np.asarray(r["eval_cum_downlink"], float)
        if budget is None or budget > floats[-1] * (1 + 1e-12):
            return None
        return float(np.interp(budget, np.concatenate([[0.0], floats]), [CHANCE, *r["test_accuracy"]]))
    v = r[metric]
    if isinstance(v, list):
        return v[-1] if rnd == "final" else v[r["eval_rounds"].index(rnd)]
    if not isinstance(rnd, str):  # a label ("final", "common loss") names the one value a file holds
        raise ValueError(f"{metric} is a final value; round must be 'final', not {rnd}")
    return v


def final_floats(r: dict) -> float:
    """The floats a run communicated in all (up + down); a diverged run has no curve: infinity."""
    if not r.get("finite", True) or not r.get("eval_cum_uplink"):
        return float("inf")
    return float(r["eval_cum_uplink"][-1] + r["eval_cum_downlink"][-1])


def floats_per_client(r: dict, which: str) -> float | None:
    """Floats per active client per round, over the whole run (uplink, downlink or both)."""
    if not r.get("eval_cum_uplink"):
        return None
    up, down = r["eval_cum_uplink"][-1], r["eval_cum_downlink"][-1]
    return {"uplink": up, "downlink": down, "floats": up + down}[which] / float(np.sum(r["active_clients"]))


def accuracy_curve(r: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """(rounds, test accuracy) from chance at round 0 through every evaluation; None if the run diverged."""
    if not r.get("finite", True) or not r.get("test_accuracy"):
        return None
    return np.asarray([0, *r["eval_rounds"]], float), np.asarray([CHANCE, *r["test_accuracy"]], float)


def rounds_to_target(ra: dict, rb: dict) -> tuple[float | None, float | None]:
    """The rounds each of two runs (the same seed) takes to reach the test accuracy both reach by their end,
    the lower of the two final ones: the first crossing of each curve interpolated linearly between its
    evaluations (from chance at round 0). A diverged run never reaches it: the seed has no value."""
    ca, cb = accuracy_curve(ra), accuracy_curve(rb)
    if ca is None or cb is None:
        return None, None
    target = min(ca[1][-1], cb[1][-1])

    def first(rounds: np.ndarray, acc: np.ndarray) -> float:
        j = int(np.argmax(acc >= target))  # acc[j - 1] < target <= acc[j]
        if j == 0:  # a target at or below chance (a collapsed run): reached at the start
            return 0.0
        return float(rounds[j] - (acc[j] - target) / (acc[j] - acc[j - 1]) * (rounds[j] - rounds[j - 1]))

    return first(*ca), first(*cb)


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


def _values(spec: ClaimSpec, ra: list[dict], rb: list[dict]) -> tuple[list, list]:
    """Per seed index, the metric of a and of b (pairwise metrics need both runs of the seed)."""
    if spec.metric == "budget_accuracy":  # both at the float count both runs reached
        budgets = [min(final_floats(x), final_floats(y)) for x, y in zip(ra, rb, strict=True)]
        return ([value(r, spec.metric, spec.round, f) for r, f in zip(ra, budgets, strict=True)],
                [value(r, spec.metric, spec.round, f) for r, f in zip(rb, budgets, strict=True)])
    if spec.metric == "rounds_to_accuracy":
        pairs = [rounds_to_target(x, y) for x, y in zip(ra, rb, strict=True)]
        return [p[0] for p in pairs], [p[1] for p in pairs]
    return [value(r, spec.metric, spec.round) for r in ra], [value(r, spec.metric, spec.round) for r in rb]


def power(kind: str, differences: Sequence[float], margin: float) -> dict:
    """The seeds a margin needs: the smallest n with (t_{0.975,n-1} + t_{q,n-1}) sd / sqrt(n) <= margin,
    q = 0.90 for equivalence (both one-sided tests at once) and 0.80 for non-inferiority: 80% power when
    the true difference is 0 and the sd is the one observed (module docstring)."""
    from scipy.stats import t

    sd = float(np.std(differences, ddof=1))
    q = 0.90 if kind == "equivalent" else 0.80
    n = 2
    while n < 100_000 and (t.ppf(0.975, n - 1) + t.ppf(q, n - 1)) * sd / np.sqrt(n) > margin:
        n += 1
    return {"sd_of_differences": sd, "seeds_needed": n, "seeds_run": len(differences),
            "half_width": float(t.ppf(0.975, len(differences) - 1) * sd / np.sqrt(len(differences)))}


def fairness(spec: ClaimSpec, rb: list[dict]) -> tuple[dict, str | None]:
    """The opponent rule (module docstring): the opponent's record and, when it fails, the reason."""
    bad = sum(not r.get("finite", True) for r in rb)
    flat = sum(collapsed(r) for r in rb)
    gap = None
    if spec.reference:
        ref = [load(p) for p in spec.reference]
        gap = paired(dict(enumerate(value(r, "test_accuracy", "final") for r in rb)),
                     dict(enumerate(value(r, "test_accuracy", "final") for r in ref))).mean
    record = {"name": spec.opponent, "seeds": len(rb), "diverged": bad, "collapsed": flat,
              "mean_gap_to_fedavg": _num(gap), "fair": True}
    reasons = []
    if bad or flat:
        reasons.append(f"{spec.opponent} diverged in {bad} and collapsed in {flat} of {len(rb)} seeds")
    if gap is not None and gap < -OPPONENT_MARGIN:
        reasons.append(f"{spec.opponent}'s final test accuracy trails FedAvg's in the same runs by "
                       f"{-100 * gap:.1f} points (more than {100 * OPPONENT_MARGIN:g})")
    record["fair"] = not reasons
    return record, ("; ".join(reasons) or None)


def evaluate(spec: ClaimSpec) -> dict:
    """The entry of ``spec`` (without p_holm, which needs the whole family)."""
    entry = {k: getattr(spec, k) for k in FIELDS if hasattr(spec, k)}
    entry.update(a=list(spec.a), b=list(spec.b), c=list(spec.c), d=list(spec.d), deviations=list(spec.deviations),
                 delta=None, ci95=[None, None], p_wilcoxon=None, p_holm=None, interval_verdict=None,
                 reason=None, opponent=None, power=None, measured_rounds=None, verdict=None)
    if spec.role == NOT_RUN or spec.missing():  # no runs possible here, or its run files not there yet
        entry.update(verdict=NOT_RUN if spec.role == NOT_RUN else PENDING, reason=spec.reason or None)
        return {k: entry[k] for k in FIELDS}
    if spec.metric.startswith("escape_"):
        return {k: entry[k] for k in FIELDS} | escape_entry(spec)
    ra, rb = [load(p) for p in spec.a], [load(p) for p in spec.b]
    va, vb = _values(spec, ra, rb)
    a, b = dict(enumerate(va)), dict(enumerate(vb))
    p, diffs = None, []
    if spec.statistic == "sd ratio":
        s = sd_ratio(a, b)
        delta, ci, null = s.ratio, s.ci, 1.0
    elif spec.statistic == "exact ratio":
        ratios = [x / y for x, y in zip(va, vb, strict=True) if x is not None and y is not None]
        delta, ci, null = float(np.mean(ratios)), (min(ratios), max(ratios)), 1.0
    else:
        if spec.statistic == "difference of differences":
            vc, vd = _values(spec, [load(x) for x in spec.c], [load(x) for x in spec.d])
            a = {i: None if x is None or y is None else x - y for i, (x, y) in enumerate(zip(va, vb, strict=True))}
            b = {i: None if x is None or y is None else x - y for i, (x, y) in enumerate(zip(vc, vd, strict=True))}
        c = paired(a, b)
        delta, ci, p, null, diffs = c.mean, c.ci, c.wilcoxon_p, 0.0, c.differences
    null = spec.null if spec.null is not None else null
    word = judge(spec.kind, ci, null, spec.margin)
    entry.update(delta=_num(delta), ci95=[_num(ci[0]), _num(ci[1])], p_wilcoxon=_num(p), null=null,
                 interval_verdict=word, verdict=word)
    if spec.margin is not None and len(diffs) >= 2:
        entry["power"] = power(spec.kind, diffs, spec.margin)
    if all("round" in r and "target_loss" in r for r in (*ra, *rb)):  # measured at a common loss
        entry["measured_rounds"] = {"a": [r["round"] for r in ra], "b": [r["round"] for r in rb]}
    if spec.opponent:
        entry["opponent"], why = fairness(spec, rb)
        if why:
            entry.update(verdict=NOT_EVIDENCE, reason=why)
    return {k: entry[k] for k in FIELDS}


def escape_entry(spec: ClaimSpec) -> dict:
    """An escape-rate entry, from the experiment's own files and its pre-set criteria:
    ``escape_exponent`` (analysis.json, ``round`` names the optimizer): delta the fitted exponent p of
    -log Gamma = a + b k^(-p) with its bootstrap interval, reproduces when the protocol's fit passes its
    criteria (docs/results.md states them); ``escape_ratio`` (momentum_neutrality.json): delta the ratio of
    the two escape rates, judged against 1 with its interval (neutral: the interval holds 1)."""
    r = load(spec.a[0])
    if spec.metric == "escape_exponent":
        fit = r[str(spec.round)]["all"]
        word = REPRODUCES if fit["passes"] else DOES_NOT
        return {"delta": fit["p"], "ci95": list(fit["interval"]["p"]), "interval_verdict": word, "verdict": word}
    ratio = r["ratio"]
    word = REPRODUCES if ratio["neutral"] else DOES_NOT
    return {"delta": ratio["value"], "ci95": list(ratio["ci95"]), "null": 1.0, "interval_verdict": word,
            "verdict": word}


def _num(v: float | None) -> float | None:
    return None if v is None or not np.isfinite(v) else float(v)


def build(specs: Sequence[ClaimSpec]) -> list[dict]:
    """The entry of every claim, Holm-adjusted together; a claim whose run files are not all there yet is
    "pending" (its files and the command that runs them, no numbers)."""
    entries = [evaluate(s) for s in specs]
    for e, p in zip(entries, holm([e["p_wilcoxon"] for e in entries]), strict=True):
        e["p_holm"] = p
    return entries


def write(entries: list[dict], path: Path = CLAIMS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n")
    tmp.replace(path)


# ------------------------------------------------------------------------------------------- rendering


def _cell(e: dict) -> str:
    if e["delta"] is None:
        return "–"
    s = e["scale"]
    ratio = e["statistic"] in ("sd ratio", "exact ratio") or e["metric"].startswith("escape_")
    digits = 1 if s == 100 and not ratio else 2 if ratio or e["metric"].startswith("rounds_to") else 3
    if ratio:
        lo, hi = (("–" if v is None else f"{v:.{digits}f}") for v in e["ci95"])
        return f"{e['delta']:.{digits}f} ({lo}, {hi})"
    lo, hi = (("–" if v is None else f"{s * v:+.{digits}f}") for v in e["ci95"])
    return f"{s * e['delta']:+.{digits}f} ({lo}, {hi})"


def _p(v: float | None) -> str:
    return "–" if v is None else f"{v:.2g}"


def _expect(e: dict) -> str:
    if e["verdict"] == NOT_RUN:
        return "–"
    if e["metric"] == "escape_exponent":
        return "the protocol's criteria"
    if e["metric"] == "escape_ratio":
        return "interval holds 1"
    null = e["null"] if e["null"] is not None else 0
    sym = "ratio" if e["statistic"] in ("sd ratio", "exact ratio") or e["metric"] == "escape_ratio" else "Δ"
    if e["kind"] == "equivalent":
        half = f"{e['scale'] * e['margin']:g}"
        return f"{sym} within {null:g} ± {half}" if null else f"within ±{half}"
    if e["margin"] is not None:  # non-inferiority
        return f"Δ > −{e['scale'] * e['margin']:g}" if e["kind"] == "greater" else f"Δ < +{e['scale'] * e['margin']:g}"
    return f"{sym} {'>' if e['kind'] == 'greater' else '<'} {null:g}"


def _own(e: dict, common: Sequence[str]) -> str:
    """What a row says beyond its group's header: its role, its own deviations, its opponent's record,
    the reason for its verdict, the power of its margin and the rounds it was measured at."""
    parts = [] if e["role"] == "confirmatory" else [f"*{e['role']}*"]
    parts += [d for d in e["deviations"] if d not in common]
    o = e["opponent"]
    if o:
        gap = "" if o["mean_gap_to_fedavg"] is None else f", {100 * o['mean_gap_to_fedavg']:+.1f} pts vs FedAvg"
        parts.append(f"opponent {o['name']}: {o['diverged']}/{o['seeds']} diverged{gap}")
    if e["reason"]:
        parts.append(f"**{e['verdict']}**: {e['reason']}" if e["verdict"] in (NOT_EVIDENCE, NOT_RUN) else e["reason"])
    if e["verdict"] == NOT_EVIDENCE:
        parts.append(f"the interval alone: {e['interval_verdict']}")
    if e["power"]:
        parts.append(f"sd of the differences {e['scale'] * e['power']['sd_of_differences']:.1f}: the margin needs "
                     f"{e['power']['seeds_needed']} seeds for 80% power (run: {e['power']['seeds_run']})")
    if e["margin_basis"]:
        parts.append(e["margin_basis"])
    if e["measured_rounds"]:
        ra, rb = (", ".join(map(str, e["measured_rounds"][k])) for k in ("a", "b"))
        rounds = [*e["measured_rounds"]["a"], *e["measured_rounds"]["b"]]
        parts.append(f"measured at rounds {min(rounds)}-{max(rounds)} (a: {ra}; b: {rb})")
    return "; ".join(parts).replace("|", "/")


def summary(entries: list[dict]) -> list[str]:
    """The count of every verdict, and per claim (id prefix) where the hits and the misses are (out of the
    entries judged: pending ones left out)."""
    counts = {w: sum(e["verdict"] == w for e in entries) for w in VERDICTS}
    out = ["**Summary.** " + ", ".join(f"{n} {w}" for w, n in counts.items()) + f" of {len(entries)} entries "
           f"({sum(e['role'] == 'probe' for e in entries)} probe and "
           f"{sum(e['role'] == 'exploratory' for e in entries)} exploratory entries among them).", ""]
    judged = [e for e in entries if e["verdict"] != PENDING]
    prefixes: dict[str, list[dict]] = {}
    for e in judged:
        prefixes.setdefault(e["id"].split("/")[0], []).append(e)
    for word, name in ((REPRODUCES, "Reproduced"), (DOES_NOT, "Not reproduced (the interval lies wholly on the "
                                                                "wrong side)"),
                       (NOT_EVIDENCE, "Not evidence (the opponent failed in that setting)")):
        hits = [f"{k} {sum(e['verdict'] == word for e in rows)}/{len(rows)}" for k, rows in prefixes.items()
                if any(e["verdict"] == word for e in rows)]
        out.append(f"- {name}: " + (", ".join(hits) if hits else "none") + ".")
    against: dict[str, list[dict]] = {}
    for e in judged:
        if e["opponent"] and e["role"] == "confirmatory":
            against.setdefault(e["opponent"]["name"], []).append(e)
    out.append("- By opponent (confirmatory rows: reproduces / does not reproduce / inconclusive / not evidence): "
               + "; ".join(f"{name} " + "/".join(str(sum(e["verdict"] == w for e in rows)) for w in VERDICTS[:4])
                           for name, rows in against.items()) + ".")
    return out


def render(entries: list[dict]) -> str:
    """The page's verdict tables: a summary and a count of the verdicts per claim; then per seed sentence
    (in the file's order), per stated conditions and run under it and per claim (id prefix), the
    deviations every row of that group shares and one row per entry with what is its own (role,
    deviations, opponent, reason, power); then the claims not run yet."""
    m = sum(e["p_wilcoxon"] is not None for e in entries)
    out = [f"{len(entries)} entries in `docs/results/claims.json`; {m} with a Wilcoxon p, Holm-adjusted "
           f"together (with ten seeds the smallest signed-rank p is 2/1024, so the smallest Holm p possible is "
           f"{m} × 2/1024 = {m * 2 / 1024:.2f}). Δ is a − b (a ratio: a/b) with its 95% interval; the verdict "
           f"is read from the interval, then the opponent rule.\n", *summary(entries), "",
           "| claim (id prefix) | entries | " + " | ".join(VERDICTS) + " |", "|---|---|" + "---|" * len(VERDICTS)]
    prefixes: dict[str, list[dict]] = {}
    for e in entries:
        prefixes.setdefault(e["id"].split("/")[0], []).append(e)
    for name, rows in [*prefixes.items(), ("**all**", entries)]:
        out.append(f"| {name} | {len(rows)} | " + " | ".join(str(sum(e["verdict"] == w for e in rows))
                                                            for w in VERDICTS) + " |")
    groups: dict[str, dict[tuple[str, str, str], list[dict]]] = {}  # quote -> (stated, run, claim) -> rows
    for e in (e for e in entries if e["verdict"] != PENDING):
        groups.setdefault(e["quote"], {}).setdefault((e["stated"], e["run"], e["id"].split("/")[0]), []).append(e)
    for quote, parts in groups.items():
        out += ["", f"> {quote}", "", f"*{next(iter(parts.values()))[0]['seed']}*."]
        conditions = None
        for (stated, run, claim), rows in parts.items():
            common = [d for d in rows[0]["deviations"] if all(d in e["deviations"] for e in rows)]
            if (stated, run) != conditions:
                out += ["", f"Stated: {stated}. Run: {run}."]
                conditions = (stated, run)
            out += ["", f"`{claim}`: deviations of every row below: "
                    + ("; ".join(common) if common else "none beyond each row's own") + ".", "",
                    "| id | metric, round | claimed | Δ (95% interval) | Wilcoxon p | Holm p | verdict | "
                    "this row's own |", "|---|---|---|---|---|---|---|---|"]
            for e in rows:
                unit = " (pp)" if e["scale"] == 100 and "difference" in e["statistic"] else ""
                out.append(f"| {e['id']} | {e['metric']}{unit}, {e['round']} | {_expect(e)} | {_cell(e)} | "
                           f"{_p(e['p_wilcoxon'])} | {_p(e['p_holm'])} | **{e['verdict']}** | {_own(e, common)} |")
    pending = [e for e in entries if e["verdict"] == PENDING]
    if pending:
        out += ["", "**Not yet run** (entries of the claims file with the verdict \"pending\": no numbers until "
                "their run files exist):", "", "| claims | files missing | why | command |", "|---|---|---|---|"]
        by_command: dict[str, list[dict]] = {}
        for e in pending:
            by_command.setdefault(e["command"], []).append(e)
        for command, rows in by_command.items():
            files = {p for e in rows for p in (*e["a"], *e["b"], *e["c"], *e["d"])}
            missing = sum(not (REPO / p).is_file() for p in files)
            ids = ", ".join(dict.fromkeys(e["id"].split("/")[0] for e in rows)) + f" ({len(rows)} entries)"
            why = "; ".join(dict.fromkeys(e["reason"] for e in rows if e["reason"]))
            out.append(f"| {ids} | {missing} | {why} | `{command}` |")
    return "\n".join(out) + "\n"
