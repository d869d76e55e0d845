"""The disk client store on a file system that fills up under a real run (fedrun/state/disk.py): a row that
cannot be written whole ends the run with one line naming the file and the disk, and every checkpoint left
behind verifies (``fedrun inspect``) and resumes to the same final state as a run that never failed. The
start-up space check counts every rank whose ``state.dir`` is on the disk (fedrun/state/choice.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import LEAST_SQUARES, REPO, child_env, final_state, mpiexec, run_ranks

from fedrun.checkpoint import checkpoint_round, list_checkpoints

pytestmark = pytest.mark.mpi

ROUNDS = 20
# 400 clients of d = 1000 (a SCAFFOLD control variate row is 8000 bytes), 2 new clients a round at most:
# the run can write min(400, 20 x 2) = 40 rows per rank, 0.31 MiB, and touches few rows before the disk fills
BASE = [*LEAST_SQUARES, "data.num_clients=400", "data.least_squares.dim=1000", "data.least_squares.rows_per_client=4",
        "local.batch_size=4", "participation.clients_per_round=2", "local.steps=2", "algorithm.name=scaffold",
        f"run.rounds={ROUNDS}", "checkpoint.every=1", "checkpoint.keep=1000"]


def _mount(where: Path, size: str) -> Path:
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}): needs root or "
                    "CAP_SYS_ADMIN")
    return where


@pytest.fixture
def small_disk(tmp_path):
    disk = _mount(tmp_path / "disk", "2m")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(directory: Path, leave: int = 0) -> None:
    """Write a filler file until the file system has at most ``leave`` bytes free."""
    import shutil

    with open(directory / f"filler{time.monotonic_ns()}", "wb") as fh:
        try:
            while shutil.disk_usage(directory).free > leave:
                fh.write(b"\1" * min(65536, max(4096, shutil.disk_usage(directory).free - leave)))
                fh.flush()
        except OSError:
            pass


def _train(run: Path, scratch: Path, *extra: str) -> list[str]:
    return ["-m", "fedrun", "train", "--quiet", f"run.dir={run}", *BASE, "state.store=disk", f"state.dir={scratch}",
            *extra]


def test_full_state_disk_names_file_and_disk_and_every_checkpoint_resumes_exactly(small_disk, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([mpiexec(), "-n", "2", sys.executable, *_train(run, small_disk)], env=child_env(),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list_checkpoints(run)) < 2:
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    _fill(small_disk)
    out, err = proc.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert proc.returncode == 1, err[-2000:]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    # the file, the disk, the row and how far the write got
    assert "cannot write the client state file" in lines[0] and str(small_disk) in lines[0], lines[0]
    assert f"on the disk mounted at {small_disk}" in lines[0] and "No space left on device" in lines[0], lines[0]
    left = list_checkpoints(run)
    assert 2 <= len(left) and checkpoint_round(left[-1]) < ROUNDS, left
    print(f"\n{lines[0]}\n{len(left)} checkpoints left, rounds {[checkpoint_round(p) for p in left]}")

    reference = tmp_path / "reference"
    run_ranks(2, _train(reference, tmp_path / "scratch_ref"))
    want = final_state(reference)
    for ckpt in left:
        inspect = subprocess.run([sys.executable, "-m", "fedrun", "inspect", str(ckpt)], capture_output=True,
                                 text=True, env=child_env(), cwd=REPO)
        assert inspect.returncode == 0, (ckpt, inspect.stdout[-1000:], inspect.stderr[-1000:])
        again = tmp_path / f"again_{checkpoint_round(ckpt)}"
        run_ranks(2, [*_train(again, tmp_path / "scratch_again"), "--resume", str(ckpt)])
        got = final_state(again)
        assert got.keys() == want.keys()
        for key in want:
            assert np.array_equal(got[key], want[key], equal_nan=True), (ckpt, key)


def test_space_check_counts_every_rank_sharing_the_disk(small_disk, tmp_path):
    """Each rank may write 40 rows of 8000 bytes (0.31 MiB): one rank fits 0.45 MiB free, two ranks do not."""
    _fill(small_disk, leave=int(0.45 * 2**20))
    run_ranks(0, _train(tmp_path / "one", small_disk))
    proc = run_ranks(2, _train(tmp_path / "two", small_disk), check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip()
    assert "\n" not in line and f"state.dir={small_disk}" in line and "for the 2 rank(s) sharing it" in line, line
    assert f":{small_disk}" in line, line  # host:mount point
    assert not (tmp_path / "two").exists()  # a refused run writes nothing
