"""Corrupted clients (the ``corruption`` section, fedrun/federation/corruption.py): the runtime replaces
the chosen clients' model-delta uploads, round by round exactly as documented, on the float64
least-squares task; bad settings are one line naming the field."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import config, federation, local_deltas, per_round, resolve

from fedrun.errors import ConfigError
from fedrun.federation.corruption import STREAM, Corruption
from fedrun.privacy.mechanism import Privacy


@pytest.mark.parametrize("kind, algorithm", [("sign_flip", "fedavg"), ("gaussian", "fedavg"),
                                             ("sign_flip", "fedmedian")])
def test_corrupted_uploads_round_by_round(kind, algorithm):
    cfg = config(algorithm, f"corruption.kind={kind}", "corruption.clients=[1, 4]", "corruption.scale=3.0")
    seed, rounds = resolve(cfg).run.seed, 8
    fed = federation(cfg)
    x = fed.global_model().numpy().copy()
    everyone = np.arange(resolve(cfg).data.num_clients)
    for t, x_next in enumerate(per_round(fed, rounds)):
        deltas = local_deltas(cfg, x, everyone)
        for i in (1, 4):
            deltas[i] = (-3.0 * deltas[i] if kind == "sign_flip"
                         else 3.0 * np.random.default_rng([seed, t, i, STREAM]).standard_normal(deltas.shape[1]))
        x = x + (np.median(deltas, axis=0) if algorithm == "fedmedian" else deltas.mean(axis=0))
        np.testing.assert_allclose(x_next, x, rtol=0, atol=1e-12, err_msg=f"round {t + 1}")


def test_fraction_picks_round_fraction_n_clients_from_the_seed():
    def mask(fed):
        return next(t for t in fed.setup.round.trainer.transforms if isinstance(t, Corruption)).mask

    a = mask(federation(config("fedavg", "corruption.kind=sign_flip", "corruption.fraction=0.5")))
    b = mask(federation(config("fedavg", "corruption.kind=sign_flip", "corruption.fraction=0.5")))
    c = federation(config("fedavg", "corruption.kind=sign_flip", "corruption.fraction=0.5", "run.seed=7"))
    assert a.sum() == 3 and np.array_equal(a, b) and mask(c).sum() == 3


@pytest.mark.parametrize("overrides, message", [
    (["corruption.kind=gaussian"], "corruption.kind: expected none, or corruption.clients"),
    (["corruption.kind=gaussian", "corruption.clients=[1]", "corruption.fraction=0.5"],
     "corruption.fraction: expected 0 when corruption.clients lists the clients"),
    (["corruption.kind=flip", "corruption.clients=[1]"], "corruption.kind: expected one of none, sign_flip, gaussian"),
    (["corruption.kind=gaussian", "corruption.clients=[6]"], "corruption.clients: expected client ids below"),
    (["corruption.kind=gaussian", "corruption.clients=[1]", "algorithm.name=scaffold"],
     "corruption.kind=gaussian: algorithm scaffold declares no model-delta upload"),
])
def test_bad_corruption_settings_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match="^" + message.replace("[", r"\[")):
        federation(config("fedavg", *overrides))


def test_corruption_and_privacy_are_upload_transforms_applied_in_order():
    """The run's upload transforms, built once: none without ``corruption`` and ``privacy``; with both,
    corruption then privacy, in the trainer and the round alike. So a corrupted upload is clipped like any
    other, round by round: x_{t+1} = x_t + mean_i clip(corrupt(Delta_i)) (central mode with sigma = 0)."""
    assert federation(config("fedavg")).setup.round.transforms == []
    clip = 0.05
    cfg = config("fedavg", "corruption.kind=gaussian", "corruption.clients=[1, 4]", "corruption.scale=3.0",
                 "privacy.mode=central", "privacy.noise_multiplier=0", f"privacy.clip={clip}")
    seed = resolve(cfg).run.seed
    fed = federation(cfg)
    transforms = fed.setup.round.transforms
    assert [type(t) for t in transforms] == [Corruption, Privacy] and fed.setup.round.trainer.transforms == transforms
    x = fed.global_model().numpy().copy()
    everyone = np.arange(resolve(cfg).data.num_clients)
    for t, x_next in enumerate(per_round(fed, 4)):
        deltas = local_deltas(cfg, x, everyone)
        for i in (1, 4):
            deltas[i] = 3.0 * np.random.default_rng([seed, t, i, STREAM]).standard_normal(deltas.shape[1])
        norms = np.linalg.norm(deltas, axis=1, keepdims=True)
        x = x + (deltas * np.minimum(1.0, clip / norms)).mean(axis=0)
        np.testing.assert_allclose(x_next, x, rtol=0, atol=1e-12, err_msg=f"round {t + 1}")
