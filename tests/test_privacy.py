"""Differential privacy (fedrun/privacy, docs/privacy.md): the accountant against dp-accounting computed
directly for every pattern class, the clip bound on real uploads, the noise's distribution, the
non-private run recovered bit for bit, which algorithms central DP refuses, and the same bits on 1/2/3
real MPI ranks and after SIGKILL + resume (epsilon included)."""

from __future__ import annotations

import json
import math
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
    federation,
    final_models,
    final_state,
    kill_after,
    metrics,
    one_line_problems,
    run_ranks,
    train_args,
)
from scipy import stats

import fedrun
from fedrun.algorithms import ALGORITHMS
from fedrun.config import load_config
from fedrun.errors import ConfigError
from fedrun.federation.participation.registry import make_participation
from fedrun.privacy.mechanism import clip_uploads, upload_norms

N = 20
BASE = [*LEAST_SQUARES, f"data.num_clients={N}", "local.steps=2", "local.lr=0.05", "participation.clients_per_round=4"]
SIGMA = 1.3


def epsilons(overrides: list[str], rounds: int) -> list[float]:
    result = fedrun.run({}, [*BASE, f"run.rounds={rounds}", *overrides], write_files=False)
    return [r["epsilon"] for r in result.metrics]


def poisson_direct(qs: list[float], accountant: dpa.PrivacyAccountant) -> list[float]:
    """Epsilon after each round of per-round Poisson-sampled Gaussians, composed by dp-accounting."""
    out = []
    for q in qs:
        accountant.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(SIGMA)))
        out.append(accountant.get_epsilon(1e-5))
    return out


def test_epsilon_of_poisson_patterns_equals_dp_accounting():
    """p2 (q = S/N every round, RDP and PLD) and p3 (q_t = (S/N)(0.3 sin(2 pi t / 10) + 0.7))."""
    central = ["privacy.mode=central", f"privacy.noise_multiplier={SIGMA}"]
    got = epsilons([*central, "participation.pattern=p2"], 12)
    assert got == pytest.approx(poisson_direct([4 / N] * 12, rdp.RdpAccountant()), rel=1e-9)
    got = epsilons([*central, "participation.pattern=p2", "privacy.accountant=pld"], 3)
    assert got == pytest.approx(poisson_direct([4 / N] * 3, pld.PLDAccountant()), rel=1e-9)
    qs = [4 / N * (0.3 * math.sin(2 * math.pi * t / 10) + 0.7) for t in range(12)]
    got = epsilons([*central, "participation.pattern=p3"], 12)
    assert got == pytest.approx(poisson_direct(qs, rdp.RdpAccountant()), rel=1e-9)
    assert got[-1] > got[0] > 0


def test_epsilon_of_uniform_sampling_equals_dp_accounting_without_replacement():
    got = epsilons(["privacy.mode=central", f"privacy.noise_multiplier={SIGMA}", "participation.pattern=uniform"], 5)
    want = []
    for r in range(1, 6):
        acc = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
        acc.compose(dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(N, 4, dpa.GaussianDpEvent(SIGMA / 2)),
                                            r))
        want.append(acc.get_epsilon(1e-5))
    assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("pattern, mode", [("cyclic", "central"), ("markov", "central"), ("p2", "local")])
def test_epsilon_without_amplification_is_the_worst_clients_composition(pattern, mode):
    """Cyclic and Markov participation (and every pattern in local mode): the worst client's k Gaussians. In
    local mode a client's report itself is public and its data is what is protected: replacing it moves the
    clipped report by up to 2C, so each round is the Gaussian with multiplier sigma / 2 (issue 42: it was
    accounted at sigma, 10.9 reported against a true 26.5)."""
    rounds = 9
    got = epsilons([f"privacy.mode={mode}", f"privacy.noise_multiplier={SIGMA}", f"participation.pattern={pattern}"],
                   rounds)
    cfg = load_config(None, [*BASE, f"participation.pattern={pattern}"])
    part = make_participation(cfg.participation, N, cfg.run.seed, rounds)
    counts = np.zeros(N, dtype=int)
    want = []
    for t in range(rounds):
        counts += part.active(t)
        acc = rdp.RdpAccountant()
        acc.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(SIGMA / 2 if mode == "local" else SIGMA),
                                            int(counts.max())))
        want.append(acc.get_epsilon(1e-5))
    assert got == pytest.approx(want, rel=1e-12)


def test_clip_bounds_every_real_clients_upload_jointly():
    """Real uploads of one round (every client trained, clipped on its rank) have joint norm <= C, and a
    row within C keeps its bits."""
    fed = federation(load_config(None, [*BASE, "algorithm.name=fedadam", "privacy.mode=central",
                                        "privacy.noise_multiplier=0", "privacy.clip=0.05", "local.lr=0.5"]))
    down = fed.downlink()
    rows = np.arange(N)
    ctx = fed.setup.round.facts.context(0, 0.5, N)
    up, _, _ = fed.setup.round.trainer.train(fed.state, rows, down, down, ctx, None)
    norms = upload_norms(up, list(up))
    assert float(norms.max()) <= 0.05 * (1 + 1e-12)
    assert float(norms.min()) > 0.049  # these deltas were all larger than C: each now sits on the sphere
    raw = {"v": torch.tensor([[3.0, 4.0], [0.3, 0.4]], dtype=torch.float64), "s": torch.tensor([12.0, 0.0],
                                                                                               dtype=torch.float64)}
    clipped, before = clip_uploads(raw, ["v", "s"], 1.0)
    assert before.tolist() == [13.0, 0.5]
    assert torch.equal(clipped["v"][1], raw["v"][1]) and float(clipped["s"][1]) == 0.0
    assert upload_norms(clipped, ["v", "s"]).tolist() == pytest.approx([1.0, 0.5], rel=1e-15)


def test_noise_zero_and_unreachable_clip_is_the_non_private_run_bit_for_bit():
    plain = [*BASE, "run.rounds=6"]
    for algo in ("fedavg", "fedadam"):
        a = fedrun.run({}, [*plain, f"algorithm.name={algo}"], write_files=False).x
        b = fedrun.run({}, [*plain, f"algorithm.name={algo}", "privacy.mode=central", "privacy.noise_multiplier=0",
                            "privacy.clip=1e30"], write_files=False).x
        assert np.array_equal(a, b), algo
    c = fedrun.run({}, [*plain, "privacy.mode=central", "privacy.noise_multiplier=0", "privacy.clip=0.01"],
                   write_files=False).x
    assert not np.array_equal(a, c)  # the clip acts when it is reachable


def test_added_noise_is_gaussian_with_std_sigma_c():
    """With local.lr = 0 every upload is 0, so FedAvg's step is the noise alone: x_1 - x_0 = eta_g z / S."""
    cfg = ["data.name=synthetic", "data.synthetic.shape=[80]", "data.num_clients=10", "model.name=logistic",
           "run.dtype=float64", "local.lr=0", "local.steps=1", "eval.every=0", "participation.clients_per_round=5",
           "run.rounds=1", "local.strategy=sequential"]
    x0 = fedrun.run({}, cfg, write_files=False).x
    sigma, clip = 1.7, 0.3
    x1 = fedrun.run({}, [*cfg, "privacy.mode=central", f"privacy.noise_multiplier={sigma}", f"privacy.clip={clip}"],
                    write_files=False).x
    z = (x1 - x0) * 5
    assert len(z) == 810
    assert stats.kstest(z, "norm", args=(0, sigma * clip)).pvalue > 1e-3
    assert stats.kstest(z, "norm", args=(0, 1.3 * sigma * clip)).pvalue < 1e-3  # the test can tell a wrong std


def memory_or_gathered(name: str) -> bool:
    algo = ALGORITHMS[name]
    decl = algo(algo.Hparams()).declare()
    return bool(decl.memory or decl.gathered())


def test_central_dp_refuses_exactly_the_algorithms_that_keep_clients_uploads():
    refused = {name for name in ALGORITHMS if memory_or_gathered(name)}
    assert refused == {"mifa", "fedvarp", "fedsum_b", "fedsum", "fedsum_cr", "scaffold", "fadamgc", "fedmedian",
                       "fedtrimmedavg", "krum"}
    for name, needle in (("mifa", "reuses each client's contribution"), ("krum", "receives every client's upload")):
        proc = subprocess.run([sys.executable, "-m", "fedrun", "train", "--quiet", "run.dir=/nonexistent/never",
                               *BASE, f"algorithm.name={name}", "privacy.mode=central", "privacy.noise_multiplier=1"],
                              capture_output=True, text=True, env=child_env(), cwd=REPO)
        assert one_line_problems(proc.returncode, proc.stderr, needle) == [], proc.stderr
    local = fedrun.run({}, [*BASE, "run.rounds=3", "algorithm.name=mifa", "privacy.mode=local",
                            "privacy.noise_multiplier=1"], write_files=False)
    assert len(local.metrics) == 3 and local.metrics[-1]["epsilon"] > 0


def test_target_epsilon_calibrates_sigma_and_the_run_ends_within_it():
    result = fedrun.run({}, [*BASE, "run.rounds=8", "participation.pattern=p2", "privacy.mode=central",
                             "privacy.target_epsilon=3"], write_files=False)
    eps = [r["epsilon"] for r in result.metrics]
    assert len(eps) == 8 and eps[-1] <= 3 * (1 + 1e-9) and eps[-1] > 2.9


DP_CONFIGS = {
    "central_p2_adaptive": [*BASE, "run.rounds=8", "participation.pattern=p2", "privacy.mode=central",
                            "privacy.noise_multiplier=0.8", "privacy.clip=0.05", "privacy.adaptive_quantile=0.5"],
    "central_fedadam_uniform": [*BASE, "run.rounds=8", "algorithm.name=fedadam", "privacy.mode=central",
                                "privacy.noise_multiplier=0.8", "privacy.clip=0.1"],
    "local_markov": [*BASE, "run.rounds=8", "participation.pattern=markov", "privacy.mode=local",
                     "privacy.noise_multiplier=0.8", "privacy.clip=0.1"],
}


@pytest.mark.mpi
def test_same_bits_on_one_two_and_three_ranks(tmp_path):
    runs = {ranks: final_models(ranks, tmp_path, DP_CONFIGS) for ranks in (1, 2, 3)}
    for name in DP_CONFIGS:
        assert np.array_equal(runs[1][name], runs[2][name]), name
        assert np.array_equal(runs[1][name], runs[3][name]), name


@pytest.mark.mpi
@pytest.mark.parametrize("extra", [
    ["participation.pattern=p2", "privacy.mode=central", "privacy.noise_multiplier=0.7", "privacy.clip=0.05",
     "privacy.adaptive_quantile=0.3"],
    ["participation.pattern=markov", "privacy.mode=central", "privacy.target_epsilon=20", "privacy.clip=0.1"],
], ids=["p2_adaptive", "markov_target"])
def test_sigkill_then_resume_is_bit_identical_epsilon_included(tmp_path, extra):
    extra = [*extra, "checkpoint.every=1"]
    rounds = 60
    run_ranks(2, train_args(tmp_path / "whole", rounds, extra))
    kill_after(train_args(tmp_path / "cut", rounds, extra), tmp_path / "cut", 25)
    assert final_state(tmp_path / "cut")["meta/round"] < rounds
    run_ranks(2, train_args(tmp_path / "cut", rounds, extra, resume=True))
    a, b = final_state(tmp_path / "whole"), final_state(tmp_path / "cut")
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert metrics(tmp_path / "whole") == metrics(tmp_path / "cut")
    eps = [r["epsilon"] for r in metrics(tmp_path / "whole")]
    assert eps == sorted(eps) and eps[0] > 0
    for run in ("whole", "cut"):  # the accountant's state, read back with plain h5py
        with h5py.File(sorted((tmp_path / run).glob("ckpt_*.h5"))[-1], "r") as f:
            assert f["privacy/q"].shape == (rounds,) and f["privacy/counts"].shape == (7, 1)
            assert int(f["privacy/counts"][()].sum()) == sum(r["active_clients"] for r in metrics(tmp_path / run))


def test_epsilon_reaches_tensorboard_and_mlflow_as_in_metrics_jsonl(tmp_path):
    """A private run with both sinks on: TensorBoard's reader and the MLflow store hold the same epsilon per
    round as metrics.jsonl (and it grows), and the sigma in use (calibrated: the config says null) is in
    runtime.json, MLflow's parameters and every round's record (so TensorBoard's scalars)."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    fedrun.run({}, [*BASE, "run.rounds=3", f"run.dir={run_dir}", "privacy.mode=central",
                    "privacy.target_epsilon=3", "participation.pattern=p2", "metrics.tensorboard=true",
                    f"metrics.mlflow=sqlite:///{tmp_path / 'mlflow.db'}"])
    want = [r["epsilon"] for r in metrics(run_dir)]
    sigma = json.loads((run_dir / "runtime.json").read_text())["privacy"]["noise_multiplier"]
    assert sigma > 0 and [r["noise_multiplier"] for r in metrics(run_dir)] == [sigma] * 3  # the calibrated sigma
    assert len(want) == 3 and 0 < want[0] < want[1] < want[2]
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("epsilon")] == \
        [(r, pytest.approx(w, rel=1e-6)) for r, w in zip((1, 2, 3), want, strict=True)]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    assert json.loads(client.get_run(run_id).data.params["privacy.noise_multiplier"]) == sigma  # not null
    assert [e.value for e in events.Scalars("noise_multiplier")] == [pytest.approx(sigma, rel=1e-6)] * 3
    history = sorted(client.get_metric_history(run_id, "epsilon"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == [(r, pytest.approx(w)) for r, w in zip((1, 2, 3), want, strict=True)]


def test_a_resume_that_recalibrates_accounts_the_sigma_each_round_used_and_stops_at_the_budget(tmp_path):
    """cyclic, target_epsilon=5 for 10 rounds, then run.rounds=30 --resume auto (issue 42): the resume
    calibrates a larger sigma for 30 rounds, but rounds 1-10 used the first sigma and already spent the
    budget, so no round runs and epsilon stays the one of the 10 rounds run (today: 20 more rounds, epsilon
    reported from the new sigma's cached vectors at the old sigma's noise)."""
    run_dir = tmp_path / "run"
    cfg = [*BASE, f"run.dir={run_dir}", "participation.pattern=cyclic", "privacy.mode=central",
           "privacy.target_epsilon=5", "eval.every=0"]
    first = fedrun.run({}, [*cfg, "run.rounds=10"])
    eps = [r["epsilon"] for r in first.metrics]
    assert len(eps) == 10 and 4.9 < eps[-1] <= 5 * (1 + 1e-9)
    again = fedrun.run({}, [*cfg, "run.rounds=30"], resume="auto")
    records = metrics(run_dir)
    assert len(records) == 10 and again.stopped and [r["epsilon"] for r in records] == eps
    sigma = records[0]["noise_multiplier"]
    assert {r["noise_multiplier"] for r in records} == {sigma}
    acc = rdp.RdpAccountant()  # every client of a 20-client cyclic run with 4 a round joined twice in 10 rounds
    acc.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(sigma), 2))
    assert eps[-1] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)


def test_adaptive_clipping_counts_the_shifted_b_whose_sensitivity_is_one_half():
    """Adding one client, within the clip or not, moves the noised sum sum_i (b_i - 1/2) + N(0, sigma_b^2) by
    exactly +-1/2 (Andrew et al.'s shift), the sensitivity sigma_u's formula assumes; read back from
    C_{t+1} = C_t exp(-eta_C (b_t - gamma)), b_t = that sum / m + 1/2, with the round's noise held fixed
    (today's unshifted count moves by 1 or 0: 2.84 reported against a true 5.03)."""
    fed = federation(load_config(None, [*BASE, "participation.pattern=p2", "privacy.mode=central",
                                        "privacy.noise_multiplier=1.1", "privacy.adaptive_quantile=0.5"]))
    privacy, m, t = fed.setup.privacy, 4, 3

    def noised_sum(within: int, reported: int) -> float:
        privacy._count = float(within)
        log_ratio = math.log(privacy.next_clip(1.0, m, reported, t))
        return m * (-log_ratio / 0.2 + 0.5 - 0.5)  # m (b_t - gamma) with gamma = 1/2: the noised shifted sum

    base = noised_sum(2, 3)
    assert noised_sum(3, 4) - base == pytest.approx(0.5, abs=1e-12)  # one more client within the clip
    assert noised_sum(2, 4) - base == pytest.approx(-0.5, abs=1e-12)  # one more client outside it
    sigma_u, sigma_b = privacy.update_multiplier(m), privacy.count_noise(m)
    assert sigma_u ** -2 + (2 * sigma_b) ** -2 == pytest.approx(1.1 ** -2, rel=1e-12)


def test_an_empty_round_under_a_fixed_pattern_with_adaptive_clipping_runs():
    """markov with probability 0.0005: most rounds have nobody; the adaptive clip keeps C_t through them
    (today: ZeroDivisionError)."""
    result = fedrun.run({}, [*BASE, "run.rounds=4", "participation.pattern=markov", "participation.probability=0.0005",
                             "privacy.mode=central", "privacy.noise_multiplier=1.1", "privacy.adaptive_quantile=0.5",
                             "privacy.clip=0.3"], write_files=False)
    assert len(result.metrics) == 4 and 0 in [r["active_clients"] for r in result.metrics]
    for before, now in zip([{"clip": 0.3}, *result.metrics], result.metrics, strict=False):
        if now["active_clients"] == 0:
            assert now["clip"] == before["clip"]


@pytest.mark.parametrize("override, needle", [("privacy.target_epsilon=1e15", "privacy.target_epsilon"),
                                              ("privacy.noise_multiplier=1e300", "privacy.noise_multiplier")])
def test_absurd_privacy_values_are_refused_at_the_door(override, needle):
    proc = subprocess.run([sys.executable, "-m", "fedrun", "train", "--quiet", "run.dir=/nonexistent/never", *BASE,
                           "privacy.mode=central", override], capture_output=True, text=True, env=child_env(), cwd=REPO)
    assert one_line_problems(proc.returncode, proc.stderr, needle) == [], proc.stderr


def forge(path, name: str, value: np.ndarray) -> None:
    """Rewrite dataset ``name`` of checkpoint ``path`` with ``value`` and a matching crc32 (issue 46's forger)."""
    import zlib
    with h5py.File(path, "r+") as f:
        f[name][...] = value
        f[name].attrs["crc32"] = np.uint32(zlib.crc32(np.ascontiguousarray(f[name][()]).tobytes()))


@pytest.mark.parametrize("name, value, needle", [("privacy/sigma", np.float64(50.0), "privacy/sigma is 50.0"),
                                                 ("privacy/q", np.array([0.2, 0.01, 0.2]), "privacy/q[1]")])
def test_a_forged_privacy_state_is_refused_on_resume(tmp_path, name, value, needle):
    """privacy/sigma rewritten to 50 (or a round's q lowered) with a recomputed CRC: the resume checks the state
    against the config that wrote it and refuses with one line, status 2, writing nothing (issue 46: epsilon
    fell from 4.1 to 0.04)."""
    run_dir = tmp_path / "run"
    args = [*BASE, f"run.dir={run_dir}", "participation.pattern=p2", "privacy.mode=central",
            "privacy.noise_multiplier=1.1"]
    fedrun.run({}, [*args, "run.rounds=3"])
    ckpt = sorted(run_dir.glob("ckpt_*.h5"))[-1]
    forge(ckpt, name, value)
    before = sorted(p.name for p in run_dir.iterdir())
    proc = subprocess.run([sys.executable, "-m", "fedrun", "train", "--quiet", "--resume", "auto", *args,
                           "run.rounds=6"], capture_output=True, text=True, env=child_env(), cwd=REPO)
    assert one_line_problems(proc.returncode, proc.stderr, needle) == [], proc.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == before


def test_runtime_json_states_the_guarantee_and_secure_noise_cannot_be_regenerated(tmp_path):
    """runtime.json's privacy section names the unit, the neighbouring relation and the sigma in use, and
    marks the metrics that are not private (under Poisson: the cohort size too). With privacy.secure_noise the
    noise is still N(0, sigma^2 C^2) but not the noise run.seed gives, and the run says it is not
    reproducible (issue 42)."""
    cfg = ["data.name=synthetic", "data.synthetic.shape=[80]", "data.num_clients=10", "model.name=logistic",
           "run.dtype=float64", "local.lr=0", "local.steps=1", "eval.every=0", "participation.clients_per_round=5",
           "run.rounds=1", "local.strategy=sequential", "privacy.mode=central", "privacy.noise_multiplier=1.7",
           "privacy.clip=0.3"]
    x0 = fedrun.run({}, [*cfg, "privacy.mode=none"], write_files=False).x
    seeded = fedrun.run({}, [*cfg, f"run.dir={tmp_path / 'seeded'}"]).x
    secure = fedrun.run({}, [*cfg, f"run.dir={tmp_path / 'secure'}", "privacy.secure_noise=true"]).x
    z = (secure - x0) * 5
    assert stats.kstest(z, "norm", args=(0, 1.7 * 0.3)).pvalue > 1e-3
    assert not np.array_equal(secure, seeded)  # drawn from the OS's entropy: not the seed's draw
    facts = {run: json.loads((tmp_path / run / "runtime.json").read_text())["privacy"] for run in ("seeded", "secure")}
    assert facts["seeded"]["reproducible"] is True and "simulation, not a deployment" in facts["seeded"]["noise"]
    assert facts["secure"]["reproducible"] is False and "not reproducible" in facts["secure"]["noise"]
    assert facts["seeded"]["unit"].startswith("client") and facts["seeded"]["noise_multiplier"] == 1.7
    assert facts["seeded"]["sampling"] == "without_replacement" and "replace-one" in facts["seeded"]["neighbouring"]
    assert facts["seeded"]["not_private_metrics"] == ["train_loss"]
    poisson = fedrun.run({}, [*cfg, f"run.dir={tmp_path / 'p2'}", "participation.pattern=p2"])
    facts = json.loads((tmp_path / "p2" / "runtime.json").read_text())["privacy"]
    assert "add/remove" in facts["neighbouring"] and "active_clients" in facts["not_private_metrics"]
    assert set(facts["not_private_metrics"]) <= set(poisson.metrics[0])


def test_progress_line_shows_epsilon_and_start_up_warns_when_noise_drowns_the_update(capsys):
    """The noise's expected norm sigma sqrt(d) / m against the mean update's (at most C): d = 810 and sigma 1.7
    give 9.7 with 5 clients a round (no warning at the bound 10) and 24 with 2 (a warning)."""
    cfg = ["data.name=synthetic", "data.synthetic.shape=[80]", "data.num_clients=10", "model.name=logistic",
           "local.steps=1", "eval.every=0", "run.rounds=2", "privacy.mode=central", "privacy.noise_multiplier=1.7"]
    for cohort, warned in ((5, False), (2, True)):
        fedrun.run({}, [*cfg, f"participation.clients_per_round={cohort}"], write_files=False, progress=True)
        out = capsys.readouterr().out
        assert ("noise's expected norm is 24 times" in out) == warned, out
        assert "round 2/2 | loss" in out and " | epsilon " in out


PLUGIN = '''
import numpy as np
from fedrun.federation.participation import Participation


class Claimed(Participation):
    """Declares poisson sampling; draws the first 4 clients every round and gives no probabilities."""
    name, sampling = "claimed", "poisson"

    def _draw(self, t):
        return np.arange(self.num_clients) < 4


class Lying(Claimed):
    """Declares poisson sampling with probability 0 for the clients it draws."""
    name = "lying"

    def probabilities(self, t):
        return np.where(np.arange(self.num_clients) < 4, 0.0, 0.5)
'''


def test_a_plugin_declaring_poisson_sampling_earns_amplification_only_with_checkable_probabilities(
        tmp_path, monkeypatch, capsys):
    """Without probabilities(t) the runtime cannot check the declaration: no amplification (said at start-up;
    epsilon is the worst client's composition); with probabilities that contradict the draws: one line."""
    (tmp_path / "claimedpattern.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    common = [*BASE, "run.rounds=3", "privacy.mode=central", f"privacy.noise_multiplier={SIGMA}"]
    result = fedrun.run({}, [*common, "participation.pattern=claimedpattern:Claimed"], write_files=False,
                        progress=True)
    assert "declares poisson sampling but its probabilities(t) is not" in capsys.readouterr().out
    acc = rdp.RdpAccountant()
    acc.compose(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(SIGMA), 3))
    assert result.metrics[-1]["epsilon"] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)
    with pytest.raises(ConfigError, match="declares poisson sampling, but in round 1 some participants have"):
        fedrun.run({}, [*common, "participation.pattern=claimedpattern:Lying"], write_files=False)
