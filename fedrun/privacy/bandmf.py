"""DP-FTRL with a banded matrix factorization, ``privacy.mechanism=bandmf`` (docs/privacy.md): the noise of
round t is correlated with the noise of the b - 1 rounds before it, and the accountant uses the minimum
separation between one client's participations, which the participation schedule guarantees.

The matrix mechanism (Denisov et al. 2022; Choquette-Choo et al. 2023, "(Amplified) Banded Matrix
Factorization"). Stack the rounds' sums of clipped uploads as the rows of G ([T, d]). With an invertible
lower-triangular C ([T, T]) the mechanism releases C G + Z, Z with i.i.d. N(0, sigma^2 C_clip^2) entries,
and the server steps on its post-processing  C^{-1} (C G + Z) = G + C^{-1} Z : round t's noised sum is

    g_t + w_t,    w = C^{-1} Z,

so only the noise changes; the server optimizer (FedAvg, FedAdam, ...) is the same post-processing as with
the Gaussian mechanism (the prefix sums the model follows carry B Z with B = A C^{-1}, A the all-ones
lower triangle, instead of A Z).

C is lower-triangular banded Toeplitz with b bands, C[t, s] = c_{t-s} for 0 <= t - s < b, c_0 = 1. Then w is
the recursion (forward substitution, the t-th row of C^{-1} Z)

    w_t = (z_t - sum_{j=1}^{min(b-1, t)} c_j w_{t-j}) / c_0,

whose state is the last b - 1 noise vectors (:class:`BandNoise`, in the checkpoint). The coefficients are the
banded square root (Kalinin & Lampert 2024): the square root of the prefix-sum matrix A is the Toeplitz
matrix of 1 / sqrt(1 - x) = sum_j r_j x^j, r_j = binom(2j, j) / 4^j (A = R R), truncated to b bands:

    c_j = r_j = prod_{i=1}^{j} (2i - 1) / (2i),   j = 0 .. b - 1.

b = 1 is C = I, the Gaussian mechanism itself (the same noise bits).

Sensitivity. Client i's contribution to G is the rows t_1 < ... < t_k of its participations, each of
norm <= C_clip. When t_{m+1} - t_m >= b for all m, the columns of C at t_1..t_k have disjoint row supports
(column t covers rows t .. t + b - 1), so

    ||C (G - G')||_F^2 = sum_m ||C[:, t_m]||^2 ||u_{t_m}||^2 <= k C_clip^2 ||c||_2^2

(a Toeplitz column has norm ||c||_2, shorter only at the end). Adding or removing client i (or zeroing
its uploads) is therefore one Gaussian mechanism with noise multiplier sigma / (sqrt(k_i) ||c||_2); the
reported epsilon is the worst client's (the largest k_i), accounted by dp-accounting's
``GaussianDpEvent`` with the run's accountant (RDP or PLD). The rows of G may depend on the earlier
releases (an adaptive stream), which the guarantee allows for a lower-triangular C (Denisov et al. 2022).
The bound needs the schedule to be public and fixed in advance (a function of ``run.seed``, not of the
data): the patterns without sampling randomness (``sampling == "none"``); under a sampled pattern the
realized schedule is secret and its separation not guaranteed, and such patterns are refused, as is a
schedule whose minimum separation over the run's rounds is below b.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import dp_accounting as dpa
import numpy as np
import torch
from dp_accounting import mechanism_calibration
from torch import Tensor

from fedrun.errors import CheckpointError, ConfigError
from fedrun.privacy.accountant import fresh_accountant
from fedrun.privacy.config import PrivacyConfig


def square_root_coefficients(bands: int) -> np.ndarray:
    """c_0 .. c_{b-1} of the banded square root: r_j = binom(2j, j) / 4^j = prod_{i<=j} (2i - 1) / (2i),
    the coefficients of 1 / sqrt(1 - x) (float64)."""
    out = np.ones(bands, dtype=np.float64)
    for j in range(1, bands):
        out[j] = out[j - 1] * (2 * j - 1) / (2 * j)
    return out


def toeplitz(coefficients: np.ndarray, rounds: int) -> np.ndarray:
    """The dense lower-triangular banded Toeplitz C ([T, T], C[t, s] = c_{t-s} for 0 <= t - s < b)."""
    c = np.zeros((rounds, rounds), dtype=np.float64)
    for j, value in enumerate(coefficients[:rounds]):
        c += value * np.eye(rounds, k=-j)
    return c


@dataclass(frozen=True)
class Separation:
    """The minimum number of rounds between two participations of one client over a schedule (``gap``;
    math.inf when no client takes part twice), and where it occurs (0-based rounds)."""

    gap: float
    client: int = -1
    first: int = -1
    second: int = -1

    def where(self) -> str:
        if math.isinf(self.gap):
            return "no client takes part twice"
        return (f"client {self.client} takes part in rounds {self.first + 1} and {self.second + 1}, "
                f"{int(self.gap)} apart")


def min_separation(pattern: Any, rounds: int) -> Separation:
    """The :class:`Separation` of ``pattern``'s first ``rounds`` rounds, replayed from round 0 (the pattern is
    reset before and after: a fresh copy of the run's pattern, whose draws are a function of the seed)."""
    pattern.reset()
    last = np.full(pattern.num_clients, -1, dtype=np.int64)
    best = Separation(math.inf)
    for t in range(rounds):
        ids = np.flatnonzero(pattern.active(t))
        seen = ids[last[ids] >= 0]
        if len(seen):
            gaps = t - last[seen]
            i = int(np.argmin(gaps))
            if gaps[i] < best.gap:
                best = Separation(float(gaps[i]), int(seen[i]), int(last[seen[i]]), t)
        last[ids] = t
    pattern.reset()
    return best


class BandNoise:
    """The correlated noise w_t of the module docstring, on rank 0: the recursion in float64, its state the
    last min(b - 1, t) noise vectors, newest first (the checkpoint's ``privacy/bandmf_noise``). The other
    ranks (``root`` False) never draw noise and do not keep the vectors a resume reads."""

    def __init__(self, coefficients: np.ndarray, device: torch.device, root: bool = True) -> None:
        self.coefficients = np.asarray(coefficients, dtype=np.float64)
        self.device, self.root = device, root
        self.history: list[Tensor] = []  # w_{t-1}, w_{t-2}, ... (at most b - 1)

    @property
    def bands(self) -> int:
        return len(self.coefficients)

    def next(self, z: Tensor) -> Tensor:
        """w_t from the round's white noise z_t (any shape, any float dtype; w_t has z_t's dtype)."""
        w = z.to(torch.float64)
        for c, previous in zip(self.coefficients[1:], self.history, strict=False):
            w = w - float(c) * previous
        w = w / float(self.coefficients[0])
        if self.bands > 1:
            self.history = [w, *self.history][: self.bands - 1]
        return w.to(z.dtype)

    def correlate(self, z: dict[str, Tensor], names: list[str]) -> dict[str, Tensor]:
        """:meth:`next` of the flat concatenation of ``z[names]`` (one noise vector for the whole upload)."""
        flat = self.next(torch.cat([z[k].reshape(-1) for k in names]))
        out, at = {}, 0
        for k in names:
            out[k] = flat[at:at + z[k].numel()].view_as(z[k])
            at += z[k].numel()
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        out = {"bandmf_bands": np.int64(self.bands)}
        if self.history:
            out["bandmf_noise"] = torch.stack(self.history).cpu().numpy()
        return out

    def load_state_dict(self, d: dict[str, Any]) -> None:
        bands = int(np.asarray(d.get("bandmf_bands", -1)))
        if bands != self.bands:
            raise CheckpointError(f"privacy/bandmf_bands: the checkpoint's noise was correlated over {bands} bands, "
                                  f"this run over {self.bands} (privacy.bands, or the schedule's separation it "
                                  "defaults to, changed); resume with the checkpoint's")
        noise = d.get("bandmf_noise") if self.root else None
        self.history = [] if noise is None else [torch.as_tensor(np.asarray(v), device=self.device) for v in noise]


def epsilon_of(kind: str, delta: float, sigma: float, norm: float, worst: int) -> float:
    """Epsilon at ``delta`` of the Gaussian mechanism with multiplier sigma / (sqrt(k) ||c||_2), k = ``worst``."""
    if sigma == 0:  # no noise: infinite, as the Gaussian mechanism's accountant reports it
        return math.inf
    if worst == 0:
        return 0.0
    accountant = fresh_accountant(kind, "none")
    accountant.compose(dpa.GaussianDpEvent(sigma / (math.sqrt(worst) * norm)))
    return float(accountant.get_epsilon(delta))


class BandAccountant:
    """Epsilon of a bandmf run: the worst client's single Gaussian mechanism (module docstring), with the
    interface of :class:`fedrun.privacy.accountant.Accountant`. State: sigma and every client's k_i; the
    epsilon of a (sigma, k) pair is computed once."""

    def __init__(self, kind: str, delta: float, num_clients: int, sigma: float, norm: float) -> None:
        self.kind, self.delta, self.sigma, self.norm = kind, delta, float(sigma), float(norm)
        self.counts = np.zeros(num_clients, dtype=np.int64)
        self._cache: dict[tuple[float, int], float] = {}

    def record(self, q: float, participants: np.ndarray) -> None:
        """Round done with ``participants`` (``q`` is 1: no sampling)."""
        self.counts[participants] += 1

    def epsilon(self) -> float:
        return self._epsilon(int(self.counts.max(initial=0)))

    def epsilon_after_next(self, q_next: float, participants: np.ndarray) -> float:
        counts = self.counts.copy()
        counts[participants] += 1
        return self._epsilon(int(counts.max(initial=0)))

    def _epsilon(self, worst: int) -> float:
        key = (self.sigma, worst)
        if key not in self._cache:
            self._cache[key] = epsilon_of(self.kind, self.delta, self.sigma, self.norm, worst)
        return self._cache[key]

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"sigma": np.float64(self.sigma), "counts": self.counts.copy()}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.sigma = float(np.asarray(d["sigma"]))
        self.counts = np.asarray(d["counts"], dtype=np.int64).copy()


class BandMF:
    """The bandmf mechanism of a run, built once per rank: the refusals, b, the coefficients, sigma
    (given or calibrated), the accountant and the noise."""

    def __init__(self, cfg: PrivacyConfig, pattern: Any, planner: Any, rounds: int) -> None:
        field = "privacy.mechanism=bandmf"
        if cfg.adaptive_quantile is not None:
            raise ConfigError(f"{field}: expected privacy.adaptive_quantile=null (the sensitivity bound holds for "
                              "one clip C over the run)")
        if pattern.sampling != "none":
            raise ConfigError(f"{field}: expected a participation pattern with a guaranteed minimum separation "
                              f"between a client's participations (cyclic, reshuffled_cyclic, trace, ...), got "
                              f"participation.pattern={pattern.name}, which samples clients at random "
                              f"({pattern.sampling.replace('_', ' ')}): no separation is guaranteed")
        self.separation = min_separation(planner, rounds)
        bands = cfg.bands if cfg.bands is not None else int(min(self.separation.gap, rounds))
        if self.separation.gap < bands:
            raise ConfigError(f"privacy.bands: expected at most the minimum separation {int(self.separation.gap)} "
                              f"of participation.pattern={pattern.name} over {rounds} rounds "
                              f"({self.separation.where()}), got {bands}")
        self.bands = bands
        self.coefficients = square_root_coefficients(bands)
        self.norm = float(np.linalg.norm(self.coefficients))

    def calibrate(self, cfg: PrivacyConfig, worst: int) -> float:
        """The smallest sigma (to 1e-4) whose worst client (``worst`` participations) spends at most
        ``privacy.target_epsilon`` at ``privacy.delta``: dp-accounting's Brent search."""
        def event(sigma: float) -> dpa.DpEvent:
            return dpa.GaussianDpEvent(sigma / (math.sqrt(max(worst, 1)) * self.norm))

        bracket = mechanism_calibration.LowerEndpointAndGuess(1e-3, 1.0)
        return float(mechanism_calibration.calibrate_dp_mechanism(
            lambda: fresh_accountant(cfg.accountant, "none"), event, cfg.target_epsilon, cfg.delta, bracket,
            tol=1e-4))

    def accountant(self, cfg: PrivacyConfig, num_clients: int, sigma: float) -> BandAccountant:
        return BandAccountant(cfg.accountant, cfg.delta, num_clients, sigma, self.norm)

    def noise(self, device: torch.device, root: bool) -> BandNoise:
        return BandNoise(self.coefficients, device, root)

    def describe(self) -> str:
        return (f", bandmf with {self.bands} bands (banded square root, ||c||_2 = {self.norm:.4g}; schedule's "
                f"minimum separation {self.separation.gap:g})")
