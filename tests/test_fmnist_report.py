"""The results page's report (experiments/fmnist_report.py): diverged and collapsed runs, the budget
interpolation and the copy of the table blocks into the page."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))  # the experiments' home
import fmnist_report as fr  # noqa: E402


def run(acc, objective=0.5, finite=True) -> dict:
    return {"finite": finite, "test_accuracy": acc if finite else [],
            "test_loss": [1 - a for a in acc] if finite else [], "train_objective": objective if finite else None,
            "eval_cum_uplink": [50.0, 100.0, 150.0, 200.0],
            "eval_cum_downlink": [50.0, 100.0, 150.0, 200.0]}


def test_a_diverged_run_is_chance_accuracy_and_has_no_objective():
    r = run([0.5], finite=False)
    assert fr.metric(r, "test_accuracy") == fr.CHANCE == fr.metric(r, "best_accuracy")
    assert fr.metric(r, "train_objective") is None and fr.metric(r, "test_loss") is None
    ok = run([0.4, 0.7, 0.6, 0.65])
    assert (fr.metric(ok, "test_accuracy"), fr.metric(ok, "first_accuracy"), fr.metric(ok, "best_accuracy")) == (
        0.65, 0.4, 0.7)


def test_accuracy_at_a_budget_is_interpolated_between_evaluations():
    r = run([0.5, 0.6, 0.7, 0.8])  # evaluations at 100, 200, 300, 400 floats in all
    assert fr.acc_at_budget(r, 250.0) == pytest.approx(0.65)
    assert fr.acc_at_budget(r, 50.0) == pytest.approx(0.1 + 0.5 * (0.5 - 0.1))  # from chance at 0 floats
    assert fr.acc_at_budget(r, 400.0) == pytest.approx(0.8)
    assert fr.acc_at_budget(r, 401.0) is None
    assert fr.acc_at_budget(run([0.5], finite=False), 250.0) == fr.CHANCE


def test_collapsed_runs_are_flagged_beside_the_mean():
    runs = {0: run([0.5, 0.6, 0.7, 0.8]), 1: run([0.3, 0.1, 0.1, 0.1]), 2: run([0.5], finite=False)}
    assert fr.acc_cell(runs) == "33.3 ± 40.4 ⚠ 1 diverged, 1 collapsed"
    assert fr.acc_cell({0: run([0.5, 0.6, 0.7, 0.8])}) == "80.0"


def test_fill_page_copies_blocks_between_markers_only(tmp_path):
    page = tmp_path / "results.md"
    page.write_text("intro\n<!-- tables.md: a -->\nold a\n<!-- end a -->\nmiddle\n<!-- tables.md: b -->\n"
                    "<!-- end b -->\nend\n")
    assert fr.fill_page({"a": "| x |\n", "b": "pending: 1 of 2 runs finished", "c": "unused"}, page) == ["a", "b"]
    assert page.read_text() == ("intro\n<!-- tables.md: a -->\n\n| x |\n\n<!-- end a -->\nmiddle\n"
                                "<!-- tables.md: b -->\n\npending: 1 of 2 runs finished\n\n<!-- end b -->\nend\n")
    before = page.read_text()
    fr.fill_page({"a": "| x |\n", "b": "pending: 1 of 2 runs finished"}, page)
    assert page.read_text() == before  # a second copy changes nothing
    with pytest.raises(SystemExit, match="unknown table blocks"):
        fr.fill_page({"a": "x"}, page)
    assert page.read_text() == before
