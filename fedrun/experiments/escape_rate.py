"""The escape-rate experiment of ALGORITHMS-BASELINES.md section 4 (protocol RECONSTRUCTED there, 4.3).

    python -m fedrun.experiments.escape_rate --config experiments/escape_rate.yaml [--out DIR] [key=value ...]

Particles start in the local minimum l of F_k(x) = ST(sqrt(k) x) (Styblinski-Tang, d = 2 by default;
coordinate 1 at u_l, the others at u_g). Each round s clients with the same objective run K local SGD
steps with Hessian-proportional noise g = grad F_k(y) + sigma sqrt(h) xi (h = k diag(ST'') at the start,
held constant) and the server applies FedAvgM, FedAdam or FedAdamom to the mean update. A particle has
escaped when sqrt(k) x_1 < u_s; the rate is events per particle-round after a burn-in (right-censored
exponential model). It prints and plots -log(rate) against 1/k and 1/sqrt(k) with the fitted exponent p
of L = a + b k^(-p) and the Pearson correlations.

The server rules are fedrun's (fedrun.algorithms.fedopt / fedadamom) written over a particle axis:
tests/test_escape_rate.py checks them against the algorithms' ``server_update`` particle by particle.
Everything is vectorised over (optimizer, k, particle, client); no MPI. Deterministic in ``seed``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fedrun.config import apply_override, build_dataclass

U_G, U_L, U_S = -2.9035340, 2.7468028, 0.1567313  # global min, local min, saddle of ST per coordinate
ST_G, ST_L, ST_S = -39.16616570, -25.02944666, 0.19561236


@dataclass
class EscapeConfig:
    """Defaults: section 4.3, scaled to run in about a minute on one core (see the docs)."""

    seed: int = 0
    dim: int = 2
    ks: list[float] = field(default_factory=lambda: [1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0])
    particles: int = 200  # P per (optimizer, k)
    max_rounds: int = 3000  # T_max (censoring)
    burn_in: int = 20  # t_burn
    clients: int = 5  # s sampled per round (identical objectives, heterogeneity off)
    local_steps: int = 5  # K
    local_lr: float = 2e-3  # eta_l; stability: eta_l K k_max 57 < 2
    sigma2: float | None = None  # noise level; null: from the target exponent below
    target_exponent: float = 4.5  # E(1) of FedAvgM's Kramers estimate, sets sigma2 when it is null
    optimizers: list[str] = field(default_factory=lambda: ["fedavgm", "fedadam", "fedadamom"])
    fedavgm: Any = field(default_factory=lambda: {"global_lr": 0.1, "beta": 0.9})
    fedadam: Any = field(default_factory=lambda: {"global_lr": 0.3, "beta1": 0.9, "beta2": 0.99,
                                                                 "tau": 1e-3})
    fedadamom: Any = field(default_factory=lambda: {"global_lr": 1.0, "beta2": 0.1, "eps": 1e-3})
    min_escapes: int = 50  # a k value is usable only with at least this many escapes

    def check(self) -> None:
        pass


def st(u: np.ndarray) -> np.ndarray:
    return 0.5 * (u ** 4 - 16 * u ** 2 + 5 * u)


def st_grad(u: np.ndarray) -> np.ndarray:
    return 2 * u ** 3 - 16 * u + 2.5


def st_hess(u: np.ndarray) -> np.ndarray:
    return 6 * u ** 2 - 16


def grad_fk(x: np.ndarray, k: np.ndarray) -> np.ndarray:
    """grad of F_k(x) = ST(sqrt(k) x); ``k`` broadcasts against x."""
    r = np.sqrt(k)
    return r * st_grad(r * x)


# ----------------------------------------------------------------------- server rules over particles


def server_init(name: str, shape: tuple[int, ...], hp: dict[str, float]) -> dict[str, np.ndarray]:
    zeros = np.zeros(shape)
    if name == "fedavgm":
        return {"m": zeros.copy()}
    if name == "fedadam":  # v_init zero (Flower / FedAdamom code; the spec's FedAdam has no bias correction)
        return {"m": zeros.copy(), "v": zeros.copy()}
    return {"m": zeros.copy(), "v": zeros.copy()}


def server_step(name: str, x: np.ndarray, s: dict[str, np.ndarray], delta: np.ndarray,
                hp: dict[str, float]) -> np.ndarray:
    """One server step on the mean update ``delta`` [..., d]; updates ``s`` in place, returns the new x."""
    if name == "fedavgm":  # ALGORITHMS.md 4.2
        s["m"] = hp["beta"] * s["m"] + delta
        return x + hp["global_lr"] * s["m"]
    if name == "fedadam":  # 4.1, no bias correction
        s["m"] = hp["beta1"] * s["m"] + (1 - hp["beta1"]) * delta
        s["v"] = hp["beta2"] * s["v"] + (1 - hp["beta2"]) * delta * delta
        return x + hp["global_lr"] * s["m"] / (np.sqrt(s["v"]) + hp["tau"])
    if name == "fedadamom":  # 4.3: beta1 = clip(1 - v / mean_coords(v), 0, 1 - eps)
        s["v"] = hp["beta2"] * s["v"] + (1 - hp["beta2"]) * delta * delta
        vbar = s["v"].mean(axis=-1, keepdims=True)
        safe = np.where(vbar > 0, vbar, 1.0)
        beta1 = np.where(vbar > 0, np.clip(1 - s["v"] / safe, 0.0, 1.0 - hp["eps"]), 0.0)
        s["m"] = beta1 * s["m"] + (1 - beta1) * delta
        return x + hp["global_lr"] * s["m"]
    raise ValueError(f"unknown optimizer {name!r}")


# ----------------------------------------------------------------------------------- simulation


def sigma2_for(cfg: EscapeConfig) -> float:
    """sigma^2 = 2 s Delta_f / (eta_l H_l E(1)) (4.3 step 8, FedAvgM with eta / (1 - beta) = 1)."""
    if cfg.sigma2 is not None:
        return cfg.sigma2
    delta_f = ST_S - ST_L
    return 2 * cfg.clients * delta_f / (cfg.local_lr * float(st_hess(np.array(U_L))) * cfg.target_exponent)


def start_point(cfg: EscapeConfig, k: float) -> np.ndarray:
    u = np.full(cfg.dim, U_G)
    u[0] = U_L
    return u / math.sqrt(k)


def first_passage(cfg: EscapeConfig, optimizers: list[str] | None = None, sigma2: float | None = None,
                  progress: bool = False) -> dict[str, np.ndarray]:
    """Escape round per (optimizer, k, particle): the round t (0-based) after whose server step
    sqrt(k) x_1 < u_s; ``max_rounds`` if censored, -1 if diverged. Same noise draws for every optimizer.
    With ``progress``, a line on stderr every 5% of ``max_rounds``."""
    optimizers = optimizers or cfg.optimizers
    sig2 = sigma2_for(cfg) if sigma2 is None else sigma2
    ks = np.asarray(cfg.ks, dtype=np.float64)
    n_k, p, d, c = len(ks), cfg.particles, cfg.dim, cfg.clients
    kk = ks[:, None, None]  # [n_k, 1, 1] against [n_k, P, d]
    h = ks[:, None] * st_hess(start_point(cfg, 1.0))[None, :]  # [n_k, d]: k diag(ST'') at the start
    noise_scale = math.sqrt(sig2) * np.sqrt(h)[:, None, None, :]  # [n_k, 1, 1, d]
    x = {o: np.broadcast_to(np.stack([start_point(cfg, k) for k in ks])[:, None, :], (n_k, p, d)).copy()
         for o in optimizers}
    state = {o: server_init(o, (n_k, p, d), getattr(cfg, o)) for o in optimizers}
    hit = {o: np.full((n_k, p), cfg.max_rounds, dtype=np.int64) for o in optimizers}
    alive = {o: np.ones((n_k, p), dtype=bool) for o in optimizers}
    rng = np.random.default_rng(cfg.seed)
    u_s = U_S / np.sqrt(ks)[:, None]
    bound = 5 / np.sqrt(ks)[:, None, None]
    every = max(1, cfg.max_rounds // 20)
    for t in range(cfg.max_rounds):
        if not any(a.any() for a in alive.values()):
            break
        if progress and t % every == 0:
            left = sum(int(a.sum()) for a in alive.values())
            print(f"escape rate: round {t}/{cfg.max_rounds}, {left} of {len(alive) * n_k * p} particles still "
                  "in the well", file=sys.stderr, flush=True)
        xi = rng.standard_normal((cfg.local_steps, n_k, p, c, d))  # shared by all optimizers
        for o in optimizers:
            if not alive[o].any():
                continue
            y = np.repeat(x[o][:, :, None, :], c, axis=2)
            for step in range(cfg.local_steps):
                y = y - cfg.local_lr * (grad_fk(y, kk[..., None]) + noise_scale * xi[step])
            delta = y.mean(axis=2) - x[o]
            new = server_step(o, x[o], state[o], delta, getattr(cfg, o))
            x[o] = np.where(alive[o][..., None], new, x[o])
            bad = alive[o] & ~(np.isfinite(x[o]).all(axis=-1) & (np.abs(x[o]) <= bound).all(axis=-1))
            hit[o][bad] = -1
            alive[o] &= ~bad
            escaped = alive[o] & (x[o][..., 0] < u_s)
            hit[o][escaped] = t
            alive[o] &= ~escaped
    return hit


def rate(hits: np.ndarray, max_rounds: int, burn_in: int) -> tuple[float, int, float, float]:
    """(Gamma_hat, n_esc, lo, hi): events per particle-round after the burn-in; escapes before it (and
    diverged particles) are dropped; Poisson (Garwood) 95% interval of n_esc over the exposure."""
    from scipy.stats import chi2

    keep = hits >= burn_in
    escaped = keep & (hits < max_rounds)
    n = int(escaped.sum())
    exposure = float((np.minimum(hits[keep], max_rounds) - burn_in + escaped[keep]).sum())
    if exposure <= 0:
        return float("nan"), n, float("nan"), float("nan")
    lo = 0.5 * chi2.ppf(0.025, 2 * n) if n > 0 else 0.0
    hi = 0.5 * chi2.ppf(0.975, 2 * n + 2)
    return n / exposure, n, lo / exposure, hi / exposure


def fit_exponent(ks: np.ndarray, values: np.ndarray) -> dict[str, float]:
    """Pearson r of L against 1/k and 1/sqrt(k); p of the least-squares fit L = a + b k^(-p), p in [0.1, 2]."""
    out = {"r_inv_k": float(np.corrcoef(1 / ks, values)[0, 1]),
           "r_inv_sqrt_k": float(np.corrcoef(1 / np.sqrt(ks), values)[0, 1])}
    best = (math.inf, float("nan"), float("nan"), float("nan"))
    for p in np.round(np.arange(0.1, 2.0 + 1e-9, 0.01), 2):
        z = ks ** (-p)
        design = np.stack([np.ones_like(z), z], axis=1)
        coef, *_ = np.linalg.lstsq(design, values, rcond=None)
        sse = float(((design @ coef - values) ** 2).sum())
        if sse < best[0]:
            best = (sse, float(p), float(coef[0]), float(coef[1]))
    out.update({"p": best[1], "a": best[2], "b": best[3]})
    return out


def run(cfg: EscapeConfig, out: Path | None = None, progress: bool = False) -> dict[str, dict]:
    ks = np.asarray(cfg.ks, dtype=np.float64)
    hits = first_passage(cfg, progress=progress)
    results: dict[str, dict] = {}
    for o in cfg.optimizers:
        rows = [rate(hits[o][i], cfg.max_rounds, cfg.burn_in) for i in range(len(ks))]
        diverged = int((hits[o] < 0).sum())
        gam = np.array([r[0] for r in rows])
        n_esc = np.array([r[1] for r in rows])
        usable = (n_esc >= cfg.min_escapes) & (gam > 0)
        minus_log = -np.log(np.where(gam > 0, gam, np.nan))
        fit = fit_exponent(ks[usable], minus_log[usable]) if usable.sum() >= 3 else {}
        results[o] = {"k": ks.tolist(), "rate": gam.tolist(), "escapes": n_esc.tolist(),
                      "ci95": [[r[2], r[3]] for r in rows], "minus_log_rate": minus_log.tolist(),
                      "usable": usable.tolist(), "diverged": diverged,
                      "diverged_fraction": diverged / hits[o].size, **fit}
    _print(cfg, results)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "escape_rate.json").write_text(json.dumps({"config": asdict(cfg), "sigma2": sigma2_for(cfg),
                                                          "results": results}, indent=1) + "\n")
        _plot(results, out / "escape_rate.png")
    return results


def _print(cfg: EscapeConfig, results: dict[str, dict]) -> None:
    print(f"escape rate: d={cfg.dim} P={cfg.particles} T_max={cfg.max_rounds} s={cfg.clients} "
          f"K={cfg.local_steps} eta_l={cfg.local_lr} sigma2={sigma2_for(cfg):.4g}")
    for o, r in results.items():
        print(f"{o}:")
        for k, g, n, ml in zip(r["k"], r["rate"], r["escapes"], r["minus_log_rate"], strict=True):
            print(f"  k={k:<5} escapes={n:<5} rate={g:.4g}  -log(rate)={ml:.3f}")
        if "p" in r:
            print(f"  fitted exponent p={r['p']:.2f}  r(1/k)={r['r_inv_k']:.4f}  "
                  f"r(1/sqrt k)={r['r_inv_sqrt_k']:.4f}  diverged={r['diverged']}")


def _plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (label, power) in zip(axes, (("1/k", 1.0), ("1/sqrt(k)", 0.5)), strict=True):
        for o, r in results.items():
            k = np.asarray(r["k"])
            ax.plot(k ** -power, r["minus_log_rate"], "o-", label=f"{o} (p={r.get('p', float('nan')):.2f})")
        ax.set_xlabel(label)
        ax.set_ylabel("-log(escape rate)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def load(path: str | None, overrides: list[str]) -> EscapeConfig:
    data = yaml.safe_load(Path(path).read_text()) if path else {}
    for item in overrides:
        apply_override(data, item)
    return build_dataclass(EscapeConfig, data or {}, "")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None)
    parser.add_argument("--out", default="runs/escape_rate")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    run(load(args.config, args.overrides), Path(args.out), progress=True)


if __name__ == "__main__":
    main()
