"""Seed-paired comparison of two methods on one metric, and the verdict word a claim gets from it.

Two runs with the same seed share the partition, the participation draws, the minibatches and dropout,
so the comparison is made on the per-seed differences d_s = a_s - b_s, s = 1..n, not on the two means:

* mean d̄ = (1/n) sum_s d_s and standard deviation sd = sqrt(sum_s (d_s - d̄)^2 / (n - 1));
* the 95% t-interval d̄ ± t_{0.975, n-1} sd / sqrt(n) (scipy.stats.ttest_rel's confidence_interval);
* the Wilcoxon signed-rank p-value of the d_s (scipy.stats.wilcoxon, two-sided), which does not assume
  normal differences; all-zero differences give p = 1 (no evidence either way);
* optionally a percentile bootstrap interval of d̄ over the seeds (scipy.stats.bootstrap, seeded);
* wins: the seeds on which a is strictly better than b (higher, or lower for a loss).

The verdict on a claim "a is better than b" rests on the t-interval alone: "reproduces" where it excludes
0 on the claimed side, "does not reproduce" where it excludes 0 on the other side, otherwise
"inconclusive at n seeds" (experiments/claims.py judges the page's claims from the same intervals). Two
more pieces the claims file needs: ``holm``, Holm's step-down adjustment of a family of p-values, and
``sd_ratio``, the ratio of two methods' standard deviations over the seeds with a paired bootstrap
interval (the "stability" of a method). A value of None (a run without that number, e.g. the f(x) of a diverged run)
drops its seed from the comparison; the caller decides what a diverged run's value is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

REPRODUCES = "reproduces"
DOES_NOT = "does not reproduce"


@dataclass(frozen=True)
class Paired:
    """The seed-paired comparison a - b; ``better`` is +1 where higher is better, -1 where lower is."""

    seeds: tuple[int, ...]  # the seeds with a value for both methods, sorted
    differences: tuple[float, ...]  # a_s - b_s per seed in ``seeds``
    mean: float
    std: float  # of the differences, ddof = 1 (nan for n < 2)
    ci: tuple[float, float]  # 95% t-interval of the mean difference (nan for n < 2)
    wilcoxon_p: float  # two-sided; 1.0 when every difference is 0, nan for n = 0
    wins: int  # seeds on which a is strictly better
    better: int
    bootstrap_ci: tuple[float, float] | None = None

    @property
    def n(self) -> int:
        return len(self.seeds)

    def verdict(self) -> str:
        """The word for the claim "a is better than b": from the t-interval's position relative to 0."""
        lo, hi = self.ci
        if self.n >= 2 and np.isfinite(lo) and np.isfinite(hi):
            lo, hi = self.better * lo, self.better * hi  # in "a better" units
            if min(lo, hi) > 0:
                return REPRODUCES
            if max(lo, hi) < 0:
                return DOES_NOT
        return f"inconclusive at {self.n} seeds"

    def as_dict(self) -> dict:
        return {"seeds": list(self.seeds), "differences": list(self.differences), "mean": self.mean,
                "std": self.std, "ci95": list(self.ci), "wilcoxon_p": self.wilcoxon_p, "wins": self.wins,
                "n": self.n, "bootstrap_ci95": None if self.bootstrap_ci is None else list(self.bootstrap_ci),
                "verdict": self.verdict()}


def paired(a: Mapping[int, float | None], b: Mapping[int, float | None], higher_is_better: bool = True,
           bootstrap: bool = False, seed: int = 0) -> Paired:
    """Compare ``a`` and ``b`` (seed -> value) on the seeds where both have a value."""
    seeds = tuple(sorted(s for s in set(a) & set(b) if a[s] is not None and b[s] is not None))
    x = np.asarray([a[s] for s in seeds], dtype=float)
    y = np.asarray([b[s] for s in seeds], dtype=float)
    d = x - y
    better = 1 if higher_is_better else -1
    n = len(d)
    mean = float(d.mean()) if n else float("nan")
    if n >= 2 and np.all(d == d[0]):  # no spread: the interval is the point (ttest_rel would give nan)
        std, ci = 0.0, (mean, mean)
    elif n >= 2:
        std = float(d.std(ddof=1))
        low, high = stats.ttest_rel(x, y).confidence_interval(0.95)
        ci = (float(low), float(high))
    else:
        std, ci = float("nan"), (float("nan"), float("nan"))
    if n == 0:
        p = float("nan")
    elif np.all(d == 0):
        p = 1.0
    else:
        p = float(stats.wilcoxon(d).pvalue)
    boot = None
    if bootstrap and n >= 2 and std > 0:
        res = stats.bootstrap((d,), np.mean, confidence_level=0.95, method="percentile",
                              rng=np.random.default_rng(seed))
        boot = (float(res.confidence_interval.low), float(res.confidence_interval.high))
    return Paired(seeds=seeds, differences=tuple(float(v) for v in d), mean=mean, std=std, ci=ci,
                  wilcoxon_p=p, wins=int((better * d > 0).sum()), better=better, bootstrap_ci=boot)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family of p-values (Holm 1979), in the input order.

    With the m p-values that are not None sorted, p_(1) <= ... <= p_(m), the adjusted values are

        p~_(i) = min(1, max_{j <= i} (m - j + 1) p_(j)),

    so that rejecting every hypothesis with p~ <= alpha controls the family-wise error rate at alpha under
    any dependence. A None (a comparison without a p-value) stays None and does not count in m; ties keep
    their input order (the adjusted values of tied p are equal either way).
    """
    present = [i for i, p in enumerate(pvalues) if p is not None]
    m = len(present)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(present, key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        out[i] = running
    return out


@dataclass(frozen=True)
class SpreadRatio:
    """The ratio of the standard deviations over seeds, sd(a) / sd(b), with a paired bootstrap interval."""

    seeds: tuple[int, ...]
    ratio: float
    ci: tuple[float, float]


def sd_ratio(a: Mapping[int, float | None], b: Mapping[int, float | None], seed: int = 0,
             resamples: int = 9999) -> SpreadRatio:
    """sd(a) / sd(b) (ddof = 1) over the seeds where both have a value, and its 95% percentile bootstrap
    interval (scipy.stats.bootstrap, ``paired=True``: a resample draws seeds, each with both of its runs,
    so that the interval keeps the two methods' shared partition and draws). A resample in which b has no
    spread gives an infinite ratio (it sorts to the top of the interval)."""
    seeds = tuple(sorted(s for s in set(a) & set(b) if a[s] is not None and b[s] is not None))
    x = np.asarray([a[s] for s in seeds], dtype=float)
    y = np.asarray([b[s] for s in seeds], dtype=float)

    def ratio(u: np.ndarray, v: np.ndarray, axis: int = -1) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.std(u, ddof=1, axis=axis) / np.std(v, ddof=1, axis=axis)

    value = float(ratio(x, y))
    if len(seeds) < 3 or not np.isfinite(value):
        return SpreadRatio(seeds, value, (float("nan"), float("nan")))
    with np.errstate(invalid="ignore"):  # infinite ratios make scipy's standard error nan; unused here
        res = stats.bootstrap((x, y), ratio, paired=True, vectorized=True, n_resamples=resamples,
                              confidence_level=0.95, method="percentile", rng=np.random.default_rng(seed))
    return SpreadRatio(seeds, value, (float(res.confidence_interval.low), float(res.confidence_interval.high)))
