"""Analysis of a finished escape-rate run (docs/results.md, "Escape rate"): why the fitted exponents are
what they are.

    python experiments/escape_analysis.py docs/results/escape_rate/escape_rate.json

Writes ``analysis.json`` next to the input and prints a markdown table. For each optimizer:

* ``all``: the fit of L = -log(rate) = a + b k^(-p) over every usable k (the protocol's pass criteria);
* ``prefactor``: the same fit of L + q log k, q the exponent of the Kramers prefactor (rate ~ k^q e^(-E)):
  q = 1 for FedAvgM / FedAdamom (the curvatures at the minimum and the saddle both scale with k),
  q = 1/2 for FedAdam (its preconditioned curvature scales with sqrt(k));
* ``cold``: the prefactor-corrected fit over the colder half of the grid, k <= 2 (E(k) >= 3.5 for FedAvgM);
* ``power_law``: the least-squares line L = a - c log k and its correlation (rate ~ k^c);
* ``forms``: two-parameter fits L = a + b z(k) - q log k of the candidate laws (Kramers in 1/k with the
  prefactor k, in 1/sqrt(k) with the prefactor sqrt(k), either without a prefactor, and the power law),
  with b and the root-mean-square residual: which law describes the measured curve best;
* ``burn_in``: per k, the escapes before the burn-in and the particles still in the well at T_max
  (censored), each beside its count if the post-burn-in rate Gamma had held from round 0:
  P (1 - e^(-Gamma t_burn)) and (P - early) e^(-Gamma (T_max - t_burn)) (the rounds from
  ``escape_rounds.npz`` next to the input);
* for FedAvgM, the leading-order Kramers prediction L(k) = E(1)/k - log(3.43 lambda k) with
  lambda = eta eta_l K / (1 - beta), E(1) = target_exponent, with no fitted constant.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
from escape_rate import PREFACTOR, fit_exponent, fit_interval, verdict


def analyse(path: Path) -> dict:
    run = json.loads(path.read_text())
    cfg, out = run["config"], {}
    rounds = np.load(path.parent / "escape_rounds.npz")
    for o, r in run["results"].items():
        k = np.asarray(r["k"])
        ml = np.asarray(r["minus_log_rate"])
        ci = np.asarray(r["ci95"])
        use = np.asarray(r["usable"])
        q = PREFACTOR[o]
        res = {}
        for name, mask, shift in (("all", use, 0.0), ("prefactor", use, q), ("cold", use & (k <= 2.0), q)):
            if mask.sum() < 3:
                continue
            y = ml[mask] + shift * np.log(k[mask])
            fit = fit_exponent(k[mask], y)
            fit["interval"] = fit_interval(k[mask], y, ci[mask, 0], ci[mask, 1])
            fit["passes"] = verdict(o, fit)
            fit["ks"] = k[mask].tolist()
            res[name] = fit
        logk = np.log(k[use])
        slope, intercept = np.polyfit(logk, ml[use], 1)
        res["power_law"] = {"c": float(-slope), "a": float(intercept),
                            "r": float(abs(np.corrcoef(logk, ml[use])[0, 1]))}
        forms = {"1/k - log k": (1 / k, 1.0), "1/sqrt(k) - 0.5 log k": (1 / np.sqrt(k), 0.5),
                 "1/k": (1 / k, 0.0), "1/sqrt(k)": (1 / np.sqrt(k), 0.0), "power law (log k)": (np.log(k), 0.0)}
        res["forms"] = {}
        for name, (z, q_form) in forms.items():
            y = ml[use] + q_form * np.log(k[use])
            design = np.stack([np.ones(use.sum()), z[use]], axis=1)
            coef, *_ = np.linalg.lstsq(design, y, rcond=None)
            rms = float(np.sqrt(((design @ coef - y) ** 2).mean()))
            res["forms"][name] = {"a": float(coef[0]), "b": float(coef[1]), "rms": rms}
        hits, gam = rounds[o], np.asarray(r["rate"])
        early = ((hits >= 0) & (hits < cfg["burn_in"])).sum(axis=1)
        res["burn_in"] = {"k": r["k"], "early": early.tolist(),
                          "expected_early": (hits.shape[1] * -np.expm1(-gam * cfg["burn_in"])).tolist(),
                          "censored": (hits == cfg["max_rounds"]).sum(axis=1).tolist(),
                          "expected_censored": ((hits.shape[1] - early)
                                                * np.exp(-gam * (cfg["max_rounds"] - cfg["burn_in"]))).tolist()}
        if o == "fedavgm":
            hp = run["hparams"][o]
            lam = hp["global_lr"] * cfg["local_lr"] * cfg["local_steps"] / (1 - hp["beta"])
            pred = cfg["target_exponent"] / k - np.log(3.43 * lam * k)
            res["kramers"] = {"lambda": lam, "predicted": pred.tolist(), "measured": ml.tolist(),
                              "difference": (ml - pred).tolist()}
        out[o] = res
    return out


def table(res: dict) -> str:
    lines = ["| optimizer | fit | k used | p̂ (95% interval) | r(1/k) | r(1/sqrt k) | passes |",
             "|---|---|---|---|---|---|---|"]
    for o, r in res.items():
        for name in ("all", "prefactor", "cold"):
            if name not in r:
                continue
            f = r[name]
            lo, hi = f["interval"]["p"]
            ks = f"{min(f['ks']):g}–{max(f['ks']):g}"
            lines.append(f"| {o} | {name} | {ks} | {f['p']:.2f} ({lo:.2f}–{hi:.2f}) | {f['r_inv_k']:.4f} | "
                         f"{f['r_inv_sqrt_k']:.4f} | {'yes' if f['passes'] else 'no'} |")
    lines.append("")
    lines.append("| optimizer | power law: rate ~ k^c, c | r(log k) |")
    lines.append("|---|---|---|")
    for o, r in res.items():
        lines.append(f"| {o} | {r['power_law']['c']:.2f} | {r['power_law']['r']:.4f} |")
    names = list(next(iter(res.values()))["forms"])
    lines += ["", "| optimizer | " + " | ".join(f"L = a + b·{n}: b, rms" for n in names) + " |",
              "|---|" + "---|" * len(names)]
    for o, r in res.items():
        lines.append(f"| {o} | " + " | ".join(f"{r['forms'][n]['b']:.2f}, {r['forms'][n]['rms']:.3f}" for n in names)
                     + " |")
    lines += ["", "| optimizer | k | escapes before the burn-in | expected at the post-burn-in rate | "
              "censored at T_max | expected |", "|---|---|---|---|---|---|"]
    for o, r in res.items():
        b = r["burn_in"]
        for i, k in enumerate(b["k"]):
            lines.append(f"| {o} | {k:g} | {b['early'][i]} | {b['expected_early'][i]:.0f} | {b['censored'][i]} | "
                         f"{b['expected_censored'][i]:.0f} |")
    if "fedavgm" in res and "kramers" in res["fedavgm"]:
        kr = res["fedavgm"]["kramers"]
        lines.append("")
        lines.append("FedAvgM against the Kramers prediction (no fitted constant): " + ", ".join(
            f"{m:.2f} vs {p:.2f}" for m, p in zip(kr["measured"], kr["predicted"], strict=True)
            if math.isfinite(m)))
    return "\n".join(lines) + "\n"


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/results/escape_rate/escape_rate.json")
    res = analyse(path)
    (path.parent / "analysis.json").write_text(json.dumps(res, indent=1) + "\n")
    text = table(res)
    (path.parent / "analysis.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
