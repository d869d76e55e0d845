"""The claims file of the results page (experiments/claims.py, experiments/fmnist_claims.py): Holm's
step-down adjustment against a hand-computed case, the verdict rules, and docs/results/claims.json
regenerated from the committed run files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))  # the experiments' home
import claims  # noqa: E402
import stats  # noqa: E402


def test_holm_step_down_by_hand():
    # sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> the running max 0.06);
    # the None has no p and does not count in m = 4
    assert stats.holm([0.01, 0.04, 0.03, None, 0.005]) == pytest.approx([0.03, 0.06, 0.06, None, 0.02])
    # capped at 1, and a single p is its own adjustment
    assert stats.holm([0.5, 0.6, 0.9]) == pytest.approx([1.0, 1.0, 1.0])
    assert stats.holm([0.2]) == [0.2]
    # m = 10 with the smallest ten-seed Wilcoxon p, 2/1024: 10 x 0.00195 = 0.0195
    assert stats.holm([2 / 1024] + [0.5] * 9)[0] == pytest.approx(10 * 2 / 1024)


def test_holm_controls_the_family_wise_error_on_null_p_values():
    # under the null, p ~ U(0, 1): Holm at 0.05 rejects anything in at most about 5% of families
    rng = np.random.default_rng(0)
    rejected = sum(min(stats.holm(list(rng.uniform(size=20)))) <= 0.05 for _ in range(2000))
    assert rejected / 2000 <= 0.06


@pytest.mark.parametrize(("kind", "ci", "margin", "null", "word"), [
    ("greater", (0.01, 0.05), None, 0.0, "reproduces"),
    ("greater", (-0.05, -0.01), None, 0.0, "does not reproduce"),
    ("greater", (-0.01, 0.05), None, 0.0, "inconclusive"),
    ("less", (-0.05, -0.01), None, 0.0, "reproduces"),
    ("less", (0.2, 0.9), None, 1.0, "reproduces"),  # an sd ratio below 1
    ("less", (0.8, 1.4), None, 1.0, "inconclusive"),
    ("greater", (-0.015, 0.03), 0.02, 0.0, "reproduces"),  # non-inferiority: above -margin
    ("greater", (-0.05, -0.025), 0.02, 0.0, "does not reproduce"),
    ("equivalent", (-0.015, 0.01), 0.02, 0.0, "reproduces"),
    ("equivalent", (-0.125, -0.004), 0.02, 0.0, "inconclusive"),  # H.4's Case 2 - Case 1
    ("equivalent", (0.03, 0.08), 0.02, 0.0, "does not reproduce"),
    ("greater", (float("nan"), float("nan")), None, 0.0, "inconclusive"),
])
def test_verdict_from_the_interval_only(kind, ci, margin, null, word):
    assert claims.judge(kind, ci, null, margin) == word


def test_a_run_files_value_at_a_round():
    r = {"finite": True, "eval_rounds": [25, 50], "test_accuracy": [0.4, 0.6], "train_objective": 0.7,
         "eval_cum_uplink": [10.0, 20.0], "eval_cum_downlink": [10.0, 20.0]}
    assert claims.value(r, "test_accuracy", 25) == 0.4 and claims.value(r, "test_accuracy", "final") == 0.6
    assert claims.value(r, "train_objective", "final") == 0.7
    assert claims.value(r, "budget_accuracy", "final", 30.0) == pytest.approx(0.5)
    assert claims.value(r, "budget_accuracy", "final", 10.0) == pytest.approx(0.1 + 0.5 * 0.3)  # from chance
    diverged = {"finite": False, "test_accuracy": [], "train_objective": None}
    assert claims.value(diverged, "test_accuracy", "final") == claims.CHANCE
    assert claims.value(diverged, "train_objective", "final") is None
    with pytest.raises(ValueError, match="final value"):
        claims.value(r, "train_objective", 25)


def test_an_sd_ratio_interval_covers_a_known_ratio():
    rng = np.random.default_rng(3)
    a = dict(enumerate(rng.normal(0, 1, 40)))
    b = dict(enumerate(rng.normal(0, 4, 40)))
    s = stats.sd_ratio(a, b)
    assert s.ci[0] < s.ratio < s.ci[1] and s.ci[1] < 1 and s.ci[0] < 0.25 < s.ci[1]


NUMBERS = ("delta", "ci95", "p_wilcoxon", "p_holm")


def _floats(v) -> np.ndarray:
    return np.asarray([np.nan if x is None else x for x in (v if isinstance(v, list) else [v])], dtype=float)


def test_the_committed_claims_file_is_what_the_committed_run_files_give():
    from fmnist_claims import page_claims

    committed = json.loads(claims.CLAIMS.read_text())
    specs = page_claims()
    entries = claims.build(specs)
    assert [e["id"] for e in entries] == [e["id"] for e in committed]
    for new, old in zip(entries, committed, strict=True):
        assert list(new) == list(claims.FIELDS)
        for key in claims.FIELDS:
            if key in NUMBERS:  # the same numbers up to rounding; None (no value) where None
                np.testing.assert_allclose(_floats(new[key]), _floats(old[key]), rtol=1e-9, atol=1e-12,
                                           err_msg=f"{new['id']} {key}")
            else:
                assert new[key] == old[key], (new["id"], key)
    # a claim whose run files are missing is "pending" with the command that runs them, and only such a claim
    assert [e["verdict"] == claims.PENDING for e in entries] == [s.role != claims.NOT_RUN and bool(s.missing())
                                                                for s in specs]
    assert all(e["command"] for e in entries if e["verdict"] == claims.PENDING)
    # every seed-paired entry names 10 paired run files that exist (an interaction four lists), a "not run"
    # entry none, an escape entry its one analysis file; and the page renders from the file
    for e in committed:
        if e["verdict"] == claims.NOT_RUN:
            assert e["a"] == e["b"] == [] and e["reason"] and e["delta"] is None
        elif e["verdict"] == claims.PENDING:
            assert e["delta"] is None and e["p_wilcoxon"] is None and e["reason"]
        elif e["metric"].startswith("escape_"):
            assert len(e["a"]) == 1 and (claims.REPO / e["a"][0]).is_file()
        else:
            assert len(e["a"]) == len(e["b"]) == 10 and len(e["c"]) == len(e["d"]) in (0, 10), e["id"]
    page = (claims.REPO / "docs" / "results.md").read_text()
    assert claims.render(committed).strip() in page


def test_the_opponent_rule_and_the_page_that_states_it():
    """Every entry whose opponent diverged, collapsed or trails FedAvg by more than OPPONENT_MARGIN is
    "not evidence" with that reason, whatever its interval says; every other entry's verdict is its
    interval's; the page states the rule and the Holm family it computes."""
    committed = json.loads(claims.CLAIMS.read_text())
    for e in committed:
        o = e["opponent"]
        unfair = bool(o) and (o["diverged"] + o["collapsed"] > 0 or (
            o["mean_gap_to_fedavg"] is not None and o["mean_gap_to_fedavg"] < -claims.OPPONENT_MARGIN))
        if unfair:
            assert e["verdict"] == claims.NOT_EVIDENCE and o["name"] in e["reason"], e["id"]
        elif e["verdict"] not in (claims.NOT_RUN, claims.PENDING):
            assert e["verdict"] == e["interval_verdict"], e["id"]
    # the examples: SCAFFOLD diverged in 6 of 10 seeds under P1; FedAWE trails FedAvg by ~20 points
    scaffold = next(e for e in committed if e["id"] == "fig1a-faster-final/P1/FedSUM-vs-SCAFFOLD")
    assert scaffold["opponent"]["diverged"] == 6 and scaffold["verdict"] == claims.NOT_EVIDENCE
    awe = next(e for e in committed if e["id"] == "fig1a-faster-final/P1/FedSUM-vs-FedAWE")
    assert awe["opponent"]["mean_gap_to_fedavg"] < -0.15 and any("r = 0.5" in d for d in awe["deviations"])
    page = (claims.REPO / "docs" / "results.md").read_text()
    m = sum(e["p_wilcoxon"] is not None for e in committed)
    assert f"{m} with a Wilcoxon p" in page and f"{m * 2 / 1024:.2f}" in page
    assert f"more than {100 * claims.OPPONENT_MARGIN:g} points below FedAvg" in page


def test_every_fedsum_family_row_lists_the_reconstruction_and_probe_arms_are_rows():
    from fmnist_claims import RECONSTRUCTION

    committed = json.loads(claims.CLAIMS.read_text())
    family = [e for e in committed if e["seed"].startswith("001_") and e["verdict"] != claims.NOT_RUN]
    assert family and all(RECONSTRUCTION in e["deviations"] for e in family)
    probes = [e for e in committed if e["role"] == "probe"]
    assert {e["id"] for e in probes} >= {"probe/P2/FedSUM-no-K-vs-MIFA", "probe/P3/FedSUM-no-K-vs-MIFA"}
    assert all(e["verdict"] in claims.VERDICTS and e["kind"] == "greater" for e in probes)
    same_loss = [e for e in committed if e["id"].startswith("flatness-same-loss/")]
    assert same_loss and all(e["role"] == "exploratory" and e["round"] == "common loss" for e in same_loss)
    assert all(37 <= r <= 60 for e in same_loss for r in [*e["measured_rounds"]["a"], *e["measured_rounds"]["b"]])


def test_margin_power_by_the_t_quantiles():
    # sd 0.05, margin 0.02: n is the first with (t_0.975 + t_0.90) sd / sqrt(n) <= margin (equivalence)
    from scipy.stats import t

    d = list(np.random.default_rng(0).normal(0, 0.05, 10))
    p = claims.power("equivalent", d, 0.02)
    sd, n = p["sd_of_differences"], p["seeds_needed"]
    assert sd == pytest.approx(np.std(d, ddof=1))
    assert (t.ppf(0.975, n - 1) + t.ppf(0.9, n - 1)) * sd / np.sqrt(n) <= 0.02
    assert (t.ppf(0.975, n - 2) + t.ppf(0.9, n - 2)) * sd / np.sqrt(n - 1) > 0.02
    assert claims.power("greater", d, 0.02)["seeds_needed"] < n  # one side needs fewer


def test_curve_statistics_from_a_run_file():
    r = {"finite": True, "eval_rounds": [25, 50], "test_accuracy": [0.5, 0.9],
         "train_loss": [1.0, np.e, 1.0, np.e], "eval_cum_uplink": [10.0, 20.0], "eval_cum_downlink": [30.0, 60.0],
         "active_clients": [2, 2, 2, 2]}
    slow = dict(r, test_accuracy=[0.3, 0.7])
    # the target is the lower final accuracy, 0.7: r crosses it halfway between 25 and 50, slow at 50
    assert claims.rounds_to_target(r, slow) == pytest.approx((37.5, 50.0))
    assert claims.rounds_to_target(r, {"finite": False}) == (None, None)
    assert claims.value(r, "within_run_change", "final") == pytest.approx(1.0)  # |ln e - ln 1| every round
    assert claims.value(r, "uplink_per_client", "whole run") == pytest.approx(20.0 / 8)
    assert claims.value(r, "floats_per_client", "whole run") == pytest.approx(80.0 / 8)


def test_the_stages_for_the_claims_as_stated_resolve_to_valid_configs():
    """case2p_constant, family128 and probe: every run's base config plus overrides is a valid config
    with the conditions its claim states (read, not run)."""
    import fmnist_runs as fr

    from fedrun.config import apply_override, config_from_dict

    def cfg(s: dict):
        d = fr.base_config(fr.REPO / s["base"])
        for item in s["overrides"]:
            apply_override(d, item)
        return config_from_dict(d)

    for s in fr.case2p_constant_specs():
        c = cfg(s)
        assert (c.local.lr, c.local.lr_schedule, c.algorithm.hparams.global_lr) == (0.01, "constant", 1.0)
        assert c.participation.pattern == "bernoulli" and c.participation.probability in fr.CASE2_PROBABILITIES
    for s in fr.family128_specs():
        c = cfg(s)
        assert (c.local.batch_size, c.local.lr, c.local.lr_schedule) == (128, 0.1, "constant")
    arms = {}
    for s in fr.probe_specs():
        c = cfg(s)
        arms[s["label"]] = (c.data.num_clients, c.local.steps, c.local.batch_size, c.local.lr,
                            c.algorithm.hparams.global_lr, getattr(c.algorithm.hparams, "skip_empty_rounds", None))
    assert arms == {"FedSUM no-K": (20, 5, 32, 0.3, 0.2, False), "FedSUM skip-empty": (20, 5, 32, 0.3, 1.0, True),
                    "FedSUM N=100": (100, 5, 32, 0.3, 1.0, False), "MIFA N=100": (100, 5, 32, 0.3, 1.0, None)}
    assert len(fr.case2p_constant_specs()) == 50 and len(fr.family128_specs()) == 90 and len(fr.probe_specs()) == 80
    # the fifth round's steps: the paper's eta_0 grid (FedAvg only), beta2 i.i.d., batch 16, FAFED at full
    assert {cfg(s).local.lr for s in fr.paper_grid_tune_specs()} == set(fr.PAPER_LR_GRID)
    assert fr.paper_grid_lr() in fr.PAPER_LR_GRID
    assert {cfg(s).local.lr for s in fr.paper_grid_specs()} == {fr.paper_grid_lr()}
    assert all(cfg(s).data.partition == "iid" for s in fr.ablation_iid_specs())
    assert all((cfg(s).local.batch_size, cfg(s).local.lr, cfg(s).local.lr_schedule) == (16, 0.1, "constant")
               for s in fr.family_small_batch_specs())
    assert all(cfg(s).participation.pattern == "full" and cfg(s).algorithm.name == "fafed"
               for s in fr.fafed_full_specs())
