"""The on-disk client store (fedrun.state.disk, state.store=disk): the same runs as the in-memory store, bit
for bit, on real ranks; sparse files that cost only the rows written; the store choice and its refusals."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from helpers import (
    LEAST_SQUARES,
    config,
    final_models,
    final_state,
    kill_mid_checkpoint,
    metrics,
    one_line_problems,
    run_ranks,
    train_args,
)

from fedrun.checkpoint import CheckpointReader, CheckpointWriter, find_latest_valid
from fedrun.cli import main
from fedrun.errors import CheckpointError, ConfigError
from fedrun.protocol import Scalar, Vector
from fedrun.state.choice import StorePlan, choose
from fedrun.state.disk import DiskStore
from fedrun.state.store import ClientStore

# every algorithm with per-client state (FedAWE and FAFED update the consumed clients' vectors after the round)
STATEFUL = {
    "scaffold": config("scaffold"),
    "mifa": config("mifa"),
    "fedvarp": config("fedvarp"),
    "fedau": config("fedau"),
    "fedsum_b": config("fedsum_b"),
    "fedsum": config("fedsum"),
    "fedsum_cr": config("fedsum_cr"),
    "fadamgc": config("fadamgc", persist_moments=True),
    "fedawe": config("fedawe"),
    "fafed": config("fafed", persist_client_state=True),
    "fadas_async": config("fadas", "asynchrony.enabled=true", "asynchrony.buffer_size=2",
                          "asynchrony.concurrency=3"),
}


def _partial(cfg: dict, store: str, directory: Path) -> dict:
    cfg = {**cfg, "participation": {"pattern": "uniform", "clients_per_round": 3}, "run": {**cfg["run"], "rounds": 6},
           "state": {"store": store, "dir": str(directory)}}
    return cfg


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [0, 2])
def test_disk_store_runs_equal_memory_store_runs_bit_for_bit(tmp_path, ranks):
    configs = {f"{name} {store}": _partial(cfg, store, tmp_path / "scratch")
               for name, cfg in STATEFUL.items() for store in ("memory", "disk")}
    models = final_models(ranks, tmp_path, configs)
    for name in STATEFUL:
        assert np.array_equal(models[f"{name} memory"], models[f"{name} disk"]), name
    assert not list((tmp_path / "scratch").iterdir())  # the scratch files went with the processes


def test_rows_never_written_read_their_initial_value_and_cost_no_disk(tmp_path):
    x0 = torch.arange(1.0, 5.0, dtype=torch.float64)
    entries = (Vector("c", "model"), Vector("h"), Scalar("n", 2.0))
    disk = DiskStore(entries, 10_000, x0, tmp_path, "t")
    memory = ClientStore(entries, 10_000, x0)
    assert disk.disk_bytes == 0  # 10,000 x 4 float64 rows of length, none allocated
    rows = torch.tensor([3, 9_999])
    values = {"c": torch.tensor([[-0.0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.float64),
              "n": torch.tensor([5.0, 6.0], dtype=torch.float64)}
    for store in (disk, memory):
        store.scatter(rows, values)
    assert 0 < disk.disk_bytes <= 2 * 2 * 4096  # two rows, at most a page (block) each end
    probe = torch.tensor([0, 3, 17, 9_999])
    got, want = disk.gather(probe, ["c", "h", "n"]), memory.gather(probe, ["c", "h", "n"])
    for name in want:
        assert torch.equal(got[name], want[name]) and got[name].dtype == want[name].dtype, name
    assert torch.signbit(got["c"][1, 0])  # bit for bit: -0.0 stays -0.0
    assert torch.equal(disk.block("c", 9_990, 10_000), memory.block("c", 9_990, 10_000))
    fresh = DiskStore(entries, 10_000, x0, tmp_path, "u")  # a checkpoint's rows loaded: only changed rows written
    fresh.load("c", 0, memory.block("c", 0, 10_000))
    assert torch.equal(fresh.block("c", 0, 10_000), memory.block("c", 0, 10_000))
    assert int(fresh.files["c"].written.sum()) == 2
    with pytest.raises(ValueError, match="c"):
        disk.whole(["c"])
    for store in (disk, fresh):
        store.close()
    assert not list(tmp_path.iterdir())


def test_auto_takes_memory_while_it_fits_then_disk_then_refuses(tmp_path):
    plan = StorePlan(rows=500_000, dim=100_000, vectors=2, scalars=1, itemsize=4, touched_rows=1_000)
    every_row = StorePlan(rows=500_000, dim=100_000, vectors=2, scalars=1, itemsize=4, touched_rows=500_000)
    assert choose("auto", every_row, tmp_path, available=10**15)[0] == "memory"
    kind, why = choose("auto", plan, tmp_path, available=2**30)
    assert kind == "disk" and str(tmp_path) in why
    big = StorePlan(rows=500_000, dim=100_000, vectors=2, scalars=1, itemsize=4, touched_rows=10**9)
    with pytest.raises(ConfigError, match="state.dir="):  # 400 GB of rows to write fit no disk here
        choose("auto", big, tmp_path, available=2**30)
    with pytest.raises(ConfigError, match="state.store=memory"):
        choose("memory", plan, tmp_path, available=2**30)


@pytest.mark.mpi
def test_disk_store_resumes_exactly_and_elastically(tmp_path):
    """SCAFFOLD on disk: 2 ranks stopped after 6 rounds and resumed on 2 ranks equals an uninterrupted run on
    the in-memory store bit for bit; so do runs resumed 2 -> 1 and 1 -> 2 ranks (the sums over clients are
    exact, so re-blocked rows give the same sums)."""
    disk = ["algorithm.name=scaffold", "state.store=disk", f"state.dir={tmp_path / 'scratch'}"]
    run_ranks(2, train_args(tmp_path / "whole", 12, ["algorithm.name=scaffold", "state.store=memory"]))
    run_ranks(2, train_args(tmp_path / "cut", 6, disk))
    run_ranks(2, train_args(tmp_path / "cut", 12, disk, resume=True))
    whole, cut = final_state(tmp_path / "whole"), final_state(tmp_path / "cut")
    assert all(np.array_equal(whole[k], cut[k]) for k in whole)
    losses = [[m["train_loss"] for m in metrics(tmp_path / run)] for run in ("whole", "cut")]
    assert losses[0] == losses[1]  # (the cut run also evaluated after its last round 6)
    for first, then, name in ((2, 1, "down"), (1, 2, "up")):
        run_ranks(first, train_args(tmp_path / name, 6, disk))
        run_ranks(then, train_args(tmp_path / name, 12, disk, resume=True))
        got = final_state(tmp_path / name)
        for key in whole:
            assert np.array_equal(got[key], whole[key]), f"{name} {key}"


def test_checkpoint_rows_never_written_are_skipped_verified_and_read_as_fill(tmp_path):
    """The writer passes over whole chunks of fill rows (HDF5 allocates nothing); the reader verifies them
    from their CRC without reading and returns the fill value; a damaged written chunk is still named."""
    rows = np.arange(20 * 1000, dtype=np.float32).reshape(20, 1000) + 1
    with CheckpointWriter(tmp_path, 3, algorithm="scaffold", num_clients=1000, dim=1000) as w:
        w.create_rows("clients/c_i", 1000, 1000, np.float32, rows_per_chunk=10, fill=0.0)
        w.skip_rows("clients/c_i", 0, 30)
        w.write_rows("clients/c_i", 30, rows[:10])
        w.skip_rows("clients/c_i", 40, 500)
        w.write_rows("clients/c_i", 500, rows[10:])
        w.skip_rows("clients/c_i", 510, 1000)
    path = tmp_path / "ckpt_00000003.h5"
    assert path.stat().st_size < 200_000  # two chunks of 40 kB, not 1000 rows of 4 kB
    with CheckpointReader(path) as r:
        r.verify()
        assert r.allocated_rows("clients/c_i") == [(30, 40), (500, 510)]
        got = r.read_rows("clients/c_i", 25, 505)
        assert not got[:5].any() and np.array_equal(got[5:15], rows[:10]) and np.array_equal(got[-5:], rows[10:15])
    with h5py.File(path, "r+") as f:  # a flipped value in a written chunk
        f["clients/c_i"][501, 7] = -1
    with CheckpointReader(path) as r, pytest.raises(CheckpointError, match="rows 500:510"):
        r.verify()


# ------------------------------------------------------------------------------------ the CNN, out of core

# the MNIST CNN (with dropout: a random model) on the embedded mnist5k, 40 clients, 4 a round; float32
CNN = {"run": {"rounds": 3, "seed": 2, "device": "cpu"},
       "data": {"name": "mnist5k", "num_clients": 40},
       "model": {"name": "cnn_mnist"},
       "local": {"steps": 2, "batch_size": 8, "lr": 0.05, "strategy": "sequential"},
       "participation": {"pattern": "uniform", "clients_per_round": 4},
       "eval": {"every": 0}}
# vector state of every kind: zeros (FedSUM's h_i, FAdamGC's y_i and moments) and x^(0)
# (FedSUM's z_i, FedAWE's x_own, which the round after replaces for the consumed clients), beside scalars
CNN_STATEFUL = {"fedsum": {"name": "fedsum"}, "fedawe": {"name": "fedawe"},
                "fadamgc": {"name": "fadamgc", "persist_moments": True}}


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [0, 2])
def test_cnn_on_the_disk_store_equals_the_memory_store_bit_for_bit(tmp_path, ranks):
    """Three rounds of each algorithm on each store in one launch (one process, or 2 ranks over gloo): the
    final models agree bit for bit, and differ between algorithms (the state mattered)."""
    configs = {f"{name} {store}": {**CNN, "algorithm": algo, "state": {"store": store, "dir": str(tmp_path / "s")}}
               for name, algo in CNN_STATEFUL.items() for store in ("memory", "disk")}
    models = final_models(ranks, tmp_path, configs)
    for name in CNN_STATEFUL:
        memory, disk = models[f"{name} memory"], models[f"{name} disk"]
        assert memory.dtype == np.float32 and np.isfinite(memory).all(), name
        assert np.array_equal(memory, disk), name
    assert len({models[f"{name} memory"].tobytes() for name in CNN_STATEFUL}) == len(CNN_STATEFUL)


def cnn_args(run_dir: Path, rounds: int, resume: bool = False) -> list[str]:
    """A CLI run of the CNN with FedSUM (h_i streamed by the rows written, z_i whole) on the disk store,
    a checkpoint every round."""
    flat = [f"{section}.{key}={value}" for section, values in CNN.items() for key, value in values.items()
            if section != "run"]
    args = ["-m", "fedrun", "train", "--quiet", f"run.dir={run_dir}", f"run.rounds={rounds}", "run.seed=2",
            *flat, "algorithm.name=fedsum", "state.store=disk", "checkpoint.every=1"]
    return [*args, "--resume", "auto"] if resume else args


def outcome(run_dir: Path) -> tuple[np.ndarray, list, dict]:
    """What a run leaves that does not depend on the checkpoint layout: the global model read back through
    the checkpoint reader, each round's loss and server fingerprint, and result.json."""
    with CheckpointReader(find_latest_valid(run_dir)) as ckpt:
        x = ckpt.read("server/x")
    rounds = [(m["round"], m["train_loss"], m["fingerprint"]) for m in metrics(run_dir)]
    result = json.loads((run_dir / "result.json").read_text())
    result.pop("wall_s")
    return x, rounds, result


@pytest.mark.mpi
def test_cnn_on_disk_killed_mid_checkpoint_and_resumed_on_more_ranks_equals_the_uninterrupted_run(tmp_path):
    """One rank SIGKILLed while it writes a checkpoint (256 KiB of its .tmp written), then --resume auto on 2
    ranks (elastic 1 -> 2): the uninterrupted 2-rank run bit for bit, and no .tmp is left. (Elastic resumes
    alone, 2 -> 1 and 1 -> 2: test_disk_store_resumes_exactly_and_elastically.)"""
    rounds = 6
    run_ranks(2, cnn_args(tmp_path / "whole", rounds))
    runtime = json.loads((tmp_path / "whole" / "runtime.json").read_text())
    assert runtime["client_store"].startswith("on disk (requested; ")
    on_disk = runtime["client_state_disk_bytes_per_rank"]
    assert len(on_disk) == 2 and min(on_disk) > 0  # both ranks wrote rows of their clients
    killed = tmp_path / "killed"
    tmp = kill_mid_checkpoint(cnn_args(killed, rounds), killed, ranks=1, written=2**18)  # into the client rows
    assert not (killed / "result.json").exists()  # the kill came before the end
    run_ranks(2, cnn_args(killed, rounds, resume=True))
    assert not tmp.exists() and not list(killed.glob("*.tmp"))
    x, per_round, result = outcome(killed)
    want = outcome(tmp_path / "whole")
    assert np.array_equal(x, want[0]) and per_round == want[1] and result == want[2]


def cli(*args: str) -> tuple[int, str, str]:
    """``fedrun train`` in this process (the CLI's own output and error path): (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["train", *args])
    return code, out.getvalue(), err.getvalue()


def test_start_up_names_the_store_and_a_bad_state_dir_is_one_line(tmp_path):
    """The start-up line and runtime.json say which store a run took and why; a state.dir that is a file,
    or lies under one, is refused with one line naming it (status 2), and no run directory is left behind."""
    base = [*LEAST_SQUARES, "algorithm.name=scaffold", "run.rounds=1", "participation.clients_per_round=3"]
    for store, said in (("auto", "client state in memory ("), ("disk", "client state on disk (requested; ")):
        run = tmp_path / store
        code, out, _ = cli(f"run.dir={run}", *base, f"state.store={store}", f"state.dir={tmp_path / 'scratch'}")
        line = next(x for x in out.splitlines() if "client state" in x)
        assert code == 0 and line.startswith(f"fedrun: {said}"), out
        assert json.loads((run / "runtime.json").read_text())["client_store"] in line
    assert str(tmp_path / "scratch") in line and not list((tmp_path / "scratch").iterdir())
    blocker = tmp_path / "a_file"
    blocker.write_text("a regular file where a directory should be")
    for bad in (blocker, blocker / "sub"):
        run = tmp_path / f"bad_{bad.name}"
        code, _, err = cli("--quiet", f"run.dir={run}", *base, "state.store=disk", f"state.dir={bad}")
        assert not one_line_problems(code, err, f"state.dir={bad}"), err
        assert not run.exists()  # a refused run writes nothing, not even its lock
    assert blocker.read_text().startswith("a regular file")
