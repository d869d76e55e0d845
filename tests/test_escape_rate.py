"""The escape-rate experiment: its server rules, the test function, the estimator and its controls."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedrun.algorithms import get_algorithm
from fedrun.algorithms.base import RoundContext
from fedrun.errors import ConfigError
from fedrun.state.store import init_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))  # the experiments' home
import escape_rate as er  # noqa: E402
import momentum_neutrality as mn  # noqa: E402


def small(**kw) -> er.EscapeConfig:
    base = dict(ks=[1.0, 2.0, 3.0], particles=40, max_rounds=300)
    return er.EscapeConfig(**{**base, **kw})


def test_server_rules_are_fedruns():
    rng = np.random.default_rng(0)
    deltas = rng.normal(size=(12, 3, 4))  # rounds, particles, d
    for name in ("fedavgm", "fedadam", "fedadamom"):
        hp = er.EscapeConfig().hparams(name)
        cls = get_algorithm(name)
        extra = {"v_init": "zero"} if name == "fedadam" else {}
        alg = cls(cls.Hparams(**hp, **extra))
        x = torch.zeros((3, 4), dtype=torch.float64)
        s = er.server_init(name, x, hp)
        servers = [init_server(alg.declare().server, torch.zeros(4, dtype=torch.float64)) for _ in range(3)]
        for t, d in enumerate(deltas):
            x = er.server_step(name, x, s, torch.as_tensor(d), hp)
            ctx = RoundContext(round=t, lr=0.1, num_clients=1, num_active=1, local_steps=1, dim=4)
            for p in range(3):
                servers[p] = alg.server_update(servers[p], {"delta": torch.as_tensor(d[p])}, ctx)
                np.testing.assert_allclose(x[p].numpy(), servers[p]["x"].numpy(), rtol=1e-12, atol=1e-14)


def test_hparams_override_key_by_key_and_bad_keys_fail():
    cfg = er.load(None, ["fedadam.global_lr=0.2"])
    assert cfg.hparams("fedadam") == {**er.HPARAMS["fedadam"], "global_lr": 0.2}
    with pytest.raises(ConfigError, match="fedadam"):
        er.load(None, ["fedadam.lr=0.2"]).check()


def test_p_e1_fedadamom_at_d1_is_fedavg():
    cfg = small(dim=1, optimizers=["fedadamom", "fedavgm"], dtype="float64")
    cfg.fedavgm = {"global_lr": 1.0, "beta": 0.0}
    hits = er.first_passage(cfg)
    np.testing.assert_array_equal(hits["fedadamom"], hits["fedavgm"])


def test_p_e2_test_function():
    u = np.array([er.U_L, er.U_G, er.U_S])
    assert np.abs(er.st_grad(u)).max() < 1e-5
    np.testing.assert_allclose(er.st(u), [er.ST_L, er.ST_G, er.ST_S], atol=1e-6)
    for k in (1.0, 2.5):
        x = u / math.sqrt(k)
        assert np.abs(er.grad_fk(x, k)).max() < 1e-5 * math.sqrt(k)
        h = 1e-5
        hess = (er.grad_fk(x + h, k) - er.grad_fk(x - h, k)) / (2 * h)
        np.testing.assert_allclose(hess, k * er.st_hess(u), rtol=1e-6)
        np.testing.assert_allclose(er.st(np.sqrt(k) * x), er.st(u), atol=1e-12)  # barriers unchanged


def test_p_e3_estimator():
    rng = np.random.default_rng(1)
    gamma0, t_max, burn = 2e-3, 600, 20
    hits = np.minimum(burn + rng.exponential(1 / gamma0, size=4000).astype(np.int64), t_max)
    g, n, lo, hi = er.rate(hits, t_max, burn)
    assert abs(g - gamma0) < 3 * gamma0 / math.sqrt(n) and lo < gamma0 < hi


def test_p_e4_zero_noise_no_escapes():
    hits = er.first_passage(small(), sigma2=0.0)
    for h in hits.values():
        assert (h == 300).all()


@pytest.mark.xfail(strict=True, reason="FedAvg with server lr 1 escapes faster than FedAvgM(0.1, 0.9) at k = 2: "
                   "the per-round step eta_l K k H = 0.29 is not small; measured by experiments/momentum_neutrality.py "
                   "(docs/results/escape_rate/momentum_neutrality.json)")
def test_p_e5_momentum_neutrality():
    cfg = small(ks=[2.0], particles=300, max_rounds=600, optimizers=["fedavgm"])
    a = er.rate(er.first_passage(cfg)["fedavgm"][0], 600, 20)
    cfg.fedavgm = {"global_lr": 1.0, "beta": 0.0}
    b = er.rate(er.first_passage(cfg)["fedavgm"][0], 600, 20)
    assert a[1] >= 50 and b[1] >= 50
    assert a[2] <= b[3] and b[2] <= a[3]  # the 95% intervals overlap


def test_fit_recovers_a_known_exponent():
    ks = np.array([1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0])
    assert er.fit_exponent(ks, 2 + 5 * ks ** -1.0)["p"] == 1.0
    assert er.fit_exponent(ks, 2 + 5 * ks ** -0.5)["p"] == 0.5


def test_cli_runs(tmp_path):
    er.main(["--out", str(tmp_path), "ks=[1.0, 2.0, 3.0]", "particles=20", "max_rounds=100", "min_escapes=1"])
    assert (tmp_path / "escape_rate.json").exists() and (tmp_path / "escape_rate.png").exists()


def test_rate_ratio_interval():
    ratio, lo, hi = mn.rate_ratio(100, 1000.0, 100, 1000.0)
    assert ratio == 1.0 and lo < 1 < hi
    ratio, lo, hi = mn.rate_ratio(300, 1000.0, 100, 2000.0)  # rates 0.3 and 0.05
    assert ratio == pytest.approx(6.0) and 4.5 < lo < 6 < hi < 8


def test_momentum_neutrality_cli(tmp_path):
    out = tmp_path / "mn.json"
    mn.main(["--particles", "30", "--max-rounds", "300", "--out", str(out), "ks=[1.0]", "min_escapes=1"])
    r = json.loads(out.read_text())
    assert set(r["variants"]) == set(mn.VARIANTS) and r["k"] == 2.0
    assert all(v["escapes"] + v["early_escapes"] + v["censored"] + v["diverged"] == 30 for v in r["variants"].values())
