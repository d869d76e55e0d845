"""DP-FTRL with a banded matrix factorization (fedrun/privacy/bandmf.py, docs/privacy.md): the noise recursion
against a dense C^{-1} Z, the sensitivity against a brute-force maximum over participation patterns, epsilon
against dp-accounting from scratch, the noise a real run adds, the refusals of patterns without the separation,
and the same bits on 1/2/3 real MPI ranks and after SIGKILL + resume."""

from __future__ import annotations

import itertools
import math
import re
import subprocess
import sys

import dp_accounting as dpa
import h5py
import numpy as np
import pytest
import torch
from dp_accounting import pld, rdp
from helpers import (
    LEAST_SQUARES,
    REPO,
    child_env,
    final_state,
    kill_after,
    metrics,
    one_line_problems,
    run_ranks,
    train_args,
)

import fedrun
from fedrun.config import load_config
from fedrun.errors import CheckpointError, ConfigError
from fedrun.federation.participation.registry import make_participation
from fedrun.privacy.bandmf import BandNoise, square_root_coefficients, toeplitz

N = 20
BASE = [*LEAST_SQUARES, f"data.num_clients={N}", "local.steps=2", "local.lr=0.05", "participation.clients_per_round=4",
        "participation.pattern=cyclic", "privacy.mode=central"]
SIGMA = 1.3


def test_recursion_is_the_dense_inverse_and_resumes_exactly():
    """w_t of the recursion equals row t of C^{-1} Z (float64, dense solve); a copy restored from the state
    after round 5 continues with the same bits; b = 1 is the white noise itself."""
    rounds, bands = 12, 4
    c = square_root_coefficients(bands)
    assert c.tolist() == [1.0, 0.5, 0.375, 0.3125]  # binom(2j, j) / 4^j
    z = np.random.default_rng(0).standard_normal((rounds, 3))
    want = np.linalg.solve(toeplitz(c, rounds), z)
    noise = BandNoise(c, torch.device("cpu"))
    got = [noise.next(torch.from_numpy(row)).numpy() for row in z[:5]]
    resumed = BandNoise(c, torch.device("cpu"))
    resumed.load_state_dict(noise.state_dict())
    got += [noise.next(torch.from_numpy(row)).numpy() for row in z[5:]]
    again = [resumed.next(torch.from_numpy(row)).numpy() for row in z[5:]]
    np.testing.assert_allclose(np.array(got), want, rtol=1e-12, atol=1e-12)
    assert np.array_equal(np.array(got[5:]), np.array(again))
    white = BandNoise(square_root_coefficients(1), torch.device("cpu"))
    z32 = torch.randn(7, generator=torch.Generator().manual_seed(1))
    assert torch.equal(white.next(z32), z32) and white.state_dict() == {"bandmf_bands": 1}


def max_norm(c: np.ndarray, participations: tuple[int, ...]) -> float:
    """max over sign vectors u (|u_t| = 1 on the participations, 0 elsewhere) of ||C u||_2."""
    best = 0.0
    for signs in itertools.product((-1.0, 1.0), repeat=len(participations)):
        u = np.zeros(len(c))
        u[list(participations)] = signs
        best = max(best, float(np.linalg.norm(c @ u)))
    return best


def test_sensitivity_is_sqrt_k_times_the_coefficients_norm_under_separation():
    """Brute force over every participation pattern of T = 9 rounds with b = 3: with every pair of a client's
    participations >= b apart, max ||C u|| over k participations is sqrt(k) ||c||_2 (reached); closer
    participations can exceed it, so the separation is what the bound needs."""
    rounds, bands = 9, 3
    c = toeplitz(square_root_coefficients(bands), rounds)
    norm = float(np.linalg.norm(square_root_coefficients(bands)))
    exceeded = False
    for k in (1, 2, 3):
        worst = 0.0
        for rounds_joined in itertools.combinations(range(rounds), k):
            gap = min(np.diff(rounds_joined), default=math.inf)
            got = max_norm(c, rounds_joined)
            if gap >= bands:
                worst = max(worst, got)
            else:
                exceeded |= got > math.sqrt(k) * norm * (1 + 1e-9)
        assert worst == pytest.approx(math.sqrt(k) * norm, rel=1e-12), k
    assert exceeded


def run_epsilons(overrides: list[str], rounds: int) -> tuple[list[float], np.ndarray]:
    result = fedrun.run({}, [*BASE, f"run.rounds={rounds}", f"privacy.noise_multiplier={SIGMA}", *overrides],
                        write_files=False)
    return [r["epsilon"] for r in result.metrics], result.x


@pytest.mark.parametrize("bands, accountant", [(3, "rdp"), (None, "rdp"), (2, "pld")])
def test_epsilon_equals_dp_accounting_from_scratch(bands, accountant):
    """The worst client's Gaussian mechanism with multiplier sigma / (sqrt(k) ||c||_2), k its participations
    (counted on a fresh copy of the pattern), ||c|| from binomials; bands null is the cyclic separation N/S."""
    rounds = 12
    b = N // 4 if bands is None else bands
    got, _ = run_epsilons(["privacy.mechanism=bandmf", f"privacy.accountant={accountant}",
                           *([] if bands is None else [f"privacy.bands={bands}"])], rounds)
    norm = math.sqrt(sum((math.comb(2 * j, j) / 4**j) ** 2 for j in range(b)))
    cfg = load_config(None, [*BASE, f"privacy.noise_multiplier={SIGMA}"])
    part = make_participation(cfg.participation, N, cfg.run.seed, rounds)
    counts = np.zeros(N, dtype=int)
    by_count: dict[int, float] = {}
    want = []
    for t in range(rounds):
        counts += part.active(t)
        k = int(counts.max())
        if k not in by_count:
            acc = rdp.RdpAccountant() if accountant == "rdp" else pld.PLDAccountant()
            acc.compose(dpa.GaussianDpEvent(SIGMA / (math.sqrt(k) * norm)))
            by_count[k] = acc.get_epsilon(1e-5)
        want.append(by_count[k])
    assert got == pytest.approx(want, rel=1e-12)


def test_target_epsilon_calibrates_sigma_and_the_run_ends_within_it():
    result = fedrun.run({}, [*BASE, "run.rounds=12", "privacy.mechanism=bandmf", "privacy.target_epsilon=5"],
                        write_files=False)
    eps = [r["epsilon"] for r in result.metrics]
    assert len(eps) == 12 and 4.99 < eps[-1] <= 5 * (1 + 1e-9)


def test_one_band_is_the_gaussian_mechanism_bit_for_bit():
    """b = 1 is C = I: the same model bits as privacy.mechanism=gaussian, and the same epsilon (one Gaussian
    at sigma / sqrt(k) is the k-fold composition at sigma)."""
    eps_band, x_band = run_epsilons(["privacy.mechanism=bandmf", "privacy.bands=1"], 8)
    eps_gauss, x_gauss = run_epsilons([], 8)
    assert np.array_equal(x_band, x_gauss)
    assert eps_band == pytest.approx(eps_gauss, rel=1e-12)


def test_the_run_adds_the_correlated_noise():
    """With local.lr = 0 every upload is 0 and FedAvg's step is the noise over S: the Gaussian runs of 1..T
    rounds give z_1..z_T, and the bandmf run's model moved by sum_t (C^{-1} Z)_t / S."""
    cfg = ["data.name=synthetic", "data.synthetic.shape=[20]", "data.num_clients=8", "model.name=logistic",
           "run.dtype=float64", "local.lr=0", "local.steps=1", "eval.every=0", "participation.clients_per_round=2",
           "participation.pattern=cyclic", "local.strategy=sequential", "privacy.mode=central",
           "privacy.noise_multiplier=1.5", "privacy.clip=0.2"]
    rounds, bands = 4, 3
    xs = [fedrun.run({}, [*cfg, f"run.rounds={r}"], write_files=False).x for r in range(1, rounds + 1)]
    x0 = fedrun.run({}, [*cfg, "run.rounds=1", "privacy.noise_multiplier=0"], write_files=False).x
    z = np.diff(np.array([x0, *xs]), axis=0) * 2
    band = fedrun.run({}, [*cfg, f"run.rounds={rounds}", "privacy.mechanism=bandmf", f"privacy.bands={bands}"],
                      write_files=False).x
    w = np.linalg.solve(toeplitz(square_root_coefficients(bands), rounds), z)
    np.testing.assert_allclose((band - x0) * 2, w.sum(axis=0), rtol=1e-9, atol=1e-12)
    assert not np.allclose(w.sum(axis=0), z.sum(axis=0))  # the correlation is visible at this size


def test_patterns_without_the_separation_are_refused_before_training(tmp_path):
    """One line, status 2, no run directory (the CLI, for a sampled pattern, named); the same refusal in
    process for bands above a cyclic schedule's separation and a trace whose separation (computed from the
    file) is below bands; the trace's own separation is accepted."""
    refuse = ["run.rounds=12", "privacy.noise_multiplier=1", "privacy.mechanism=bandmf"]
    proc = subprocess.run([sys.executable, "-m", "fedrun", "train", "--quiet", f"run.dir={tmp_path / 'run'}", *BASE,
                           *refuse, "participation.pattern=p2"], capture_output=True, text=True, env=child_env(),
                          cwd=REPO)
    needle = "participation.pattern=p2, which samples clients at random"
    assert one_line_problems(proc.returncode, proc.stderr, needle) == [], proc.stderr
    assert not (tmp_path / "run").exists()
    trace = np.zeros((12, N), dtype=bool)
    trace[np.arange(12), np.arange(12)] = True
    trace[[0, 3, 6, 9], 15] = True  # client 15 every 3 rounds
    trace[[2, 4], 17] = True  # client 17 two rounds apart: the separation
    np.save(tmp_path / "trace.npy", trace)
    replay = [f"participation.trace={tmp_path / 'trace.npy'}", "participation.pattern=trace"]
    cases = [(["privacy.bands=6"], "minimum separation 5 of participation.pattern=cyclic"),
             ([*replay, "privacy.bands=3"], "client 17 takes part in rounds 3 and 5, 2 apart"),
             (["privacy.adaptive_quantile=0.5"], "privacy.adaptive_quantile=null")]
    for overrides, needle in cases:
        with pytest.raises(ConfigError, match=re.escape(needle)):
            fedrun.run({}, [*BASE, *refuse, *overrides], write_files=False)
    assert len(fedrun.run({}, [*BASE, *refuse, *replay, "privacy.bands=2"], write_files=False).metrics) == 12


def test_resume_in_process_is_exact_and_a_changed_band_count_is_refused(tmp_path):
    """A 12-round run stopped after round 6 (its mid-run checkpoint holds b - 1 = 4 noise vectors) and resumed
    ends with the uninterrupted run's bits and epsilons; a run of 4 rounds has b = 4 (the separation 5 capped
    at run.rounds), so resuming it to 12 rounds (b = 5) is refused with one line naming the checkpoint's
    dataset."""
    common = [*BASE, f"privacy.noise_multiplier={SIGMA}", "privacy.mechanism=bandmf", "checkpoint.every=1"]
    whole = fedrun.run({}, [*common, "run.rounds=12"], write_files=False)
    fedrun.run({}, [*common, "run.rounds=12", f"run.dir={tmp_path / 'cut'}"], callback=lambda r: r["round"] == 6)
    with h5py.File(sorted((tmp_path / "cut").glob("ckpt_*.h5"))[-1], "r") as f:
        assert int(f["meta/round"][()]) == 6 and f["privacy/bandmf_noise"].shape == (4, len(whole.x))
    resumed = fedrun.run({}, [*common, "run.rounds=12", f"run.dir={tmp_path / 'cut'}"], resume="auto")
    assert np.array_equal(whole.x, resumed.x)
    assert [r["epsilon"] for r in whole.metrics] == [r["epsilon"] for r in metrics(tmp_path / "cut")]
    fedrun.run({}, [*common, "run.rounds=4", f"run.dir={tmp_path / 'short'}"])
    with pytest.raises(CheckpointError, match="privacy/bandmf_bands: the checkpoint's noise was correlated over 4"):
        fedrun.run({}, [*common, "run.rounds=12", f"run.dir={tmp_path / 'short'}"], resume="auto")
    # one sigma for the whole run: an accepted noise change is refused, not silently accounted at the old sigma
    changed = [*common, "run.rounds=14", f"run.dir={tmp_path / 'cut'}", f"privacy.noise_multiplier={2 * SIGMA}"]
    with pytest.raises(ConfigError, match=rf"^privacy.noise_multiplier: the checkpoint's rounds used {SIGMA} and "):
        fedrun.run({}, changed, resume="auto", accept_changes=("privacy.noise_multiplier",))


@pytest.mark.mpi
def test_one_rank_equals_two_ranks_killed_and_resumed_on_three(tmp_path):
    """FedAdam, cyclic with one client a round among 7: b = 7 bands by default, so the checkpoint holds the
    last 6 noise vectors. The run on 1 rank, and the run on 2 ranks SIGKILLed mid-way and resumed on 3, end
    with the same bits, metrics and epsilons."""
    extra = ["algorithm.name=fedadam", "participation.pattern=cyclic", "participation.clients_per_round=1",
             "privacy.mode=central", "privacy.mechanism=bandmf", "privacy.noise_multiplier=0.7", "privacy.clip=0.05",
             "checkpoint.every=1"]
    rounds, whole, cut = 40, tmp_path / "whole", tmp_path / "cut"
    run_ranks(1, train_args(whole, rounds, extra))
    kill_after(train_args(cut, rounds, extra), cut, 15, ranks=2)
    assert final_state(cut)["meta/round"] < rounds
    run_ranks(3, train_args(cut, rounds, extra, resume=True))
    states = final_state(whole), final_state(cut)
    assert states[0].keys() == states[1].keys() and all(np.array_equal(states[0][k], states[1][k]) for k in states[0])
    assert metrics(whole) == metrics(cut) and metrics(whole)[-1]["epsilon"] > 0
    with h5py.File(sorted(whole.glob("ckpt_*.h5"))[-1], "r") as f:
        assert int(f["privacy/bandmf_bands"][()]) == 7
        assert f["privacy/bandmf_noise"].shape == (6, len(states[0]["server/x"]))
