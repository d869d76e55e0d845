"""Differential fuzzing of ``data.name=federated_h5``'s start-up against h5py (fedrun/hdf5/headers.py, its
index, fedrun/data/federated_h5.py): seeded random byte flips and truncations of small pairs of each layout
(h5py's default and ``libver="latest"``; contiguous, chunked, gzip), and crafted damage (a second data layout
message, a B-tree node pointing at itself, maximum dimensions under the dimensions). Each case is either refused
with one line naming the damaged file (a :class:`~fedrun.errors.DataError`, nothing else escaping) or read to
exactly the arrays h5py reads: the same client ids, counts, example shape, classes and every client's inputs and
labels. Both sides run in a worker process (tests/hdf5_fuzz_worker.py): HDF5 itself may crash on a damaged file,
which is a failure when fedrun's side crashed and no finding when only h5py's did."""

from __future__ import annotations

import contextlib
import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import REPO, child_env

from fedrun.cli import main
from fedrun.config import DataConfig, FederatedH5Config
from fedrun.data import federated_h5_cache, federated_h5_index
from fedrun.data.federated_h5 import FederatedH5
from fedrun.hdf5.checksum import lookup3
from fedrun.hdf5.headers import HDF5Headers

CLIENTS = 5
# (libver, storage, clients): 12 clients make a B-tree of two "SNOD"s (earliest) and dense link storage (latest)
LAYOUTS = [(libver, storage, CLIENTS) for libver in ("earliest", "latest")
           for storage in ("contiguous", "chunked", "gzip")]
LAYOUTS += [("earliest", "contiguous", 12), ("latest", "contiguous", 12)]
FLIPS, CUTS = 48, 8  # per layout
SEED = 46
WORKER = REPO / "tests" / "hdf5_fuzz_worker.py"


def write_pair(d: Path, libver: str = "earliest", storage: str = "contiguous", sizes=None,
               clients: int = CLIENTS) -> tuple[Path, Path]:
    """A train and a test file of ``clients`` clients (``pixels`` [n, 6] float32, ``label`` [n] int64 in [0, 3);
    n = ``sizes[i]``, else 2 + i % 3) in one layout."""
    rng = np.random.default_rng(7)
    kwargs = {"chunked": {"chunks": True}, "gzip": {"compression": "gzip"}}.get(storage, {})
    paths = d / "train.h5", d / "test.h5"
    for path in paths:
        with h5py.File(path, "w", libver=libver) as f:
            for i in range(clients):
                n = sizes[i] if sizes else 2 + i % 3
                f.create_dataset(f"examples/c{i}/pixels", data=rng.normal(size=(n, 6)).astype(np.float32), **kwargs)
                f.create_dataset(f"examples/c{i}/label", data=rng.integers(0, 3, n), **kwargs)
    return paths


def structure(path: Path) -> np.ndarray:
    """The offsets of the file's structure: not its raw data (contiguous data, chunks; flips there change values)
    nor runs of 24 zeros or more (null messages, unused entries of nodes, free space)."""
    data = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    cold = np.zeros(len(data), dtype=bool)
    for start, length in raw_extents(path):
        cold[start:start + length] = True
    edges = np.flatnonzero(np.diff(np.concatenate([[0], (data == 0).view(np.int8), [0]])))
    for start, stop in zip(edges[0::2], edges[1::2], strict=True):
        cold[start:stop] |= stop - start >= 24
    return np.flatnonzero(~cold)


def raw_extents(path: Path) -> list[tuple[int, int]]:
    """Where the file's raw data lies (contiguous data, chunks)."""
    out = []
    with h5py.File(path, "r") as f:
        for cid in f["examples"]:
            for name in ("pixels", "label"):
                dset = f["examples"][cid][name].id
                if dset.get_offset() is not None:
                    out.append((dset.get_offset(), dset.get_storage_size()))
                else:
                    out.extend((info.byte_offset, info.size) for info in map(dset.get_chunk_info,
                                                                             range(dset.get_num_chunks())))
    return out


def run_cases(cases: list[dict], timeout: float = 240) -> list[tuple[dict | None, dict | None]]:
    """Each case's (fedrun side, h5py side) from the worker; a side whose process crashed or hung is
    ``{"crash": status}``, and the worker starts again after that case."""
    spec = Path(cases[0]["cache"]).parent / "cases.json"
    spec.write_text(json.dumps(cases))
    results: list[dict] = [{} for _ in cases]
    first = 0
    while first < len(cases):
        try:
            proc = subprocess.run([sys.executable, str(WORKER), str(spec), str(first)], capture_output=True, text=True,
                                  env=child_env(), cwd=REPO, timeout=timeout)
            out, status = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as exc:
            out, status = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""), "hang"
        begun = None
        for line in out.splitlines():
            record = json.loads(line)
            if "begin" in record:
                begun = (record["case"], record["begin"])
            else:
                results[record["case"]].update({k: v for k, v in record.items() if k != "case"})
                begun = None
        if status == 0 and begun is None:
            break
        assert begun is not None, (status, proc.stderr[-2000:] if status != "hang" else "")
        case, side = begun
        results[case][side] = {"crash": status}
        if side == "fedrun":
            results[case]["h5py"] = {"crash": "not run"}
        first = case + 1
    return [(r.get("fedrun"), r.get("h5py")) for r in results]


def judge(case: dict, fed: dict, ref: dict) -> str | None:
    """None when fedrun refused the case with one line naming a file of the pair (the damaged one, or the other
    where the damage renamed a client the other lacks), or read exactly what h5py reads; else what went wrong."""
    if "crash" in fed or "escaped" in fed:
        return f"fedrun: {fed}"
    if "refused" in fed:
        line = fed["refused"]
        if "\n" in line or (case["train"] not in line and case["test"] not in line):
            return f"refused without one line naming a file: {line!r}"
        return None
    if "crash" in ref or "error" in ref:
        return f"fedrun read what h5py does not: {ref}"
    train, test, ids = ref["train"], ref["test"], fed["ids"]
    if ids != sorted(train):
        return f"ids {ids}, h5py lists {sorted(train)}"
    if any(cid not in test for cid in ids):
        return f"test clients {sorted(test)}"
    for i, cid in enumerate(ids):
        for split, counts in (("train", fed["counts"]), ("test", fed["test_counts"])):
            x, y, n, shape, _ = ref[split][cid]
            if fed[split][i] != [x, y] or counts[i] != n or fed["shape"] != shape:
                return f"client {cid} of {split}: fedrun {fed[split][i]} ({counts[i]}, {fed['shape']}), h5py {x, y, n}"
    classes = 1 + max(ref[split][cid][4] for split in ("train", "test") for cid in ids)
    if fed["classes"] != classes:
        return f"{fed['classes']} classes, h5py's labels {classes}"
    return None


def _flipped(data: bytes, at: int, mask: int) -> bytes:
    out = bytearray(data)
    out[at] ^= mask
    return bytes(out)


def _case(d: Path, clean: tuple[Path, Path], name: str, which: int, data: bytes, clients: int = CLIENTS) -> dict:
    """A case: the pair ``clean`` with file ``which`` (0 train, 1 test) replaced by ``data``."""
    folder = d / name
    folder.mkdir()
    paths = [folder / "train.h5", folder / "test.h5"]
    for i, path in enumerate(paths):
        path.write_bytes(data if i == which else clean[i].read_bytes())
    return {"train": str(paths[0]), "test": str(paths[1]), "clients": clients, "cache": str(folder / "cache"),
            "damaged": str(paths[which]), "name": name}


def random_cases(d: Path) -> list[dict]:
    """FLIPS byte flips (seeded; one bit, or any bits, of a byte; 7 in 8 of them off the raw data, where the
    structure is: :func:`structure`) and CUTS truncations of one file of the pair, per layout."""
    rng = np.random.default_rng(SEED)
    cases = []
    for libver, storage, clients in LAYOUTS:
        layout = d / f"{libver}_{storage}_{clients}"
        layout.mkdir()
        clean = write_pair(layout, libver, storage, clients=clients)
        for which, path in enumerate(clean):
            data, hot = path.read_bytes(), structure(path)
            count = FLIPS // 2 + (FLIPS % 2 if which == 0 else 0)
            for k in range(count):
                at = int(rng.choice(hot)) if rng.random() < 7 / 8 else int(rng.integers(len(data)))
                mask = 1 << int(rng.integers(8)) if k % 2 else int(rng.integers(1, 256))
                cases.append(_case(d, clean, f"{layout.name}_{which}_flip{k}_{at}", which, _flipped(data, at, mask),
                                   clients))
            for k in range(CUTS // 2):
                cut = int(rng.integers(len(data)))
                cases.append(_case(d, clean, f"{layout.name}_{which}_cut{k}_{cut}", which, data[:cut], clients))
    return cases


def _address(path: Path, name: str) -> int:
    with h5py.File(path, "r") as f:
        return h5py.h5o.get_info(f[name].id).addr


def _symbol_table(path: Path, group: str) -> tuple[int, int]:
    """The B-tree and heap addresses of an old-style ``group``."""
    headers = HDF5Headers(str(path))
    data = next(pos for kind, _, pos, _ in headers.messages(_address(path, group)) if kind == 0x0011)
    headers.close()
    raw = path.read_bytes()
    return struct.unpack_from("<Q", raw, data)[0], struct.unpack_from("<Q", raw, data + 8)[0]


def second_layout(train: Path) -> bytes:
    """Client c0's label header given a second data layout message, in its null message's room: the layout of
    c0's ``hidden`` dataset (three 9s). HDF5 reads the first (labels under 3). Version 1 headers (h5py's default)
    count one message more; version 2 headers (``libver="latest"``) get their checksum again."""
    data = bytearray(train.read_bytes())
    header = _address(train, "examples/c0/label")
    headers = HDF5Headers(str(train))
    other, length = next((pos, size) for kind, _, pos, size in headers.messages(_address(train, "examples/c0/hidden"))
                         if kind == 0x0008)
    headers.close()
    if data[header] == 1:
        step, pack, begin = 8, struct.Struct("<HHB3x"), header + 16
        end = begin + struct.unpack_from("<I", data, header + 8)[0]
    else:
        flags = data[header + 5]
        assert data[header:header + 4] == b"OHDR" and not flags & 0x14  # no phase change, no creation order
        step, pack, start = 4, struct.Struct("<BHB"), header + 6 + (16 if flags & 0x20 else 0)
        begin = start + (1 << (flags & 3))
        end = begin + int.from_bytes(data[start:begin], "little")
    pos = begin
    while pack.unpack_from(data, pos)[0] != 0x0000:  # the null message
        pos += step + pack.unpack_from(data, pos)[1]
    room = pack.unpack_from(data, pos)[1]
    data[pos:pos + step + length] = pack.pack(0x0008, length, 0) + data[other:other + length]
    data[pos + step + length:pos + 2 * step + length] = pack.pack(0x0000, room - step - length, 0)
    if step == 8:
        data[header + 2:header + 4] = struct.pack("<H", struct.unpack_from("<H", data, header + 2)[0] + 1)
    else:
        row = np.zeros((1, 12 * -(-(end - header) // 12)), dtype=np.uint8)
        row[0, :end - header] = np.frombuffer(bytes(data[header:end]), dtype=np.uint8)
        data[end:end + 4] = struct.pack("<I", int(lookup3(row, end - header)[0]))
    return bytes(data)


def self_pointing_btree(train: Path, group: str = "examples") -> bytes:
    """``group``'s B-tree node made an internal node (level 1) whose child is the node itself."""
    data = bytearray(train.read_bytes())
    btree, _ = _symbol_table(train, group)
    data[btree + 5] = 1
    data[btree + 32:btree + 40] = struct.pack("<Q", btree)
    return bytes(data)


def small_maxdims(train: Path) -> bytes:
    """Client c1's label dataspace: the maximum dimension one under the dimension."""
    data = bytearray(train.read_bytes())
    headers = HDF5Headers(str(train))
    space = next(pos for kind, _, pos, _ in headers.messages(_address(train, "examples/c1/label")) if kind == 0x0001)
    headers.close()
    assert data[space] == 1 and data[space + 2] & 1  # version 1, maximum dimensions stored
    dim = struct.unpack_from("<Q", data, space + 8)[0]
    data[space + 16:space + 24] = struct.pack("<Q", dim - 1)
    return bytes(data)


def one_more_message(train: Path) -> bytes:
    """Client c1's label header (version 1) says it holds one message more than it does."""
    data = bytearray(train.read_bytes())
    header = _address(train, "examples/c1/label")
    data[header + 2:header + 4] = struct.pack("<H", struct.unpack_from("<H", data, header + 2)[0] + 1)
    return bytes(data)


def cache_type(train: Path) -> bytes:
    """The first entry of the ``examples`` group's symbol table node: cache type 3 (HDF5 knows 0 to 2)."""
    data = bytearray(train.read_bytes())
    btree, _ = _symbol_table(train, "examples")
    snod = struct.unpack_from("<Q", data, btree + 32)[0]
    data[snod + 8 + 16:snod + 8 + 20] = struct.pack("<I", 3)
    return bytes(data)


def heap_free_list(train: Path) -> bytes:
    """Client c3's local heap (its members' names): the free list starting past the heap's data."""
    data = bytearray(train.read_bytes())
    _, heap = _symbol_table(train, "examples/c3")
    size = struct.unpack_from("<Q", data, heap + 8)[0]
    data[heap + 16:heap + 24] = struct.pack("<Q", size + 8)
    return bytes(data)


def early_end(train: Path) -> bytes:
    """The superblock's end-of-file address 64 bytes before the file's end: the last bytes are past it."""
    data = bytearray(train.read_bytes())
    assert data[8] == 0  # superblock version 0: the end of file address after base and free-space addresses
    data[24 + 16:24 + 24] = struct.pack("<Q", len(data) - 64)
    return bytes(data)


def crafted_pair(d: Path, libver: str = "earliest") -> tuple[Path, Path]:
    """A pair of 3 examples per client, and in the train file's client c0 a third dataset, ``hidden``, of three
    9s: a reader of :func:`second_layout`'s second message would see 10 classes, HDF5 sees 3."""
    clean = write_pair(d, libver, sizes=[3] * CLIENTS)
    with h5py.File(clean[0], "r+", libver=libver) as f:
        f["examples/c0/hidden"] = np.full(3, 9)
    return clean


def crafted_cases(d: Path) -> list[dict]:
    folder = d / "crafted"
    (folder / "latest").mkdir(parents=True)
    clean, latest = crafted_pair(folder), crafted_pair(folder / "latest", "latest")
    return [_case(d, clean, "second layout", 0, second_layout(clean[0])),
            _case(d, latest, "second layout (latest)", 0, second_layout(latest[0])),
            _case(d, clean, "self-pointing B-tree of examples", 0, self_pointing_btree(clean[0])),
            _case(d, clean, "self-pointing B-tree of a client", 0, self_pointing_btree(clean[0], "examples/c2")),
            _case(d, clean, "maximum dimension under the dimension", 0, small_maxdims(clean[0])),
            _case(d, clean, "one message more", 0, one_more_message(clean[0])),
            _case(d, clean, "cache type 3", 0, cache_type(clean[0])),
            _case(d, clean, "free list past the heap", 0, heap_free_list(clean[0])),
            _case(d, clean, "end of file address early", 0, early_end(clean[0]))]


def test_damaged_files_are_refused_in_one_line_or_read_as_h5py_reads_them(tmp_path):
    """All random and crafted cases through the worker: none fails :func:`judge`; the crafted self-pointing
    B-trees are refused, and the random cases are a mix of both outcomes."""
    cases = random_cases(tmp_path) + crafted_cases(tmp_path)
    results = run_cases(cases)
    failures = [(case["name"], judge(case, fed, ref)) for case, (fed, ref) in zip(cases, results, strict=True)
                if judge(case, fed, ref) is not None]
    assert not failures, failures
    refused = {case["name"] for case, (fed, _) in zip(cases, results, strict=True) if "refused" in fed}
    crafted = {case["name"] for case in cases[-9:]}
    assert {"self-pointing B-tree of examples", "self-pointing B-tree of a client"} <= refused
    assert len(refused - crafted) > 100 and len({c["name"] for c in cases} - refused) > 50, len(refused)
    # refused when a client is first loaded, not at start-up: only raw data start-up does not read (a chunked
    # feature's chunk index) that h5py cannot read either
    late = [(case["name"], ref) for case, (fed, ref) in zip(cases, results, strict=True) if fed.get("when") == "load"]
    assert all("error" in ref for _, ref in late), late


def test_a_run_on_a_file_that_crashed_hdf5_is_one_line_and_leaves_no_lock(tmp_path):
    """A real run (``python -m fedrun train``) on a train file whose B-tree node points at itself, the case that
    made HDF5 segfault (exit 139, the run directory's ``.lock`` left): status 2, one line naming the file. No
    ``data.num_clients``: the config's count of the file's clients does not hand HDF5 the group either."""
    train, _ = write_pair(tmp_path)
    train.write_bytes(self_pointing_btree(train))
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "fedrun", "train", "--quiet", f"run.dir={run_dir}",
                           "data.name=federated_h5", "model.name=logistic",
                           "run.rounds=1", f"data.federated_h5.train={train}",
                           f"data.federated_h5.test={tmp_path / 'test.h5'}"], capture_output=True, text=True,
                          env=child_env() | {"XDG_CACHE_HOME": str(tmp_path / "cache")}, cwd=REPO, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert str(train) in lines[0] and "B-tree" in lines[0], lines
    assert not (run_dir / ".lock").exists()


def _train(d: Path, run: str) -> int:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["train", "--quiet", f"run.dir={d / run}", "data.name=federated_h5", f"data.num_clients={CLIENTS}",
                     "model.name=logistic", "run.rounds=1", f"participation.clients_per_round={CLIENTS}",
                     f"data.federated_h5.train={d / 'train.h5'}", f"data.federated_h5.test={d / 'test.h5'}"])
    _train.err = err.getvalue()
    return code


def test_an_edit_in_place_with_its_time_restored_is_indexed_again(tmp_path, monkeypatch):
    """A label rewritten in place to 50 (3 classes before), the modification time set back: the next start
    indexes the file again (51 classes), not the cached index of 3 (with which class 50 was an IndexError)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    train, _ = write_pair(tmp_path)
    assert _train(tmp_path, "a") == 0, _train.err
    stat = os.stat(train)
    with h5py.File(train, "r") as f:
        offset = f["examples/c1/label"].id.get_offset()
    with open(train, "r+b") as fh:  # the first label of client c1, int64, in place
        fh.seek(offset)
        fh.write(struct.pack("<q", 50))
    os.utime(train, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(train).st_mtime_ns == stat.st_mtime_ns and os.stat(train).st_size == stat.st_size
    with h5py.File(train, "r") as f:
        ids, links = federated_h5_index.client_ids(f)
        index = federated_h5_cache.cached_index(f, str(train), ids, federated_h5_index.Members("pixels", "label"),
                                                links=links)
        links.close()
    assert index.top == 50
    assert _train(tmp_path, "b") == 0, _train.err


def test_an_index_that_does_not_hold_is_one_line_when_its_client_is_read(tmp_path, monkeypatch):
    """A cached index that no longer holds for the file (as if the file changed and its key did not: one count
    off) is found when the client is read, one line, status 2, not examples of another count."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_pair(tmp_path)
    assert _train(tmp_path, "a") == 0, _train.err
    for cached in (tmp_path / "cache" / "fedrun").glob("h5index_*.npz"):
        with np.load(cached) as z:
            entries = dict(z)
        entries["counts"] = entries["counts"] + 1
        np.savez(cached, **entries)
    assert _train(tmp_path, "b") == 2
    lines = _train.err.strip().splitlines()
    assert len(lines) == 1 and "expected the file unchanged since it was indexed" in lines[0], lines


@pytest.mark.parametrize("libver", ["earliest", "latest"])
def test_a_second_layout_message_is_read_as_hdf5_reads_it(tmp_path, monkeypatch, libver):
    """In this process (HDF5 does not crash on it): the first of two data layout messages is the labels', as
    HDF5 reads it: 3 classes (the reader of the last saw 10 classes, exit 0)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    train, test = crafted_pair(tmp_path, libver)
    train.write_bytes(second_layout(train))
    with h5py.File(train, "r") as f:
        assert f["examples/c0/label"][()].max() < 3
    cfg = DataConfig(name="federated_h5", num_clients=CLIENTS,
                     federated_h5=FederatedH5Config(train=str(train), test=str(test)))
    source = FederatedH5(cfg, 0)
    source.close()
    assert source.task.num_classes == 3


def test_maximum_dimensions_under_the_dimensions_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    train, _ = write_pair(tmp_path)
    train.write_bytes(small_maxdims(train))
    assert _train(tmp_path, "run") == 2
    lines = _train.err.strip().splitlines()
    assert len(lines) == 1 and str(train) in lines[0] and "Traceback" not in _train.err, _train.err


@pytest.mark.parametrize("libver", ["earliest", "latest"])
def test_a_client_name_not_in_utf8_is_one_line(tmp_path, monkeypatch, libver):
    """A client group named by bytes that are not UTF-8 (h5py lists it as bytes; sorting it with the other,
    text, names was a TypeError traceback), among 10 clients (libver latest: dense storage, listed by HDF5)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    write_pair(tmp_path, libver, clients=10)
    with h5py.File(tmp_path / "train.h5", "a", libver=libver) as f:
        f.create_group(b"examples/c\xff")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["train", "--quiet", f"run.dir={tmp_path / 'run'}", "data.name=federated_h5", "model.name=logistic",
                     f"data.federated_h5.train={tmp_path / 'train.h5'}",
                     f"data.federated_h5.test={tmp_path / 'test.h5'}"])
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1 and str(tmp_path / "train.h5") in lines[0] and "UTF-8" in lines[0], lines
