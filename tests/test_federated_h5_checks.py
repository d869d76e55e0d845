"""Malformed TensorFlow-Federated files (``data.name=federated_h5``) refused where they enter
(fedrun/data/federated_h5_index.py): each variant is one line naming the file, the client and the field,
status 2, nothing written, bounded memory; the index is cached and a changed file is indexed again."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import h5py
import numpy as np
import pytest
from helpers import REPO, child_env
from test_scale_data import tff_pair, write_tff

from fedrun.cli import main
from fedrun.data import federated_h5_index
from fedrun.data.validate import MAX_CLASSES
from fedrun.errors import DataError

MEMBERS = federated_h5_index.Members("pixels", "label")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _dataset(path, name: str, **kwargs) -> None:
    with h5py.File(path, "a") as f:
        del f[name]
        f.create_dataset(name, **kwargs)


def malformed_pair(d, case: str) -> tuple[str, str, str]:
    """Write a valid pair into ``d`` and give it the defect ``case``: (bad file, client, field it names)."""
    data, ids = tff_pair(d)
    train, test = d / "train.h5", d / "test.h5"
    c = ids[2]
    x, y = data["train"][c]
    n = len(y)
    feature, label = f"examples/{c}/pixels", f"examples/{c}/label"
    if case == "labels [n, 2]":
        _dataset(train, label, data=np.stack([y, y], axis=1))
    elif case == "labels [n, 1, 1]":
        _dataset(train, label, data=y.reshape(n, 1, 1))
    elif case == "float labels":
        _dataset(train, label, data=y + 0.5)
    elif case == "negative label":
        _dataset(train, label, data=np.where(np.arange(n) == 1, -1, y))
    elif case == "label 1e12":
        _dataset(train, label, data=np.where(np.arange(n) == 1, 10**12, y))
    elif case == "string labels":
        _dataset(train, label, data=np.array([b"a"] * n))
    elif case in ("nan pixels", "inf pixels", "huge float64 pixels"):
        bad = {"nan pixels": np.nan, "inf pixels": np.inf, "huge float64 pixels": 1e300}[case]
        x = x.astype(np.float64)
        x[1, 3] = bad
        _dataset(train, feature, data=x)
    elif case in ("nan test pixels", "inf test pixels"):
        xt = data["test"][c][0].copy()
        xt[0, 0] = np.nan if case.startswith("nan") else -np.inf
        _dataset(test, feature, data=xt)
        return "test.h5", c, "pixels"
    elif case == "nan pixels of a later client":  # not the start-up probe's client: found when it trains
        c = ids[4]
        x = data["train"][c][0].copy()
        x[0, 5] = np.nan
        _dataset(train, f"examples/{c}/pixels", data=x)
    elif case == "ragged across clients":
        _dataset(train, feature, data=np.zeros((n, 7), np.float32))
    elif case == "ragged train vs test":
        _dataset(test, feature, data=np.zeros((len(data["test"][c][1]), 5), np.float32))
        return "test.h5", c, "pixels"
    elif case == "string pixels":
        _dataset(train, feature, data=np.array([[b"x"] * 6] * n))
    elif case == "compound pixels":
        _dataset(train, feature, data=np.zeros((n, 6), dtype=[("a", "f4"), ("b", "i4")]))
    elif case == "complex pixels":
        _dataset(train, feature, data=np.zeros((n, 6), np.complex64))
    elif case == "scalar pixels":
        _dataset(train, feature, data=np.float32(1))
    elif case == "1-d pixels":
        _dataset(train, feature, data=np.zeros(n, np.float32))
    elif case == "soft-link loop":
        with h5py.File(train, "a") as f:
            del f[f"examples/{c}"]
            f[f"examples/{c}"] = h5py.SoftLink(f"/examples/{c}")
        return "train.h5", c, f"examples/{c}"
    elif case == "soft-link loop dataset":
        with h5py.File(train, "a") as f:
            del f[feature]
            f[feature] = h5py.SoftLink(f"/{feature}")
    elif case == "1e12 rows declared":
        _dataset(train, feature, shape=(10**12, 6), dtype=np.float32, chunks=(1024, 6))
    elif case == "gzip bomb":  # 24 GB of zeros declared, one 24 MB chunk written, a few KB on disk
        with h5py.File(train, "a") as f:
            del f[feature]
            bomb = f.create_dataset(feature, shape=(10**9, 6), dtype=np.float32, chunks=(10**6, 6),
                                    compression="gzip")
            bomb[: 10**6] = 0.0
    elif case == "gzip bomb in the chunks":  # a small shape, one chunk of 3 GiB declared (maxshape unlimited)
        _dataset(train, feature, shape=(n, 6), maxshape=(None, 6), dtype=np.float32, chunks=(2**27, 6),
                 compression="gzip")
    elif case == "missing label":
        with h5py.File(train, "a") as f:
            del f[label]
        return "train.h5", c, "label"
    else:
        raise AssertionError(case)
    field = "label" if "label" in case else "pixels"
    return "train.h5", c, field


CASES = ("labels [n, 2]", "labels [n, 1, 1]", "float labels", "negative label", "label 1e12", "string labels",
         "nan pixels", "inf pixels", "huge float64 pixels", "nan test pixels", "inf test pixels",
         "nan pixels of a later client", "ragged across clients", "ragged train vs test", "string pixels",
         "compound pixels", "complex pixels", "scalar pixels", "1-d pixels", "soft-link loop",
         "soft-link loop dataset", "1e12 rows declared", "gzip bomb", "gzip bomb in the chunks", "missing label")


# inputs are read, and checked, when their client first trains (the start-up reads only the first client's and
# the pooled test set's): a run that started already
FOUND_IN_TRAINING = ("nan pixels", "inf pixels", "huge float64 pixels", "nan pixels of a later client")


def h5_settings(d) -> list[str]:
    """The overrides of a run on the pair in directory ``d`` (every client in every round)."""
    return ["data.name=federated_h5", "data.num_clients=5", "model.name=logistic", "run.rounds=2",
            "participation.clients_per_round=5", f"data.federated_h5.train={d / 'train.h5'}",
            f"data.federated_h5.test={d / 'test.h5'}"]


def _train(d, run_dir) -> list[str]:
    return ["train", "--quiet", f"run.dir={run_dir}", *h5_settings(d)]


@pytest.mark.parametrize("case", CASES)
def test_a_malformed_file_is_one_line_naming_file_client_and_field(tmp_path, case):
    name, client, field = malformed_pair(tmp_path, case)
    run_dir = tmp_path / "run"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(_train(tmp_path, run_dir))
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err.getvalue(), (case, err.getvalue())
    assert str(tmp_path / name) in lines[0] and f"client {client!r}" in lines[0] and field in lines[0], lines
    if case in FOUND_IN_TRAINING:  # a run that started: no checkpoint and no result of its bad round
        assert not list(run_dir.glob("ckpt_*")) and not (run_dir / "result.json").exists()
    else:
        assert not run_dir.exists(), list(run_dir.iterdir())  # a refused run writes nothing


@pytest.mark.parametrize("case", ["gzip bomb", "1e12 rows declared", "gzip bomb in the chunks"])
def test_bombs_are_refused_in_bounded_memory(tmp_path, case):
    """In a process of its own, to measure its peak memory: under 1 GiB (the bombs declare 3 to 24 GB)."""
    malformed_pair(tmp_path, case)
    # its own peak: VmHWM, as helpers.peak_rss_gib reads it (ru_maxrss would carry pytest's over exec)
    probe = ("import sys\nfrom fedrun.cli import main\ncode = main(sys.argv[1:])\n"
             "print(next(line for line in open('/proc/self/status') if line.startswith('VmHWM:')).split()[1])\n"
             "sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", probe, *_train(tmp_path, tmp_path / "run")], capture_output=True,
                          text=True, env=child_env() | {"XDG_CACHE_HOME": str(tmp_path / "cache")}, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 2 and "GiB" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    peak_kib = int(proc.stdout.split()[-1])
    assert peak_kib < 2**20, f"peak RSS {peak_kib / 2**20:.2f} GiB"


def test_the_index_is_cached_and_a_changed_file_indexed_again(tmp_path):
    """Start-up indexes each file once: a second run reads the index from the cache; rewriting the file (a bad
    label) makes the next start index it again and refuse it."""
    data, ids = tff_pair(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(_train(tmp_path, tmp_path / "a")) == 0
    cached = sorted((tmp_path / "cache" / "fedrun").glob("h5index_*.npz"))
    assert len(cached) == 2  # train and test
    stamps = [p.stat().st_mtime_ns for p in cached]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(_train(tmp_path, tmp_path / "b")) == 0
    assert [p.stat().st_mtime_ns for p in cached] == stamps  # read, not rewritten
    x, y = data["train"][ids[1]]
    data["train"][ids[1]] = (x, np.full_like(y, -3))
    write_tff(tmp_path / "train.h5", data["train"])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert main(_train(tmp_path, tmp_path / "c")) == 2
    assert f"client {ids[1]!r}" in err.getvalue() and "label -3" in err.getvalue(), err.getvalue()


@pytest.mark.parametrize("bad", [None, 0, 3, 6])
def test_labels_are_checked_per_client_across_blocks(tmp_path, monkeypatch, bad):
    """The label range is checked on blocks of clients (fedrun/data/federated_h5_index.py): with blocks of about 8
    labels, the bad label of any client, first, last or past a block's end, is named with its client and index,
    and a good file's largest label and counts come out as read."""
    monkeypatch.setattr(federated_h5_index, "_LABEL_BLOCK", 8)
    rng = np.random.default_rng(1)
    ids = [f"c{i}" for i in range(7)]
    clients = {cid: (np.zeros((n, 6), np.float32), rng.integers(0, 5, n)) for cid, n in zip(ids, [3, 1, 4, 2, 5, 1, 3],
                                                                                            strict=True)}
    if bad is not None:
        clients[ids[bad]][1][-1] = MAX_CLASSES
    write_tff(tmp_path / "train.h5", clients)
    with h5py.File(tmp_path / "train.h5", "r") as f:
        if bad is not None:
            with pytest.raises(DataError) as caught:
                federated_h5_index.index_clients(f, "train.h5", ids, MEMBERS)
            at = len(clients[ids[bad]][1]) - 1
            assert str(caught.value) == (f"train.h5: client {ids[bad]!r}: examples/{ids[bad]}/label: label "
                                         f"{MAX_CLASSES} at index {at}; expected class labels in [0, {MAX_CLASSES})")
            return
        index = federated_h5_index.index_clients(f, "train.h5", ids, MEMBERS)
    assert index.counts.tolist() == [3, 1, 4, 2, 5, 1, 3] and index.shape == (6,)
    assert index.top == max(int(y.max()) for _, y in clients.values())
