"""Momentum neutrality in the escape-rate experiment: FedAvg (server lr 1) against FedAvgM(0.1, 0.9).

    python experiments/momentum_neutrality.py --config experiments/escape_rate.yaml \\
        --out docs/results/escape_rate/momentum_neutrality.json

The FedAdamom paper's analysis puts FedAvgM's escape exponent in eta / (1 - beta) alone, so FedAvgM with
eta = 0.1, beta = 0.9 should escape as fast as FedAvg with server lr 1 (the same effective step). Both run
the escape-rate protocol of experiments/escape_rate.py (its config; every other setting unchanged) at one
sharpness k (default 2) with ``particles`` particles each; the rates are escapes per particle-round after
the burn-in with Poisson 95% intervals (escape_rate.rate), and the ratio FedAvg / FedAvgM gets the exact
conditional interval: given n_1 + n_2 escapes, n_1 is binomial with success probability
pi = r_1 E_1 / (r_1 E_1 + r_2 E_2) (E the exposures), so the Clopper-Pearson interval of pi
(scipy.stats.binomtest) maps to the ratio r_1 / r_2 = pi / (1 - pi) * E_2 / E_1. Neutrality holds where
that interval contains 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from escape_rate import first_passage, load, rate
from scipy.stats import binomtest

from fedrun.errors import ConfigError

VARIANTS = {"FedAvg (server lr 1)": {"global_lr": 1.0, "beta": 0.0},
            "FedAvgM(0.1, 0.9)": {"global_lr": 0.1, "beta": 0.9}}


def rate_ratio(n1: int, e1: float, n2: int, e2: float) -> tuple[float, float, float]:
    """(r1 / r2, lo, hi): the ratio of two Poisson rates n / E and its exact 95% conditional interval."""
    ci = binomtest(n1, n1 + n2).proportion_ci(0.95, method="exact")
    scale = e2 / e1

    def odds(p: float) -> float:
        return p / (1 - p) * scale if p < 1 else float("inf")

    return (n1 / e1) / (n2 / e2), odds(ci.low), odds(ci.high)


def measure(config: str | None, overrides: list[str], k: float, particles: int, max_rounds: int) -> dict:
    cfg = load(config, [*overrides, f"ks=[{k}]", f"particles={particles}", f"max_rounds={max_rounds}",
                        "optimizers=[fedavgm]"])
    cfg.check()
    out: dict = {"k": k, "particles": particles, "max_rounds": max_rounds, "burn_in": cfg.burn_in,
                 "seed": cfg.seed, "config": config, "overrides": overrides, "variants": {}}
    start = time.time()
    for label, hp in VARIANTS.items():
        cfg.fedavgm = hp
        hits = first_passage(cfg)["fedavgm"][0]
        g, n, lo, hi = rate(hits, cfg.max_rounds, cfg.burn_in)
        out["variants"][label] = {"hparams": hp, "rate": g, "ci95": [lo, hi], "escapes": n,
                                  "exposure": n / g if g > 0 else 0.0,
                                  "early_escapes": int(((hits >= 0) & (hits < cfg.burn_in)).sum()),
                                  "censored": int((hits == cfg.max_rounds).sum()), "diverged": int((hits < 0).sum())}
    a, b = (out["variants"][label] for label in VARIANTS)
    ratio, lo, hi = rate_ratio(a["escapes"], a["exposure"], b["escapes"], b["exposure"])
    out["ratio"] = {"of": " / ".join(VARIANTS), "value": ratio, "ci95": [lo, hi], "neutral": lo <= 1 <= hi}
    out["wall_s"] = round(time.time() - start, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="an escape-rate config (experiments/escape_rate.yaml)")
    parser.add_argument("--out", default="runs/escape_rate/momentum_neutrality.json")
    parser.add_argument("--k", type=float, default=2.0)
    parser.add_argument("--particles", type=int, default=2000)
    parser.add_argument("--max-rounds", type=int, default=20_000)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        result = measure(args.config, args.overrides, args.k, args.particles, args.max_rounds)
    except ConfigError as exc:  # bad input: one line, exit 2, nothing written
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for label, v in result["variants"].items():
        print(f"{label}: rate {v['rate']:.3g} per round ({v['ci95'][0]:.3g}-{v['ci95'][1]:.3g}), "
              f"{v['escapes']} escapes, {v['censored']} censored")
    r = result["ratio"]
    print(f"ratio {r['of']}: {r['value']:.2f} ({r['ci95'][0]:.2f}-{r['ci95'][1]:.2f}); neutral: {r['neutral']} "
          f"({result['wall_s']} s)")


if __name__ == "__main__":
    main()
