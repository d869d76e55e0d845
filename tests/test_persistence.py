"""The persistence contract (docs/design.md, "The checkpoint is the run"): both client stores behind one
``ClientRows`` interface; a streaming part's rows saved in blocks from real ranks and loaded back spread
another way; every checkpoint records a manifest of what it holds and is verified against it (an older file
without one is checked against the layout its config implies, and still resumes); ``--resume auto`` finds,
verifies and loads its checkpoint opening the file at most twice, and returns what it skipped as data. Real
runs, real HDF5 files read back with h5py; the opens are counted on h5py's own ``File`` while the run goes."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from helpers import LEAST_SQUARES, run_ranks, single_world
from mpi_streaming import TABLES, N, written

import fedrun
from fedrun.checkpoint import CheckpointReader, CheckpointWriter
from fedrun.checkpoint.entries import EntryWriter
from fedrun.checkpoint.format import MANIFEST
from fedrun.checkpoint.manifest import check_complete, manifest
from fedrun.checkpoint.reader import Skipped
from fedrun.errors import CheckpointError
from fedrun.federation import snapshot
from fedrun.protocol import Scalar, Vector
from fedrun.state.disk import DiskStore
from fedrun.state.rows import ClientRows
from fedrun.state.store import ClientStore

RUN = [*LEAST_SQUARES, "data.num_clients=7", "local.steps=3", "local.lr=0.05", "participation.pattern=uniform",
       "participation.clients_per_round=3", "algorithm.name=scaffold", "checkpoint.every=2", "checkpoint.keep=10"]


def _run(run_dir: Path, rounds: int, *extra: str, **kwargs):
    return fedrun.run({}, [*RUN, f"run.dir={run_dir}", f"run.rounds={rounds}", *extra], world=single_world(),
                      **kwargs)


class _Opens:
    """Counts the ``h5py.File`` opens of one path while installed (h5py's class itself, every caller)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
        self.path, self.count = path.resolve(), 0
        original = h5py.File.__init__

        def counting(file, name, *args, **kwargs):
            if isinstance(name, (str, os.PathLike)) and Path(name).resolve() == self.path:
                self.count += 1
            original(file, name, *args, **kwargs)

        monkeypatch.setattr(h5py.File, "__init__", counting)


def test_resume_auto_opens_its_checkpoint_at_most_twice(tmp_path, monkeypatch):
    """Finding, verifying (with the chain and manifest) and loading ckpt 4 opens it twice: once to verify it and
    read its round and config, once to load it (was 6: 7 with the next checkpoint's pruning)."""
    run = tmp_path / "run"
    _run(run, 4)
    newest = run / "ckpt_00000004.h5"
    opens = _Opens(monkeypatch, newest)
    result = _run(run, 4, resume="auto")  # already finished: find, verify, load, nothing else
    assert result.rounds_run == 0 and opens.count == 2, opens.count
    opens.count = 0
    at_first_round: list[int] = []
    result = _run(run, 5, resume="auto", callback=lambda record: at_first_round.append(opens.count))
    assert result.rounds_run == 1 and at_first_round == [2], at_first_round
    whole = _run(tmp_path / "whole", 5)
    assert np.array_equal(result.x, whole.x)  # and the resumed run is the uninterrupted one


def test_resume_auto_returns_what_it_skipped_as_data(tmp_path, capsys):
    """ckpt 6 truncated and ckpt 4 without a dataset: the search returns ckpt 2 and the two it passed over,
    newest first, each with its file name and why; the warning line is made from that list."""
    run = tmp_path / "run"
    _run(run, 6)
    truncated = run / "ckpt_00000006.h5"
    truncated.write_bytes(truncated.read_bytes()[:1000])
    with h5py.File(run / "ckpt_00000004.h5", "r+") as f:
        del f["clients/c_i"]
    search = snapshot.scan(run)
    assert search.found is not None and search.found.path == run / "ckpt_00000002.h5"
    assert search.found.round == 2 and search.found.config["algorithm"]["name"] == "scaffold"
    assert [s.file for s in search.skipped] == ["ckpt_00000006.h5", "ckpt_00000004.h5"]
    assert all(isinstance(s, Skipped) for s in search.skipped)
    assert "not a readable HDF5 file" in search.skipped[0].why
    assert "dataset clients/c_i is missing" in search.skipped[1].why
    capsys.readouterr()
    assert snapshot.locate(run, "auto") == search.found
    line = capsys.readouterr().out.strip()
    assert line.startswith("fedrun: warning: skipping checkpoint ckpt_00000006.h5: ") and "\n" not in line
    assert line.endswith("; resuming from ckpt_00000002.h5") and search.skipped[1].why in line


def test_the_manifest_lists_what_the_file_holds_and_an_older_file_without_one_still_resumes(tmp_path):
    """Each dataset outside meta/ with its shape, as h5py reads them; a file without a manifest (as written before
    it existed) is checked against the layout its config implies, so a missing dataset is still named, and it
    resumes bit for bit."""
    run = tmp_path / "run"
    _run(run, 4)
    path = run / "ckpt_00000004.h5"
    with h5py.File(path, "r") as f:
        held = {}
        f.visititems(lambda name, obj: held.update({name: obj.shape}) if isinstance(obj, h5py.Dataset) else None)
    with CheckpointReader(path) as reader:
        assert manifest(reader) == {k: v for k, v in held.items() if not k.startswith("meta/")}
        assert manifest(reader)["clients/c_i"] == (7, 5)
    for name in (run / "ckpt_00000002.h5", path):
        with h5py.File(name, "r+") as f:
            del f[MANIFEST]
    with CheckpointReader(path) as reader:
        assert manifest(reader) is None
        with pytest.raises(CheckpointError, match="has no meta/manifest"):
            check_complete(reader)
        snapshot.check_chain(reader)  # the derived layout: complete
    older = tmp_path / "older.h5"
    older.write_bytes((run / "ckpt_00000002.h5").read_bytes())
    with h5py.File(older, "r+") as f:
        del f["clients/c_i"]
    with CheckpointReader(older) as reader, pytest.raises(CheckpointError, match="clients/c_i is missing"):
        snapshot.check_layout(reader)
    resumed = _run(run, 6, resume="auto")
    assert resumed.rounds_run == 2 and np.array_equal(resumed.x, _run(tmp_path / "whole", 6).x)


@pytest.mark.parametrize("quirk, removed", [("false", "finish"), ("true", "last_drawn")])
def test_an_older_asynchronous_file_is_checked_against_what_its_schedule_writes(tmp_path, quirk, removed):
    """The layout derived for a file without a manifest names the asynchronous schedule's datasets as its
    ``state_dict`` writes them (the dispatch quirk's ``last_drawn`` with the quirk), so such a file still checks
    complete and a missing one is named."""
    run = tmp_path / "run"
    _run(run, 2, "algorithm.name=fedavg", "asynchrony.enabled=true", "asynchrony.buffer_size=2",
         "asynchrony.concurrency=4", f"asynchrony.replicate_dispatch_quirk={quirk}")
    path = run / "ckpt_00000002.h5"
    with h5py.File(path, "r+") as f:
        held = set(f["schedule"])
        del f[MANIFEST]
    assert {"start", "finish", "clock"} <= held and ("last_drawn" in held) == (quirk == "true")
    with CheckpointReader(path) as reader:
        snapshot.check_layout(reader)
    with h5py.File(path, "r+") as f:
        del f[f"schedule/{removed}"]
    with CheckpointReader(path) as reader, pytest.raises(CheckpointError, match=f"schedule/{removed} is missing"):
        snapshot.check_layout(reader)


def test_both_stores_are_client_rows_and_agree_on_what_a_checkpoint_stores(tmp_path):
    """The memory and disk stores implement one interface; a checkpoint asks each which rows to store (the memory
    store: all; the disk store: those written) and which changed, never which store it has."""
    x0 = torch.arange(1.0, 5.0, dtype=torch.float64)
    entries = (Vector("c"), Vector("x_own", "model"), Scalar("n", 2.0))
    memory, disk = ClientStore(entries, 6, x0), DiskStore(entries, 6, x0, tmp_path, "t")
    for store in (memory, disk):
        assert isinstance(store, ClientRows)
        store.scatter(torch.tensor([1, 4]), {"c": torch.ones(2, 4, dtype=torch.float64)})
        assert store.changed("c").tolist() == [False, True, False, False, True, False]
        assert store.written("n").all()
        store.checkpointed()
        assert not store.changed("c").any()
    assert memory.written("c").all() and disk.written("c").tolist() == [False, True, False, False, True, False]
    assert (memory.default_full_every, disk.default_full_every) == (1, 10)
    disk.close()


def test_an_entry_is_written_whole_or_in_the_rows_form_and_reads_back(tmp_path):
    """Rows 3 and 130..131 of 200 stored: a constant initial value gives a whole [N, d] dataset whose chunks (64 KiB:
    4 rows of 2048 float64) holding no stored row are never allocated (the rest of a chunk holding one reads as
    the fill); x^(0) gives the rows form; both verify."""
    d = 2048
    ids, values = np.array([3, 130, 131]), np.arange(3.0 * d).reshape(3, d) + 1
    with CheckpointWriter(tmp_path, 1, algorithm="a", num_clients=200, dim=d, config="") as w:
        for name, fill in (("clients/zeros", 0.0), ("clients/model", None)):
            sink = EntryWriter(w, name, 3, (d,), np.dtype(np.float64), increment=False, fill=fill)
            sink.put(ids[:1], values[:1])
            sink.put(ids[1:], values[1:])
            sink.finish()
    with CheckpointReader(tmp_path / "ckpt_00000001.h5") as r:
        r.verify()
        check_complete(r)
        whole = r.read("clients/zeros")
        assert np.array_equal(whole[ids], values) and not np.delete(whole, ids, axis=0).any()
        assert r.allocated_rows("clients/zeros") == [(0, 4), (128, 132)]
        assert np.array_equal(r.read("clients/model/rows"), ids)
        assert np.array_equal(r.read("clients/model/values"), values)


@pytest.mark.mpi
def test_a_streaming_part_saves_its_rows_in_blocks_and_loads_them_on_other_spans(tmp_path):
    """2 real ranks, rank 0 holding the later rows, two vector rows a block (tests/mpi_streaming.py): the file,
    read with h5py, holds every stored row in row order in the form its initial value calls for, next to a
    Stateful part; loaded back with the rows split another way, each rank has its rows (those not stored keep
    their value), and every rank heard ``checkpointed`` once after saving and once after loading."""
    run_ranks(2, ["tests/mpi_streaming.py", str(tmp_path)])
    stored = [1, 2, 3, 7, 10]
    with h5py.File(tmp_path / "ckpt_00000001.h5", "r") as f:
        assert np.array_equal(f["counts/k"][()], np.arange(4))
        assert f["clients/v/rows"][()].tolist() == stored  # no constant initial value: the rows form
        assert np.array_equal(f["clients/v/values"][()], written("v", N)[stored])
        assert np.array_equal(f["clients/w"][()], written("w", N))  # the rows not stored read as the fill, 2.0
        assert np.array_equal(f["clients/s"][()], written("s", N))
    loaded = np.load(tmp_path / "loaded.npz")
    for name in TABLES:
        assert np.array_equal(loaded[name], written(name, N)), name
    assert loaded["saved"].tolist() == [1, 1] and loaded["loaded"].tolist() == [1, 1]
    assert np.array_equal(loaded["counts"], np.stack([np.arange(4)] * 2))
