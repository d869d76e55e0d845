"""The ``privacy`` config section (docs/privacy.md): its own module, so that fedrun/config/tree.py only names it.

Only this section's own fields are checked here; what depends on the algorithm and the participation
pattern (which algorithms central DP accepts, which accountant a pattern allows) is checked when the run
is built (:mod:`fedrun.privacy.mechanism`), with one line and exit status 2 as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedrun.errors import require

# bounds of what a run can mean and compute (docs/reliability.md): epsilon beyond 100 (a likelihood ratio of e^100)
# protects nothing and asks dp-accounting's calibration for sigmas whose accounting takes minutes (math domain
# errors near 1e15); noise beyond 1e6 C is no longer a model update (1e300 overflows the sum to inf)
MAX_TARGET_EPSILON = 100.0
MAX_NOISE_MULTIPLIER = 1e6


@dataclass
class PrivacyConfig:
    """Differential privacy of every client's whole upload (docs/privacy.md)."""

    # none; central (uploads clipped on the client's rank, Gaussian noise added once to their sum on rank 0);
    # local (each upload clipped and noised before it leaves the client)
    mode: Literal["none", "central", "local"] = "none"
    clip: float = 1.0  # C, the L2 bound of one client's whole upload (every uploaded entry jointly)
    # sigma: the noise's standard deviation is sigma * C; null: calibrated from target_epsilon before round 1
    noise_multiplier: float | None = None
    # epsilon budget at delta: with noise_multiplier null, sigma is calibrated so that run.rounds rounds spend
    # it; in any case the run stops before a round that would pass it
    target_epsilon: float | None = None
    delta: float = 1e-5  # the delta at which epsilon is reported (metrics' "epsilon") and budgeted
    accountant: Literal["rdp", "pld"] = "rdp"  # dp-accounting's Renyi-DP or privacy-loss-distribution accountant
    # adaptive clipping (Andrew et al. 2021) to this quantile of the upload norms, with its own noised count;
    # privacy.clip is then the initial C; null: a fixed C
    adaptive_quantile: float | None = None
    # true: the noise is drawn from the operating system's entropy, not from run.seed (a deployment's noise, which
    # nobody can regenerate from the run directory); the run is then not reproducible
    secure_noise: bool = False
    # gaussian: independent noise every round; bandmf: DP-FTRL's noise correlated over `bands` rounds
    # (fedrun.privacy.bandmf), for schedules whose clients take part at least `bands` rounds apart
    mechanism: Literal["gaussian", "bandmf"] = "gaussian"
    bands: int | None = None  # b of bandmf; null: the schedule's minimum separation (at most run.rounds)

    def check(self) -> None:
        require(self.clip > 0, "privacy.clip", "a number > 0", self.clip)
        require(self.noise_multiplier is None or 0 <= self.noise_multiplier <= MAX_NOISE_MULTIPLIER,
                "privacy.noise_multiplier", f"null or a number in [0, {MAX_NOISE_MULTIPLIER:g}]", self.noise_multiplier)
        require(self.target_epsilon is None or 0 < self.target_epsilon <= MAX_TARGET_EPSILON, "privacy.target_epsilon",
                f"null or a number in (0, {MAX_TARGET_EPSILON:g}]", self.target_epsilon)
        require(0 < self.delta < 1, "privacy.delta", "a number in (0, 1)", self.delta)
        require(self.adaptive_quantile is None or 0 < self.adaptive_quantile < 1, "privacy.adaptive_quantile",
                "null or a number in (0, 1)", self.adaptive_quantile)
        require(self.bands is None or self.bands >= 1, "privacy.bands", "null or an integer >= 1", self.bands)
        require(self.mechanism == "gaussian" or self.mode == "central", "privacy.mechanism",
                f"gaussian with privacy.mode={self.mode} (bandmf correlates the noise of the central sum)",
                self.mechanism)
        require(self.mode == "none" or self.noise_multiplier is not None or self.target_epsilon is not None,
                "privacy.noise_multiplier", f"a number >= 0 (or privacy.target_epsilon to calibrate it) with "
                f"privacy.mode={self.mode}", self.noise_multiplier)
