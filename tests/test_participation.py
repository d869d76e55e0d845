"""Participation patterns, delay metrics and statistics (docs/participation.md).

Deterministic patterns are checked exactly. Random ones are checked at fixed seeds against their
definition with binomial bounds: |count - n p| <= Z sqrt(n p (1 - p)) with Z = 4.5 (a two-sided
false-alarm rate below 1e-5 per check for a correct implementation), variance-inflated where the
draws are correlated (markov).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedrun.config import ParticipationConfig, load_config
from fedrun.errors import ConfigError
from fedrun.federation.delay import DelayTracker
from fedrun.federation.participation import (
    BIASED_FLOOR,
    PATTERNS,
    Participation,
    biased_probabilities,
    make_participation,
)
from fedrun.federation.participation_stats import describe, format_description, save_participation_png

Z = 4.5


def make(pattern: str, n: int = 100, s: int = 20, seed: int = 0, rounds: int = 1000, **kw) -> Participation:
    cfg = ParticipationConfig(pattern=pattern, clients_per_round=s, **kw)
    cfg.check()
    return make_participation(cfg, n, seed, rounds)


def draw(p: Participation, rounds: int, start: int = 0) -> np.ndarray:
    return np.stack([p.active(t) for t in range(start, rounds)])


def assert_binomial(count: float, trials: float, p: float, inflation: float = 1.0) -> None:
    bound = Z * math.sqrt(trials * p * (1 - p) * inflation)
    assert abs(count - trials * p) <= bound, (count, trials * p, bound)


def taus(masks: np.ndarray) -> list[dict]:
    tracker = DelayTracker(masks.shape[1])
    return [tracker.update(m) for m in masks]


# --------------------------------------------------------------------------------------------- full, Case 1


def test_full_everyone_and_zero_delay():
    p = make("full", n=7)
    masks = draw(p, 50)
    assert masks.all() and masks.dtype == bool and masks.shape == (50, 7)
    np.testing.assert_array_equal(p.probabilities(3), np.ones(7))
    last = taus(masks)[-1]
    assert last["tau_t"] == last["tau_max"] == 0 and last["tau_avg"] == last["tau_avg_client"] == 0.0


def test_uniform_exact_size_and_client_rates():
    n, s, rounds = 100, 20, 2000
    p = make("uniform", n=n, s=s, rounds=rounds)
    masks = draw(p, rounds)
    assert (masks.sum(axis=1) == s).all()
    for count in masks.sum(axis=0):
        assert_binomial(count, rounds, s / n)
    np.testing.assert_allclose(p.probabilities(0), np.full(n, 0.2))


def test_uniform_delay_tail_matches_geometric_law():
    # Case 1: P(t - a_{i,t} >= m) = (1 - S/N)^m for m <= t
    n, s, rounds, m = 50, 10, 600, 5
    masks = draw(make("uniform", n=n, s=s, seed=3), rounds)
    tracker, hits, total = DelayTracker(n), 0, 0
    for t, mask in enumerate(masks):
        tracker.update(mask)
        if t >= 50:
            hits += int((tracker.delays() >= m).sum())
            total += n
    assert abs(hits / total - (1 - s / n) ** m) < 0.02


def test_p1_is_uniform():
    np.testing.assert_array_equal(draw(make("p1", seed=5), 30), draw(make("uniform", seed=5), 30))
    assert make("p1").name == "p1"


# --------------------------------------------------------------------------------------------- Case 2 family


def test_bernoulli_mean_cohort_size():
    n, rounds = 100, 1000
    for kw, rate in (({}, 0.2), ({"probability": 0.35}, 0.35)):
        masks = draw(make("bernoulli", n=n, rounds=rounds, seed=1, **kw), rounds)
        assert_binomial(masks.sum(), n * rounds, rate)
        assert masks.sum(axis=1).std() > 0  # cohort size varies


def test_bernoulli_per_client_probability_file(tmp_path):
    n, rounds = 40, 1500
    rates = np.linspace(0.05, 0.9, n)
    path = tmp_path / "p.npy"
    np.save(path, rates)
    p = make("bernoulli", n=n, rounds=rounds, probability_file=str(path))
    np.testing.assert_array_equal(p.probabilities(7), rates)
    counts = draw(p, rounds).sum(axis=0)
    for count, rate in zip(counts, rates, strict=True):
        assert_binomial(count, rounds, rate)
    bad = tmp_path / "bad.npy"
    np.save(bad, np.linspace(0.0, 0.5, n))
    with pytest.raises(ConfigError, match=r"participation.probability_file: .*bad.npy.*\(0.0, 1.0\]"):
        make("bernoulli", n=n, probability_file=str(bad))
    with pytest.raises(ConfigError, match=r"participation.probability_file: .*p.npy.*one per client"):
        make("bernoulli", n=n + 1, probability_file=str(path))


def test_p2_is_bernoulli_s_over_n():
    a = make("p2", seed=4)
    np.testing.assert_array_equal(a.probabilities(11), np.full(100, 0.2))
    np.testing.assert_array_equal(draw(a, 40), draw(make("bernoulli", seed=4), 40))


def test_p3_round_dependent_rate():
    n, rounds = 100, 2000
    p = make("p3", n=n, s=20, rounds=rounds, seed=2)
    expected = [0.2 * (0.3 * math.sin(math.pi * t / 5) + 0.7) for t in range(10)]
    for t in range(25):
        np.testing.assert_allclose(p.probabilities(t), np.full(n, expected[t % 10]), rtol=1e-12)
    assert 0.08 < min(expected) < 0.085 and 0.195 < max(expected) < 0.2  # envelope [0.08, 0.20]
    masks = draw(p, rounds)
    for phase in range(10):
        assert_binomial(masks[phase::10].sum(), n * rounds // 10, expected[phase])


def test_sine_generalizes_p3():
    # the sine defaults (amplitude 0.3, offset 0.7, period 10, base S/N) are P3
    np.testing.assert_array_equal(draw(make("sine", seed=9), 30), draw(make("p3", seed=9), 30))
    p = make("sine", n=5, probability=0.5, sine_amplitude=0.5, sine_offset=1.5, sine_period=20.0)
    for t in (0, 3, 5, 17):
        np.testing.assert_allclose(p.probabilities(t), 0.5 * (0.5 * math.sin(2 * math.pi * t / 20) + 1.5))
    with pytest.raises(ConfigError, match="participation.sine_amplitude"):
        make("sine", probability=1.0, sine_amplitude=0.4)
    with pytest.raises(ConfigError, match="participation.sine_offset"):
        make("sine", sine_amplitude=0.8, sine_offset=0.5)


def test_biased_probabilities_and_group_rates():
    probs = biased_probabilities(100)
    np.testing.assert_allclose(probs[:11], 0.50)
    np.testing.assert_allclose(probs[11:22], 0.45)
    np.testing.assert_allclose(probs[22:33], 0.40)
    assert probs[99] == pytest.approx(0.05) and probs.sum() == pytest.approx(29.75)
    wide = biased_probabilities(130)
    assert wide[109] == pytest.approx(0.05) and (wide[110:] == BIASED_FLOOR).all() and (wide > 0).all()
    rounds = 2000
    p = make("biased", n=100, rounds=rounds, seed=6)
    np.testing.assert_allclose(p.probabilities(0), probs)
    counts = draw(p, rounds).sum(axis=0)
    for g in range(10):
        members = slice(11 * g, min(11 * g + 11, 100))
        assert_binomial(counts[members].sum(), rounds * len(range(100)[members]), 0.50 - 0.05 * g)


# --------------------------------------------------------------------------------------------- markov


def test_markov_stationary_rate_and_transitions():
    n, rounds = 100, 2000
    p = make("markov", n=n, s=20, rounds=rounds, seed=7)  # pi = 0.2, p_off = 0.5, so p_on = 0.125
    np.testing.assert_allclose(p.probabilities(0), np.full(n, 0.2))
    masks = draw(p, rounds)
    lam = 1 - 0.125 - 0.5  # lag-one autocorrelation; the variance of a long sum grows by (1+lam)/(1-lam)
    assert_binomial(masks.sum(), n * rounds, 0.2, inflation=(1 + lam) / (1 - lam))
    assert_binomial(masks[0].sum(), n, 0.2)  # round 0 drawn from the stationary law
    prev, cur = masks[:-1], masks[1:]
    assert_binomial((prev & ~cur).sum(), prev.sum(), 0.5)  # on -> off
    assert_binomial((~prev & cur).sum(), (~prev).sum(), 0.125)  # off -> on


def test_markov_explicit_and_per_client(tmp_path):
    p = make("markov", n=10, markov_p_on=0.3, markov_p_off=0.1)
    np.testing.assert_allclose(p.probabilities(0), np.full(10, 0.75))
    table = np.array([np.full(10, 0.2), np.linspace(0.1, 1.0, 10)])
    np.save(tmp_path / "m.npy", table)
    p = make("markov", n=10, markov_file=str(tmp_path / "m.npy"))
    np.testing.assert_allclose(p.probabilities(0), table[0] / (table[0] + table[1]))
    with pytest.raises(ConfigError, match=r"participation.markov_file: .*m.npy.*\[2, 11\]"):
        make("markov", n=11, markov_file=str(tmp_path / "m.npy"))
    with pytest.raises(ConfigError, match="participation.markov_p_off"):
        make("markov", n=10, probability=0.8, markov_p_off=0.5)  # would need p_on = 2


def test_stateful_patterns_require_order():
    p = make("markov", n=10, s=2)
    p.active(0)
    np.testing.assert_array_equal(p.active(0), p.active(0))  # the round just drawn is repeatable
    with pytest.raises(ValueError, match="round 5 requested, expected round 1"):
        p.active(5)


# --------------------------------------------------------------------------------------------- Case 3, Case 4


def test_cyclic_identity_blocks_exact():
    n, s = 10, 3
    masks = draw(make("cyclic", n=n, s=s), 40)
    for t, mask in enumerate(masks):
        assert set(np.flatnonzero(mask)) == {(t * s + j) % n for j in range(s)}


def test_cyclic_shuffled_fixed_permutation():
    n, s = 12, 4
    a, b = draw(make("cyclic", n=n, s=s, seed=1, cyclic_shuffle=True), 30), None
    b = draw(make("cyclic", n=n, s=s, seed=2, cyclic_shuffle=True), 30)
    assert not np.array_equal(a, b)  # the permutation depends on the seed
    np.testing.assert_array_equal(a[:3], a[3:6])  # the same order every epoch
    assert (a.reshape(10, 3, n).sum(axis=1) == 1).all()  # every client once per epoch
    assert not np.array_equal(a, draw(make("cyclic", n=n, s=s), 30))


def test_cyclic_delays():
    assert [m["tau_t"] for m in taus(draw(make("cyclic", n=4, s=1), 8))] == [1, 2, 3, 3, 3, 3, 3, 3]
    for n, s in ((4, 1), (10, 2), (12, 3), (100, 20), (6, 6)):
        e = n // s
        out = [m["tau_t"] for m in taus(draw(make("cyclic", n=n, s=s), 3 * e + 5))]
        assert out == [t + 1 if t <= e - 2 else e - 1 for t in range(len(out))]
        assert max(out) == e - 1


def test_reshuffled_cyclic_epochs_when_s_divides_n():
    n, s, epochs = 12, 3, 60
    e = n // s
    masks = draw(make("reshuffled_cyclic", n=n, s=s, seed=3), epochs * e)
    assert (masks.reshape(epochs, e, n).sum(axis=1) == 1).all()  # each client exactly once per epoch
    orders = {tuple(np.argmax(masks[k * e:(k + 1) * e], axis=0)) for k in range(epochs)}
    assert len(orders) > epochs // 2  # reshuffled, not a fixed order


def test_reshuffled_cyclic_straddling_blocks():
    for n, s in ((10, 4), (7, 3), (9, 8), (5, 5)):
        masks = draw(make("reshuffled_cyclic", n=n, s=s, seed=n), 200)
        assert (masks.sum(axis=1) == s).all()  # no duplicates inside a block
        counts = np.cumsum(masks, axis=0)  # the client stream is a concatenation of permutations
        m = s * np.arange(1, 201)[:, None]
        assert ((counts == m // n) | (counts == m // n + 1)).all()
        assert (counts.sum(axis=1) == m[:, 0]).all()


def test_reshuffled_cyclic_delay_bound():
    for n, s in ((20, 4), (12, 2), (6, 3)):
        e = n // s
        for seed in range(3):
            tau_max = taus(draw(make("reshuffled_cyclic", n=n, s=s, seed=seed), 400))[-1]["tau_max"]
            assert e - 1 <= tau_max <= 2 * e - 2


# ------------------------------------------------------------------------------------ state, determinism


STATE_KW = {"cyclic": {"cyclic_shuffle": True}, "reshuffled_cyclic": {"s": 7}}


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_state_dict_round_trip(pattern, tmp_path):
    kw = dict(STATE_KW.get(pattern, {}))
    if pattern == "trace":
        np.save(tmp_path / "t.npy", np.random.default_rng(0).random((80, 30)) < 0.3)
        kw["trace"] = str(tmp_path / "t.npy")
    ref = make(pattern, n=30, s=kw.pop("s", 5), seed=11, rounds=80, **kw)
    s = getattr(ref, "clients_per_round", 5)
    draw(ref, 37)
    state = ref.state_dict()
    assert all(isinstance(v, np.ndarray) and v.dtype.kind in "biuf" for v in state.values())
    expected = draw(ref, 80, start=37)
    fresh = make(pattern, n=30, s=s, seed=11, rounds=80, **kw)
    fresh.load_state_dict({k: v.copy() for k, v in state.items()})
    assert fresh.next_round == 37
    np.testing.assert_array_equal(draw(fresh, 80, start=37), expected)


def test_same_seed_same_draws_and_random_access():
    for pattern in ("uniform", "bernoulli", "p3", "biased", "markov", "reshuffled_cyclic"):
        a, b = draw(make(pattern, seed=21), 25), draw(make(pattern, seed=21), 25)
        np.testing.assert_array_equal(a, b)
        assert not np.array_equal(a, draw(make(pattern, seed=22), 25))
    p = make("uniform", seed=21)
    np.testing.assert_array_equal(p.active(13), draw(make("uniform", seed=21), 14)[13])


def test_reset_and_load_state_validation():
    p = make("reshuffled_cyclic", n=10, s=4)
    first = draw(p, 9)
    p.reset()
    np.testing.assert_array_equal(draw(p, 9), first)
    state = p.state_dict()
    state["permutation"] = np.zeros(10, dtype=np.int64)
    with pytest.raises(ValueError, match="not a permutation"):
        p.load_state_dict(state)
    with pytest.raises(ValueError, match="shape"):
        make("markov", n=10, s=2).load_state_dict({"next_round": np.int64(3), "state": np.zeros(4, bool)})


# --------------------------------------------------------------------------------------------- trace, config


def test_trace_npy_and_csv(tmp_path):
    table = np.random.default_rng(1).random((12, 5)) < 0.5
    np.save(tmp_path / "a.npy", table.astype(np.int8))
    lines = ["# rounds x clients"] + [",".join("true" if v else "0" for v in row) for row in table]
    (tmp_path / "a.csv").write_text("\n".join(lines) + "\n")
    for name in ("a.npy", "a.csv"):
        p = make("trace", n=5, rounds=12, trace=str(tmp_path / name))
        np.testing.assert_array_equal(draw(p, 12), table)
        assert p.probabilities(0) is None


def test_trace_errors(tmp_path):
    np.save(tmp_path / "ok.npy", np.ones((10, 4), dtype=bool))
    np.save(tmp_path / "two.npy", np.full((10, 4), 2))
    (tmp_path / "junk.npy").write_bytes(b"not an npy file")
    (tmp_path / "word.csv").write_text("1,0,1,1\n0,maybe,1,0\n")
    cases = [
        ("ok.npy", 5, 10, r"ok.npy: has 4 clients \(columns\), expected data.num_clients = 5"),
        ("ok.npy", 4, 11, r"ok.npy: has 10 rounds \(rows\), the run needs 11"),
        ("two.npy", 4, 10, r"two.npy: expected boolean values"),
        ("junk.npy", 4, 10, r"cannot read .*junk.npy"),
        ("missing.npy", 4, 10, r"missing.npy: file not found"),
        ("word.csv", 4, 2, r"word.csv: row 2, column 2: not a number or boolean: 'maybe'"),
        ("ok.txt", 4, 10, r"ok.txt: expected a .npy or .csv file"),
    ]
    for name, n, rounds, message in cases:
        with pytest.raises(ConfigError, match="^participation.trace: .*" + message):
            make("trace", n=n, rounds=rounds, trace=str(tmp_path / name))
    with pytest.raises(ConfigError, match="participation.trace: expected a .npy or .csv file"):
        make("trace", n=4)


def test_config_errors_name_the_field():
    # the registry checks its own names (the config section checks types and ranges only)
    ParticipationConfig(pattern="roundrobin").check()
    with pytest.raises(ConfigError, match=r"^participation.pattern: expected one of full, uniform"):
        make_participation(ParticipationConfig(pattern="roundrobin"), 10, 0, 5)
    for pattern in ("uniform", "cyclic", "reshuffled_cyclic", "p1", "p3"):
        with pytest.raises(ConfigError, match=r"^participation.clients_per_round: .*got 11"):
            make(pattern, n=10, s=11)
    with pytest.raises(ConfigError, match="participation.markov_p_off"):
        ParticipationConfig(markov_p_off=0.0).check()
    cfg = load_config(None, ["participation.pattern=p3", "participation.clients_per_round=20"])
    assert make_participation(cfg.participation, 100, 0, 10).name == "p3"


# --------------------------------------------------------------------------------------------- delay tracker


def test_delay_tracker_against_definition():
    rng = np.random.default_rng(5)
    n, rounds = 9, 60
    masks = rng.random((rounds, n)) < 0.15
    tracker = DelayTracker(n)
    taus_seen, client_sum = [], 0
    for t in range(rounds):
        before = tracker.last_active
        out = tracker.update(masks[t])
        a = np.array([max([j for j in range(t + 1) if masks[j, i]], default=-1) for i in range(n)])
        np.testing.assert_array_equal(tracker.last_active, a)
        np.testing.assert_array_equal(tracker.last_active_before, before)
        taus_seen.append(int((t - a).max()))
        client_sum += int((t - a).sum())
        assert out["round"] == t and out["tau_t"] == taus_seen[-1]
        assert out["tau_max"] == max(taus_seen)
        assert out["tau_avg"] == pytest.approx(np.mean(taus_seen))
        assert out["tau_avg_client"] == pytest.approx(client_sum / (n * (t + 1)))
    np.testing.assert_array_equal(tracker.participations, masks.sum(axis=0))
    assert taus_seen[0] >= 1  # a = -1 convention: tau_t >= t + 1 before everyone has participated


def test_delay_tracker_state_round_trip_and_input_checks():
    masks = np.random.default_rng(2).random((40, 6)) < 0.3
    ref = DelayTracker(6)
    for m in masks[:15]:
        ref.update(m)
    state = ref.state_dict()
    assert all(isinstance(v, np.ndarray) for v in state.values())
    other = DelayTracker(6)
    other.load_state_dict(state)
    assert [ref.update(m) for m in masks[15:]] == [other.update(m) for m in masks[15:]]
    with pytest.raises(ValueError, match="bool array of shape"):
        ref.update(np.ones(5, dtype=bool))
    with pytest.raises(ValueError, match="bool array of shape"):
        ref.update(np.ones(6))


# --------------------------------------------------------------------------------------------- statistics


def test_describe_format_and_png(tmp_path):
    p = make("cyclic", n=10, s=2)
    stats = describe(p, 50)
    assert stats["cohort_mean"] == stats["cohort_min"] == stats["cohort_max"] == 2
    assert stats["tau_max"] == 4 and stats["empty_rounds"] == 0 and stats["rate_mean"] == pytest.approx(0.2)
    text = format_description([stats, describe(make("p2", n=10, s=2), 50)])
    lines = text.splitlines()
    assert lines[0].split() == ["cyclic", "p2"] and "tau_avg_client" in text
    assert len({len(line) for line in lines}) == 1  # aligned
    stateful = make("markov", n=10, s=2)
    draw(stateful, 7)
    describe(stateful, 30)
    assert stateful.next_round == 7  # describe works on a rewound copy
    out = save_participation_png(stateful, 300, tmp_path / "p.png", window=(250, 300))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="window"):
        save_participation_png(stateful, 30, tmp_path / "q.png", window=(20, 40))
