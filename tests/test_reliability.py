"""Failure handling of real runs: a killed or failing rank, NaN/Inf, a full disk, concurrent runs, the
run-directory lock and the loopback-only rendezvous (docs/reliability.md)."""

from __future__ import annotations

import fcntl
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import LEAST_SQUARES, REPO, child_env, descendants, mpiexec, run_ranks, single_world

from fedrun.checkpoint import CheckpointReader, checkpoint_round, find_latest_valid, list_checkpoints
from fedrun.errors import NumericalError
from fedrun.federation.exchange import STOP_NONFINITE, Exchange, joined, raise_nonfinite, split
from fedrun.protocol import Declaration, Vector

pytestmark = pytest.mark.mpi

BASE = [*LEAST_SQUARES, "participation.clients_per_round=3", "local.steps=2"]


def train_args(run_dir: Path, rounds: int, *extra: str) -> list[str]:
    return ["-m", "fedrun", "train", "--quiet", f"run.dir={run_dir}", f"run.rounds={rounds}", *BASE, *extra]


def rank_pids(launcher: int) -> dict[int, int]:
    """PID of each rank's python process among the launcher's descendants (from their PMI_RANK)."""
    out = {}
    for pid in descendants(launcher):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if "python" not in os.path.basename(exe):
            continue
        for item in env:
            if item.startswith(b"PMI_RANK="):
                out[int(item[len(b"PMI_RANK="):])] = pid
    return out


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        if time.time() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting for the run")
        time.sleep(0.05)


# ------------------------------------------------------------------------------------ rank failure


def test_killed_rank_ends_the_job_within_60s_and_the_checkpoint_stays_valid(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen([mpiexec(), "-n", "3", sys.executable, *train_args(run, 10**6, "checkpoint.every=3")],
                            env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(list_checkpoints(run)) >= 2, proc)
    pids = rank_pids(proc.pid)
    assert sorted(pids) == [0, 1, 2], pids
    start = time.monotonic()
    os.kill(pids[1], signal.SIGKILL)  # mid-round: the ranks are always in a round or a checkpoint
    out, err = proc.communicate(timeout=120)
    elapsed = time.monotonic() - start
    print(f"\njob ended {elapsed:.2f} s after SIGKILL of rank 1, status {proc.returncode}: {err.strip()}")
    assert proc.returncode != 0
    assert elapsed < 60  # the bound for "no hang" (a stuck collective would take run.timeout_s = 120 s)
    # a survivor names the dead rank and its host, on one line (ranks and hosts come from the rendezvous store);
    # MPICH's mpiexec may kill the survivors before they notice (a race no rank can win; in 1 of 5 tries here):
    # then only its own banner (stdout, naming the pid and host) is left
    lines = err.strip().splitlines()
    if lines:
        assert len(lines) == 1 and f"rank 1 on host {socket.gethostname()} died or stopped answering" in lines[0], err
    else:
        assert "BAD TERMINATION" in out and "EXIT CODE: 9" in out, out[-2000:]
    latest = find_latest_valid(run)
    assert latest is not None
    with CheckpointReader(latest) as reader:
        assert reader.meta["round"] == checkpoint_round(latest) >= 3


def test_stopped_rank_is_named_within_the_timeout(tmp_path):
    """SIGSTOP: nothing closes a socket; the peers give up after run.timeout_s and name the stopped rank."""
    run = tmp_path / "run"
    proc = subprocess.Popen([mpiexec(), "-n", "2", sys.executable,
                             *train_args(run, 10**6, "checkpoint.every=3", "run.timeout_s=5")],
                            env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(list_checkpoints(run)) >= 1, proc)
    pids = rank_pids(proc.pid)
    start = time.monotonic()
    os.kill(pids[1], signal.SIGSTOP)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if Path(f"/proc/{pids[1]}").exists():  # the survivor ends a stopped peer itself
            os.kill(pids[1], signal.SIGKILL)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0 and elapsed < 30, (proc.returncode, elapsed, err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"rank 1 on host {socket.gethostname()} died or stopped answering" in lines[0], err
    assert "is stopped" in lines[0]


@pytest.mark.parametrize(("launcher", "dead"), [("gforker", 0), ("torchrun", 1)])
def test_a_stopped_rank_is_ended_with_its_job_and_leaves_the_lock_free(tmp_path, launcher, dead):
    """SIGSTOP of a rank: a survivor names it after run.timeout_s and ends it (SIGKILL): mpiexec.gforker used to
    leave it stopped, an orphan holding run.dir/.lock (``--resume auto``: "in use"); torchrun waited 30 s more
    for it. The job ends within run.timeout_s + 10 s and the run resumes at once."""
    run, bin_dir = tmp_path / "run", Path(sys.executable).parent
    prefix = {"gforker": [str(bin_dir / "mpiexec.gforker"), "-n", "2", sys.executable],
              "torchrun": [str(bin_dir / "torchrun"), "--standalone", "--nproc-per-node", "2"]}[launcher]
    variable = {"gforker": b"PMI_RANK=", "torchrun": b"RANK="}[launcher]
    proc = subprocess.Popen([*prefix, *train_args(run, 10**6, "checkpoint.every=3", "run.timeout_s=5")],
                            env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(list_checkpoints(run)) >= 1, proc)
    pid = next(p for p in descendants(proc.pid) if variable + str(dead).encode() in _environ(p))
    start = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0 and elapsed < 5 + 10, (elapsed, err[-2000:])
    assert f"rank {dead} on host {socket.gethostname()} died or stopped answering (its process {pid} is stopped; " \
           "ended it" in err, err[-2000:]
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
    done = len(list_checkpoints(run)) and checkpoint_round(list_checkpoints(run)[-1])
    again = subprocess.run([sys.executable, *train_args(run, done + 1), "--resume", "auto"], env=child_env(),
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr


def _environ(pid: int) -> list[bytes]:
    """The environment entries of process ``pid`` that is python (none for another program or a gone process)."""
    try:
        if "python" not in os.path.basename(os.readlink(f"/proc/{pid}/exe")):
            return []
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def test_checkpoint_every_s_writes_by_the_clock(tmp_path):
    """``checkpoint.every_s``: a checkpoint after the round in which that many seconds have passed since the last
    one (``checkpoint.every`` is 0). The default, 600 s, adds none to the short runs of every other test, whose
    checkpoint lists they assert. The 300 rounds took about 0.6 s on this project's machine (W2's cuts made them
    faster: at every_s = 0.3 only one clock checkpoint was left), so every_s = 0.05 leaves ~12 and still at least
    two on a machine four times faster."""
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, *train_args(run, 300, "checkpoint.every_s=0.05", "checkpoint.keep=1000")],
                          env=child_env(), cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    rounds = [checkpoint_round(p) for p in list_checkpoints(run)]
    assert len(rounds) >= 3 and rounds[-1] == 300, rounds
    assert [r["round"] for r in json.loads((run / "runtime.json").read_text())["checkpoints"]] == rounds


def test_rank_that_raises_ends_the_job_naming_the_rank(tmp_path):
    """Rank 2 cannot read the data file (as on a node that lacks it); ranks 0 and 1 wait in a collective."""
    rng = np.random.default_rng(0)
    good = tmp_path / "ls.npz"
    np.savez(good, A=rng.standard_normal((6, 4, 5)), b=rng.standard_normal((6, 4)))
    common = train_args(tmp_path / "run", 5, "data.num_clients=6")
    cmd = [mpiexec(), "-n", "2", sys.executable, *common, f"data.least_squares.file={good}", ":",
           "-n", "1", sys.executable, *common, f"data.least_squares.file={tmp_path / 'only_on_other_nodes.npz'}"]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=child_env(), cwd=REPO)
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert elapsed < 60
    assert "fedrun[rank 2]: error:" in proc.stderr and "only_on_other_nodes.npz: file not found" in proc.stderr
    assert "Traceback" not in proc.stderr


# -------------------------------------------------------------------------------------- NaN / Inf


def _exploding_problem(path: Path, bad_client: int | None = 3) -> None:
    """Least squares with 6 clients; ``bad_client``'s rows are scaled so that its local steps diverge."""
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((6, 4, 5)), rng.standard_normal((6, 4))
    if bad_client is not None:
        a[bad_client] *= 300.0
    keep = [i for i in range(6) if i != bad_client] if bad_client is not None else list(range(6))
    np.savez(path, A=a, b=b)
    np.savez(path.with_name("without_bad.npz"), A=a[keep], b=b[keep])


NUMERIC = ["run.dtype=float32", "participation.pattern=full", "local.steps=20", "local.lr=0.05", "local.batch_size=64"]


def test_nonfinite_upload_stops_with_status_3_naming_round_and_client(tmp_path):
    problem = tmp_path / "ls.npz"
    _exploding_problem(problem)
    run = tmp_path / "run"
    args = train_args(run, 6, *NUMERIC, "data.num_clients=6", f"data.least_squares.file={problem}",
                      "checkpoint.every=1", "participation.pattern=cyclic", "participation.clients_per_round=2")
    proc = run_ranks(2, args, check=False)
    assert proc.returncode == 3, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    # cyclic with S=2: clients 0,1 in round 1, then 2,3 in round 2: client 3 (rank 1's block) diverges
    assert lines[0].startswith("fedrun: error: round 2: client 3 uploaded a non-finite update"), lines[0]
    latest = find_latest_valid(run)
    assert latest is not None and checkpoint_round(latest) == 1  # the last good round's checkpoint
    with CheckpointReader(latest) as reader:
        assert np.isfinite(reader.read("server/x")).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_counts_and_client_ids_cross_a_float_reduce_exactly(dtype):
    """The gathered exchange carries each rank's non-finite count and smallest bad client id in the run's float
    dtype, summed over ranks: as split pairs they come back exact where one float32 would not (2^24 + 1)."""
    values = [[0, 0, 2 ** 24 + 1, 0], [3, 1, 0, 2 ** 35 + 12_345], [4095, 0, 4097, 0], [4096, 1, 0, 0]]  # 4 ranks
    parts = [torch.tensor([split(v) for v in rank_values], dtype=dtype) for rank_values in values]
    summed = torch.stack(parts).sum(dim=0)
    assert joined(summed).tolist() == [sum(column) for column in zip(*values, strict=True)]
    assert float(torch.tensor(2 ** 24 + 1, dtype=torch.float32)) != 2 ** 24 + 1  # what one float32 would give


def test_the_downlink_names_a_bad_client_beyond_float32s_integers():
    """Rank 0 broadcasts the stop, the non-finite count and the smallest bad client id in the run's float dtype:
    client 2^24 + 1 of a float32 run is named as itself, not as its float32 neighbour 2^24."""
    decl = Declaration(server=(Vector("x", "model"),), down=("x",), up=(Vector("delta"),), model_delta="delta")
    exchange = Exchange(decl, 3, single_world(), torch.float32)
    down = exchange.publish({"x": torch.zeros(3)}, STOP_NONFINITE, nonfinite=3, bad_client=2 ** 24 + 1)
    with pytest.raises(NumericalError, match=r"^round 2: client 16777217 uploaded .* \(and 2 other client\(s\)\)"):
        raise_nonfinite("round 2", down, skip=False)


def test_skip_nonfinite_clients_drops_them_and_tells_the_algorithm(tmp_path):
    problem = tmp_path / "ls.npz"
    _exploding_problem(problem)
    common = [*NUMERIC, "eval.every=1"]
    skip, ref = tmp_path / "skip", tmp_path / "ref"
    run_ranks(2, train_args(skip, 4, *common, "data.num_clients=6", f"data.least_squares.file={problem}",
                            "run.skip_nonfinite_clients=true"))
    run_ranks(2, train_args(ref, 4, *common, "data.num_clients=5",
                            f"data.least_squares.file={tmp_path / 'without_bad.npz'}"))
    with CheckpointReader(list_checkpoints(skip)[-1]) as r, CheckpointReader(list_checkpoints(ref)[-1]) as r_ref:
        x, x_ref = r.read("server/x"), r_ref.read("server/x")
    assert np.isfinite(x).all()
    # FedAvg divides by |S_t|: 5 kept clients, exactly as a run without the bad client
    np.testing.assert_allclose(x, x_ref, rtol=1e-5, atol=1e-6)
    records = [json.loads(line) for line in (skip / "metrics.jsonl").read_text().splitlines()]
    assert [r["dropped_clients"] for r in records] == [1, 1, 1, 1]
    assert [r["active_clients"] for r in records] == [5, 5, 5, 5]
    assert all(np.isfinite(r["train_loss"]) for r in records)


# ----------------------------------------------------------------------------------- full disk


def _limit_file_size(limit: int):
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write(2) then fails with EFBIG, as ENOSPC on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return apply


def test_checkpoint_that_cannot_be_written_keeps_the_previous_one(tmp_path):
    """The disk fills up during a resumed run: its checkpoint (about 16 MB) cannot be written.

    RLIMIT_FSIZE makes write(2) fail with EFBIG as a full disk fails with ENOSPC; the limit (12 MB) stays
    above what MPI's shared-memory start-up needs (under 8 MB).
    """
    run = tmp_path / "run"
    args = [*BASE, "algorithm.name=scaffold", "data.least_squares.dim=250000", "participation.clients_per_round=2",
            "local.steps=1", "local.lr=0.01"]
    run_ranks(0, train_args(run, 2, *args))
    first = list_checkpoints(run)
    assert [checkpoint_round(p) for p in first] == [2] and first[0].stat().st_size > 14 << 20
    digest = first[0].read_bytes()
    proc = subprocess.run([sys.executable, *train_args(run, 4, *args), "--resume", "auto"], capture_output=True,
                          text=True, timeout=240, env=child_env(), cwd=REPO, preexec_fn=_limit_file_size(12 << 20))
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, proc.stderr
    assert line.startswith("fedrun: error: checkpoint after round 4") and "File too large" in line, line
    assert "earlier checkpoints are intact" in line
    assert find_latest_valid(run) == first[0] and first[0].read_bytes() == digest
    assert not list(run.glob(".ckpt_*.tmp"))  # the failed temporary is gone


# ---------------------------------------------------------------------------- concurrent runs


def test_two_runs_started_together_both_succeed(tmp_path):
    procs = [subprocess.Popen([mpiexec(), "-n", "2", sys.executable, *train_args(tmp_path / f"run{i}", 4)],
                              env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]
    for i in range(2):
        assert (tmp_path / f"run{i}" / "result.json").exists()


def test_a_live_runs_directory_is_locked(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / ".lock", "w") as holder:  # as a live run's rank 0 holds it
        holder.write("4242\n")
        holder.flush()
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        proc = run_ranks(0, [*train_args(run, 3), "--resume", "auto"], check=False)
        assert proc.returncode == 2
        assert proc.stderr.strip() == (f"fedrun: error: run.dir={run}: in use by another live run (pid 4242); "
                                       "wait for it to end or choose another run.dir")
        assert not list(run.glob("ckpt_*")) and not (run / "config.yaml").exists()
    run_ranks(0, [*train_args(run, 3), "--resume", "auto"])  # released: the run starts


def test_a_stopped_holder_whose_launcher_ended_is_proven_stale_and_ended(tmp_path):
    """A run's process stopped (SIGSTOP) and its launcher (here a shell) killed: the process, re-parented, holds
    run.dir/.lock for ever. The next run proves it stale (a stopped fedrun process whose parent is not the one it
    recorded in the lock), ends it and resumes; a live holder is still refused (the test above)."""
    run = tmp_path / "run"
    shell = subprocess.Popen(["sh", "-c", f"{sys.executable} {' '.join(train_args(run, 10**6))}; true"],
                             env=child_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (run / "metrics.jsonl").exists(), shell)  # the rounds run: it holds the lock
    pid = next(p for p in descendants(shell.pid) if b"fedrun" in Path(f"/proc/{p}/cmdline").read_bytes())
    os.kill(pid, signal.SIGSTOP)
    shell.kill()
    shell.wait()
    try:
        again = run_ranks(0, [*train_args(run, 1), "--resume", "auto"], check=False)
    finally:
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)
    assert again.returncode == 0, again.stderr
    assert f"held by pid {pid}, a stopped fedrun process whose launcher (pid {shell.pid}) has ended; ended it" \
        in again.stdout, again.stdout


# --------------------------------------------------------------------------------------- security


def test_rendezvous_listens_on_loopback_only(tmp_path):
    run_ranks(2, [str(REPO / "tests" / "cluster" / "probe_world.py"), str(tmp_path)])
    found = json.loads((tmp_path / "rank0.json").read_text())
    assert found["store_port"] > 0
    assert found["listening"] == ["127.0.0.1"], found


def test_object_array_npz_is_refused_without_unpickling(tmp_path):
    path = tmp_path / "ls.npz"
    np.savez(path, A=np.ones((6, 4, 5)).astype(object), b=np.ones((6, 4)))
    proc = run_ranks(0, [*train_args(tmp_path / "run", 2, f"data.least_squares.file={path}")], check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"fedrun: error: {path}: array 'A' has object dtype; refusing to unpickle it "
                                   "(store numeric arrays)")


def _strict_json(text: str):
    def refuse(constant: str):
        raise AssertionError(f"not standard JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def test_first_nonfinite_training_loss_stops_the_run_before_its_checkpoint(tmp_path):
    """lr 30 on least squares: the loss ||A x - b||^2 overflows (inf) a round before the model does."""
    run = tmp_path / "run"
    args = [a for a in train_args(run, 60, "local.lr=30", "checkpoint.every=1") if a != "--quiet"]
    proc = run_ranks(0, args, check=False)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and "non-finite update or training loss" in proc.stderr, proc.stderr
    records = [_strict_json(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records and all(np.isfinite(r["train_loss"]) for r in records)
    latest = find_latest_valid(run)
    assert checkpoint_round(latest) == len(records) < 60  # no checkpoint of the round whose loss was not finite
    with CheckpointReader(latest) as reader:
        assert np.isfinite(reader.read("server/x")).all()
    losses = [line.split(" | ")[1] for line in proc.stdout.splitlines() if line.startswith("round ")]
    assert losses and all(len(loss) <= len("loss -1.234e+306") for loss in losses), losses[-3:]
    assert any("e+" in loss for loss in losses), losses[-3:]  # large losses in exponent notation


def test_metrics_and_result_hold_standard_json(tmp_path):
    """Rounds without participants have no training loss (NaN in memory): null in the files."""
    run = tmp_path / "run"
    run_ranks(0, train_args(run, 12, "participation.pattern=bernoulli", "participation.probability=0.1"))
    records = [_strict_json(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r["train_loss"] is None for r in records) and any(r["train_loss"] is not None for r in records)
    _strict_json((run / "result.json").read_text())
    with CheckpointReader(list_checkpoints(run)[-1]) as reader:
        assert [_strict_json(line) for line in reader.read("metrics/jsonl").splitlines()] == records


# ---------------------------------------------------------------------- disk and file-system faults


@pytest.fixture
def tmpfs(tmp_path):
    """A 4 MiB tmpfs to fill up or make read-only (skipped where mounting is not allowed)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}): needs root or "
                    "CAP_SYS_ADMIN")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(directory: Path) -> None:
    """Write a filler file until the file system is full."""
    with open(directory / "filler", "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass


def _one_fault_line(proc, *needles: str) -> str:
    line = proc.stderr.strip()
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "\n" not in line and "Traceback" not in line and "NoneType" not in line, proc.stderr[-2000:]
    assert all(n in line for n in needles), line
    return line


def test_checkpoint_into_a_full_disk_names_the_file_and_the_error(tmpfs):
    """The disk is already full when a checkpoint starts: the file cannot even be created."""
    from helpers import BASE as LS_BASE
    from helpers import federation

    from fedrun.errors import CheckpointWriteError
    from fedrun.federation import snapshot

    fed = federation(LS_BASE | {"algorithm": {"name": "scaffold"}})
    fed.round(0)
    _fill(tmpfs)
    fed.setup.run_dir = tmpfs
    with pytest.raises(CheckpointWriteError) as info:
        snapshot.save(fed.setup, fed.state)
    assert "ckpt_00000001.h5" in str(info.value) and "No space left on device" in str(info.value), info.value
    assert not list(tmpfs.glob("*ckpt*"))


def test_full_disk_at_start_or_mid_run_ends_with_one_line_and_keeps_the_checkpoints(tmpfs):
    run = tmpfs / "run"
    run_ranks(0, train_args(run, 2, "checkpoint.every=1"))
    before = {p.name: p.read_bytes() for p in list_checkpoints(run)}
    _fill(tmpfs)
    proc = run_ranks(2, [*train_args(run, 6, "checkpoint.every=1"), "--resume", "auto"], check=False)
    _one_fault_line(proc, "No space left on device", str(run))
    assert {p.name: p.read_bytes() for p in list_checkpoints(run)} == before
    assert find_latest_valid(run) == run / "ckpt_00000002.h5"


def _start_and_wait(run: Path, rounds_done: int) -> subprocess.Popen:
    proc = subprocess.Popen([mpiexec(), "-n", "2", sys.executable, *train_args(run, 10**6, "checkpoint.every=1")],
                            env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: len(list_checkpoints(run)) >= rounds_done, proc)
    return proc


def test_run_directory_made_read_only_or_moved_away_mid_run(tmpfs):
    run = tmpfs / "run"
    proc = _start_and_wait(run, 2)
    # a read-only bind mount over the run directory (a remount of the tmpfs is refused while files are open)
    subprocess.run(["mount", "--bind", str(run), str(run)], check=True)
    for _ in range(100):  # refused (busy) while the run has a file of the directory open for writing
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(run)], capture_output=True).returncode == 0:
            break
        time.sleep(0.02)
    else:
        raise AssertionError("could not make the run directory read-only")
    out, err = proc.communicate(timeout=120)
    _one_fault_line(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), "Read-only file system",
                    str(run))
    assert find_latest_valid(run) is not None  # the earlier checkpoints are intact
    subprocess.run(["umount", str(run)], check=True)
    run = tmpfs / "run2"
    proc = _start_and_wait(run, 2)
    run.rename(tmpfs / "moved")
    out, err = proc.communicate(timeout=120)
    _one_fault_line(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), "No such file or directory",
                    str(run))
    assert find_latest_valid(tmpfs / "moved") is not None


def test_a_stop_during_the_per_client_evaluation_checkpoints_the_finished_round(tmp_path, monkeypatch):
    """A real SIGTERM while round 1's per-client evaluation walks its windows: the ranks agree between two windows,
    the evaluation ends there, the round's record keeps its pooled figures, the checkpoint after round 1 is
    written and the run stops (exit status 75); resumed, it ends on the bits of a run never stopped."""
    import fedrun
    from fedrun.errors import RunInterrupted, exit_code
    from fedrun.federation import client_eval
    from fedrun.runtime.signals import StopSignals

    monkeypatch.setattr(client_eval, "WINDOW_EXAMPLES", 32)  # windows of two batches of 16: many of them
    config = ["data.name=synthetic_fedprox", "data.num_clients=40", "model.name=logistic", "eval.batch_size=16",
              "local.strategy=sequential", "participation.clients_per_round=4", "run.rounds=2", "eval.every=1"]
    whole = fedrun.run({}, [*config, f"run.dir={tmp_path / 'whole'}"])
    loads, share = [], client_eval.ClientEval._share

    def share_then_signal(self, lo, hi):  # the third window's load: a SIGTERM to this process, as from Slurm
        loads.append(lo)
        if len(loads) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return share(self, lo, hi)

    monkeypatch.setattr(client_eval.ClientEval, "_share", share_then_signal)
    run = tmp_path / "stopped"
    with pytest.raises(RunInterrupted) as stopped:
        fedrun.run({}, [*config, f"run.dir={run}"], signals=StopSignals())
    assert exit_code(stopped.value) == 75 and "after round 1;" in str(stopped.value)
    assert len(loads) == 3  # nothing evaluated after the window in which the signal came
    assert [checkpoint_round(p) for p in list_checkpoints(run)] == [1]
    unstopped = json.loads((tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()[0])
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert any(key.startswith("client_") for key in unstopped), unstopped
    assert "test_loss" in record and not any(key.startswith("client_") for key in record), record
    monkeypatch.setattr(client_eval.ClientEval, "_share", share)
    resumed = fedrun.run({}, [*config, f"run.dir={run}"], resume="auto")
    assert np.array_equal(resumed.x, whole.x)
