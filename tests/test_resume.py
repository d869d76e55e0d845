"""Checkpoint-resume of real multi-rank runs: bit-identical, elastic, corruption fallback, signals."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import REPO, child_env, final_state, kill_after, metrics, mpiexec, run_ranks, train_args

pytestmark = pytest.mark.mpi

def assert_same_run(a: Path, b: Path, cut: bool = False) -> None:
    """The same final state, bit for bit, and the same metrics; with ``cut`` (b stopped at the end of a
    shorter run, which evaluated then) the same per-round fingerprints of the server state."""
    sa, sb = final_state(a), final_state(b)
    assert sa.keys() == sb.keys()
    for key in sa:
        assert np.array_equal(sa[key], sb[key]), key
    if cut:
        assert [r["fingerprint"] for r in metrics(a)] == [r["fingerprint"] for r in metrics(b)]
    else:
        assert metrics(a) == metrics(b)


# algorithms whose per-client state must survive the restart (and FedAvg, which has none)
STATEFUL = {
    "scaffold": ["algorithm.name=scaffold"],
    "fedsum_cr": ["algorithm.name=fedsum_cr", "local.lr_schedule=inv_sqrt"],
    "mifa": ["algorithm.name=mifa"],
    "fadamgc": ["algorithm.name=fadamgc", "algorithm.persist_moments=true", "local.lr=0.01"],
    "fedavg": ["algorithm.name=fedavg"],
}


@pytest.mark.parametrize("algorithm, seed", [(name, i) for i, name in enumerate(STATEFUL, start=1)])
def test_sigkill_then_resume_is_bit_identical(tmp_path, algorithm, seed):
    extra = [f"run.seed={seed}", "checkpoint.every=1", *STATEFUL[algorithm]]
    rounds = 40
    run_ranks(2, train_args(tmp_path / "whole", rounds, extra))
    cut = random.Random(seed).randrange(5, 30)
    kill_after(train_args(tmp_path / "cut", rounds, extra), tmp_path / "cut", cut)
    assert final_state(tmp_path / "cut")["meta/round"] < rounds
    run_ranks(2, train_args(tmp_path / "cut", rounds, extra, resume=True))
    assert_same_run(tmp_path / "whole", tmp_path / "cut")


@pytest.mark.parametrize("ranks", [1, 3])
def test_resume_on_a_different_number_of_ranks(tmp_path, ranks):
    """SCAFFOLD's c_i rows are re-blocked: 7 clients on 2 ranks become 1 block or 3 blocks; the sums over
    clients are exact, so the resumed run is the uninterrupted one bit for bit."""
    extra = ["algorithm.name=scaffold"]
    run_ranks(2, train_args(tmp_path / "whole", 30, extra))
    run_ranks(2, train_args(tmp_path / "elastic", 12, extra))
    run_ranks(ranks, train_args(tmp_path / "elastic", 30, extra, resume=True))
    assert_same_run(tmp_path / "whole", tmp_path / "elastic", cut=True)


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(tmp_path):
    run_ranks(2, train_args(tmp_path / "whole", 20, []))
    run = tmp_path / "run"
    run_ranks(2, train_args(run, 8, ["checkpoint.every=2"]))
    newest = run / "ckpt_00000008.h5"
    data = bytearray(newest.read_bytes())
    newest.write_bytes(bytes(data[: len(data) // 2]))  # truncated, as by a crash of the disk
    proc = run_ranks(2, train_args(run, 20, ["checkpoint.every=2"], resume=True))
    assert "ckpt_00000008.h5" in proc.stdout + proc.stderr  # the warning names the bad file
    assert "resumed from" not in proc.stdout or "ckpt_00000006.h5" in proc.stdout
    assert_same_run(tmp_path / "whole", run)


def test_sigterm_writes_a_checkpoint_and_exits_75(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([mpiexec(), "-n", "2", sys.executable, *train_args(run, 100000, [])],
                            env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = run / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (log.exists() and len(log.read_text().splitlines()) >= 5):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    state = final_state(run)
    done = len(log.read_text().splitlines())
    assert state["meta/round"] == done >= 5
    assert [json.loads(line)["round"] for line in log.read_text().splitlines()] == list(range(1, done + 1))
    assert f"stopped by a signal after round {done};" in err and f"ckpt_{done:08d}.h5" in err, err
    assert "resume with --resume auto" in err


def test_refuses_to_overwrite_another_runs_checkpoints(tmp_path):
    run_ranks(0, train_args(tmp_path / "run", 3, []))
    proc = run_ranks(0, train_args(tmp_path / "run", 3, []), check=False)
    assert proc.returncode == 2
    assert "holds checkpoints" in proc.stderr and "Traceback" not in proc.stderr


def _files(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir()) if p.is_file() and p.name != ".lock"}


def test_resume_refuses_changed_trajectory_settings_on_one_line_and_writes_nothing(tmp_path):
    run = tmp_path / "run"
    run_ranks(0, train_args(run, 3, []))
    before = _files(run)
    changed = ["run.seed=4", "run.dtype=float32", "local.lr=0.1", "local.steps=4", "participation.clients_per_round=2"]
    proc = run_ranks(2, train_args(run, 6, changed, resume=True), check=False)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, proc.stderr  # decided on rank 0: reported once
    for want in ("run.seed 0 -> 4", 'run.dtype "float64" -> "float32"', "local.lr 0.05 -> 0.1", "local.steps 3 -> 4",
                 "participation.clients_per_round 3 -> 2", "--accept-changes"):
        assert want in line, line
    assert _files(run) == before


def test_resume_accepts_changeable_settings_and_named_trajectory_changes_with_a_history(tmp_path):
    run = tmp_path / "run"
    run_ranks(0, train_args(run, 3, []))
    config_before = (run / "config.yaml").read_text()
    proc = run_ranks(0, train_args(run, 5, ["eval.every=2", "checkpoint.every=1"], resume=True))
    assert "run.rounds 3 -> 5" in proc.stdout and "eval.every 0 -> 2" in proc.stdout, proc.stdout
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert history[-1]["changes"] == {"run.rounds": [3, 5], "eval.every": [0, 2], "checkpoint.every": [0, 1]}
    assert history[-1]["trajectory"] == [] and history[-1]["after_round"] == 3
    assert (run / "config.yaml").read_text() != config_before  # replaced, and the change is on record
    run_ranks(0, [*train_args(run, 7, ["eval.every=2", "checkpoint.every=1", "local.lr=0.02"], resume=True),
                  "--accept-changes", "local.lr"])
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert len(history) == 2 and history[-1]["trajectory"] == ["local.lr"]
    assert history[-1]["changes"]["local.lr"] == [0.05, 0.02] and history[-1]["after_round"] == 5
    assert final_state(run)["meta/round"] == 7


def test_incomplete_checkpoint_is_named_by_inspect_and_resume_and_auto_falls_back(tmp_path):
    run = tmp_path / "run"
    extra = ["algorithm.name=scaffold", "checkpoint.every=2", "checkpoint.keep=5"]
    run_ranks(0, train_args(run, 4, extra))
    newest = run / "ckpt_00000004.h5"
    misshapen = tmp_path / "misshapen.h5"
    shutil.copy(run / "ckpt_00000002.h5", misshapen)
    with h5py.File(newest, "r+") as f:  # every remaining dataset still verifies its checksum
        del f["clients/c_i"]
    with h5py.File(misshapen, "r+") as f:
        del f["server/c"]
        f["server/c"] = short = np.zeros(3)
        f["server/c"].attrs["crc32"] = np.uint32(zlib.crc32(short.tobytes()))
    cases = ((newest, "dataset clients/c_i is missing"), (misshapen, "server/c has shape (3,), expected (5,)"))
    for path, needle in cases:
        proc = run_ranks(0, ["-m", "fedrun", "inspect", str(path)], check=False)
        assert proc.returncode == 2 and "checksums: all" in proc.stdout  # the checksums pass ...
        assert proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr  # ... the layout does not
        proc = run_ranks(2, [*train_args(run, 6, extra), "--resume", str(path)], check=False)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr
    proc = run_ranks(0, ["-m", "fedrun", "inspect", str(run / "ckpt_00000002.h5")])
    assert "layout: complete" in proc.stdout
    proc = run_ranks(0, train_args(run, 6, extra, resume=True))
    assert "skipping checkpoint ckpt_00000004.h5" in proc.stdout and "clients/c_i is missing" in proc.stdout
    assert final_state(run)["meta/round"] == 6 and final_state(run)["clients/c_i"].shape == (7, 5)
