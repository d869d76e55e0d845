"""``fedrun reproduce CLAIM_ID``: every row of docs/results/claims.json resolves to commands whose configs
load, ``--print`` prints them, a real rerun of a row's first seed (up to its first evaluation) is set against
the committed record, and a rerun that differs from its record exits 1 and says where."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from helpers import REPO, run_ranks

from fedrun.config import load_config
from fedrun.errors import ConfigError
from fedrun.reproduce import load_rows, plan_row

CLAIMS = REPO / "docs" / "results" / "claims.json"
ROW = "fig1a-faster-r25/P1/FedSUM-vs-FedAvg"  # its first evaluation, round 25, is the claim's round


def fedrun_cli(*args: str, cwd: Path = REPO):
    return run_ranks(0, ["-m", "fedrun", *args], timeout=600, cwd=cwd, check=False)


def test_every_row_resolves_to_commands_whose_configs_load(monkeypatch):
    """Every row whose records name their runs resolves to a command per record; every seed-0 command's config
    loads (paths from the repository root); a flatness record's checkpoint was written by the run it names.
    A row with a record that names no run (an analysis of other files), or whose files are not there yet, is
    refused, naming its command."""
    monkeypatch.chdir(REPO)
    loaded: set[tuple[str, ...]] = set()
    resolved = 0
    for row in load_rows(CLAIMS):
        try:
            root, reruns = plan_row(row, CLAIMS, None, Path("runs/reproduce"), [])
        except ConfigError as exc:
            assert ("names no run" in str(exc) or "not yet run" in str(exc)) and \
                str(row.get("command", "")) in str(exc), (row["id"], exc)
            continue
        resolved += 1
        files = {f for side in "abcd" for f in row.get(side, [])}
        assert root == REPO and len(reruns) == len(files), row["id"]
        for r in reruns:
            train = r.commands[0]
            assert train[:2] == ("train", "--config") and f"run.dir={r.run_dir}" in train, r.record
            if "checkpoint" in r.fields:
                assert f"run.dir={Path(r.fields['checkpoint']).parent}" in r.fields["overrides"], r.record
                assert r.commands[1][:2] == ("flatness", f"{r.run_dir}/{Path(r.fields['checkpoint']).name}")
            if r.fields["seed"] == 0 and train not in loaded:
                loaded.add(train)
                load_config(train[2], [a for a in train[3:] if "=" in a])
    assert resolved > 150 and len(loaded) > 50


def test_print_lists_the_commands_of_the_chosen_seeds_and_runs_nothing(tmp_path):
    proc = fedrun_cli("reproduce", ROW, "--seeds", "0", "1", "--print", "--out", str(tmp_path / "r"))
    assert proc.returncode == 0, proc.stderr
    commands = [shlex.split(line) for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert len(commands) == 4 and all(c[:4] == ["python", "-m", "fedrun", "train"] for c in commands)
    assert [c for c in commands[0] if c.startswith(("run.seed", "run.dir"))] == [
        "run.seed=0", f"run.dir={tmp_path / 'r' / 'fmnist_10seeds/eta0.3/p1/FedSUM_s0'}"]
    assert not (tmp_path / "r").exists()
    bad = fedrun_cli("reproduce", "fig1a-faster-r25/P1/FedSUM-vs-FedAv", "--print")
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 1, bad.stderr
    assert lines[0].startswith("fedrun: error: fig1a-faster-r25/P1/FedSUM-vs-FedAv: no row of ") and \
        f"the nearest: {ROW}" in lines[0], lines


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").is_dir(),
                    reason="Debian package dataset-fashion-mnist not installed")
def test_a_row_reruns_its_first_seed_to_the_first_evaluation_and_compares_with_the_record(tmp_path):
    """The rerun's round-25 test accuracy is set against the committed one, exactly; whether they agree
    depends on the CPU kind (docs/results.md), so the test checks what the line says against the files."""
    out = tmp_path / "r"
    proc = fedrun_cli("reproduce", ROW, "--seeds", "0", "run.rounds=25", "--out", str(out))
    assert proc.returncode in (0, 1), proc.stderr
    for label in ("FedSUM", "FedAvg"):
        record = f"docs/results/fmnist_10seeds/eta0.3/p1/{label}_s0.json"
        want = json.loads((REPO / record).read_text())["test_accuracy"][0]
        got = [json.loads(line) for line in (out / f"fmnist_10seeds/eta0.3/p1/{label}_s0/metrics.jsonl")
               .read_text().splitlines()][-1]
        assert got["round"] == 25
        line = next(x for x in proc.stdout.splitlines() if x.startswith(f"{record}: "))
        if want == got["test_accuracy"]:
            assert line == f"{record}: the same as the record (test accuracy at round 25)"
        else:
            assert line == f"{record}: differs from the record: round 25: {want} -> {got['test_accuracy']}"


def test_a_rerun_that_differs_from_its_record_exits_1_and_one_that_matches_0(tmp_path):
    """A claims file of one row whose record is a 2-round quickstart run: first recorded with a wrong accuracy
    (exit 1, the round and both values named), then with the rerun's own (exit 0; the finished rerun is not
    run again)."""
    record = tmp_path / "docs" / "results" / "runs" / "tiny_s0.json"
    record.parent.mkdir(parents=True)
    fields = {"seed": 0, "base": str(REPO / "configs" / "quickstart.yaml"),
              "overrides": ["data.num_clients=6", "participation.clients_per_round=2", "local.steps=1",
                            "run.rounds=2", "eval.every=2", "run.dir=runs/tiny_s0"],
              "eval_rounds": [2], "test_accuracy": [-1.0], "new_field": "ignored"}
    record.write_text(json.dumps(fields))
    claims = record.parent.parent / "claims.json"
    (record.parent / "analysis.json").write_text('{"exponent": 1.0}')
    claims.write_text(json.dumps([{"id": "tiny", "a": ["docs/results/runs/tiny_s0.json"],
                                   "b": ["docs/results/runs/tiny_s0.json"], "verdict": "whatever"},
                                  {"id": "fit", "a": ["docs/results/runs/analysis.json"], "b": [],
                                   "command": "python experiments/fit.py"},
                                  {"id": "later", "a": ["docs/results/runs/tiny_s0.json"],
                                   "b": ["docs/results/runs/later_s0.json"], "command": "python experiments/x.py"}]))
    pending = fedrun_cli("reproduce", "later", "--print", "--claims", str(claims), cwd=tmp_path)
    assert pending.returncode == 2 and pending.stderr.strip() == (
        "fedrun: error: row later: 1 of its run files are not there yet (docs/results/runs/later_s0.json): the "
        "claim is not yet run; its row's command `python experiments/x.py` runs them"), pending.stderr
    refused = fedrun_cli("reproduce", "fit", "--print", "--claims", str(claims), cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "analysis.json: names no run" in refused.stderr and "`python experiments/fit.py`" in refused.stderr
    args = ("reproduce", "tiny", "--claims", str(claims))
    first = fedrun_cli(*args, cwd=tmp_path)
    run = tmp_path / "runs" / "reproduce" / "runs" / "tiny_s0"
    got = json.loads((run / "result.json").read_text())["test_accuracy"]
    assert first.returncode == 1 and f"docs/results/runs/tiny_s0.json: differs from the record: round 2: -1.0 -> " \
        f"{got}" in first.stdout, first.stdout + first.stderr
    record.write_text(json.dumps({**fields, "test_accuracy": [got]}))
    before = (run / "metrics.jsonl").read_text()
    second = fedrun_cli(*args, cwd=tmp_path)
    assert second.returncode == 0 and "tiny_s0.json: the same as the record (test accuracy at round 2)" in \
        second.stdout, second.stdout + second.stderr
    assert (run / "metrics.jsonl").read_text() == before
