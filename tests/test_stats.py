"""The seed-paired statistics of the results page (experiments/stats.py) on data with known answers."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))  # the experiments' home
import stats  # noqa: E402


def test_hand_computed_interval_and_exact_wilcoxon():
    # d = 1, 2, 3, 4, 5: mean 3, sd sqrt(2.5), interval 3 ± t(0.975, 4) sqrt(2.5 / 5); all five signs
    # positive, so the exact two-sided signed-rank p is 2 / 2^5
    a = {s: 10.0 + s for s in range(5)}
    b = {s: 9.0 for s in range(5)}
    r = stats.paired(a, b)
    half = 2.7764451051977987 * math.sqrt(2.5 / 5)
    assert r.seeds == (0, 1, 2, 3, 4) and r.differences == (1.0, 2.0, 3.0, 4.0, 5.0)
    assert r.mean == pytest.approx(3.0) and r.std == pytest.approx(math.sqrt(2.5))
    assert r.ci == pytest.approx((3.0 - half, 3.0 + half))
    assert r.wilcoxon_p == pytest.approx(2 / 32)
    assert r.wins == 5 and r.verdict() == "reproduces"


def test_matches_scipy_on_random_pairs():
    rng = np.random.default_rng(3)
    x, y = rng.normal(0.7, 0.05, 10), rng.normal(0.68, 0.05, 10)
    r = stats.paired(dict(enumerate(x)), dict(enumerate(y)), bootstrap=True)
    t = sps.ttest_rel(x, y).confidence_interval(0.95)
    assert r.ci == pytest.approx((t.low, t.high))
    assert r.wilcoxon_p == pytest.approx(sps.wilcoxon(x - y).pvalue)
    assert r.std == pytest.approx(np.std(x - y, ddof=1))
    assert r.wins == int((x > y).sum())
    lo, hi = r.bootstrap_ci
    assert lo < r.mean < hi and hi - lo < r.ci[1] - r.ci[0]  # the percentile bootstrap is narrower at n = 10
    assert stats.paired(dict(enumerate(x)), dict(enumerate(y)), bootstrap=True).bootstrap_ci == r.bootstrap_ci


def test_all_equal_is_inconclusive_with_p_one():
    a = {s: 0.75 for s in range(10)}
    r = stats.paired(a, dict(a))
    assert r.mean == 0 and r.std == 0 and r.ci == (0.0, 0.0)
    assert r.wilcoxon_p == 1.0 and r.wins == 0
    assert r.verdict() == "inconclusive at 10 seeds"


def test_interval_straddling_zero_is_inconclusive():
    d = [1.0, -1.0, 2.0, -2.0, 0.5, -0.4, 0.3, -0.2, 0.1, 0.2]
    r = stats.paired(dict(enumerate(d)), dict.fromkeys(range(10), 0.0))
    assert r.ci[0] < 0 < r.ci[1]
    assert r.verdict() == "inconclusive at 10 seeds" and r.wins == 6


def test_direction_lower_is_better_and_the_opposite_verdict():
    # a has the lower loss on every seed: better where lower is better, worse where higher is
    a = {s: 0.5 + 0.01 * s for s in range(10)}
    b = {s: 0.6 + 0.012 * s for s in range(10)}
    assert stats.paired(a, b, higher_is_better=False).verdict() == "reproduces"
    assert stats.paired(a, b, higher_is_better=False).wins == 10
    r = stats.paired(a, b)
    assert r.verdict() == "does not reproduce" and r.wins == 0 and r.ci[1] < 0


def test_missing_values_drop_their_seed():
    a = {0: 0.7, 1: None, 2: 0.72, 3: 0.71}
    b = {0: 0.69, 1: 0.7, 2: 0.7, 4: 0.1}
    r = stats.paired(a, b)
    assert r.seeds == (0, 2) and r.differences == pytest.approx((0.01, 0.02))
    assert r.verdict() == "inconclusive at 2 seeds"  # t(0.975, 1) = 12.7: the interval holds 0
    empty = stats.paired({0: None}, {0: 0.5})
    assert empty.n == 0 and math.isnan(empty.mean) and empty.verdict() == "inconclusive at 0 seeds"
