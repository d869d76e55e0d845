"""Checkpoint-resume of real multi-rank runs: bit-identical, elastic, corruption fallback, signals."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, child_env, final_state, kill_after, metrics, mpiexec, run_ranks, train_args

pytestmark = pytest.mark.mpi

def assert_same_run(a: Path, b: Path, exact: bool = True, rtol: float = 0.0) -> None:
    sa, sb = final_state(a), final_state(b)
    assert sa.keys() == sb.keys()
    for key in sa:
        if exact:
            assert np.array_equal(sa[key], sb[key]), key
        else:
            np.testing.assert_allclose(sb[key], sa[key], rtol=rtol, atol=rtol * np.abs(sa[key]).max(), err_msg=key)
    if exact:
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
    rounds = 80
    run_ranks(2, train_args(tmp_path / "whole", rounds, extra))
    cut = random.Random(seed).randrange(10, 50)
    kill_after(train_args(tmp_path / "cut", rounds, extra), tmp_path / "cut", cut)
    assert final_state(tmp_path / "cut")["meta/round"] < rounds
    run_ranks(2, train_args(tmp_path / "cut", rounds, extra, resume=True))
    assert_same_run(tmp_path / "whole", tmp_path / "cut")


@pytest.mark.parametrize("ranks", [1, 3])
def test_resume_on_a_different_number_of_ranks(tmp_path, ranks):
    """SCAFFOLD's c_i rows are re-blocked: 7 clients on 2 ranks become 1 block or 3 blocks."""
    extra = ["algorithm.name=scaffold"]
    run_ranks(2, train_args(tmp_path / "whole", 30, extra))
    run_ranks(2, train_args(tmp_path / "elastic", 12, extra))
    run_ranks(ranks, train_args(tmp_path / "elastic", 30, extra, resume=True))
    assert_same_run(tmp_path / "whole", tmp_path / "elastic", exact=False, rtol=1e-10)


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
    assert state["meta/round"] == len(log.read_text().splitlines()) >= 5
    assert "resume with --resume auto" in err


def test_refuses_to_overwrite_another_runs_checkpoints(tmp_path):
    run_ranks(0, train_args(tmp_path / "run", 3, []))
    proc = run_ranks(0, train_args(tmp_path / "run", 3, []), check=False)
    assert proc.returncode == 2
    assert "holds checkpoints" in proc.stderr and "Traceback" not in proc.stderr
