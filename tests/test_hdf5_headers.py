"""HDF5 headers read from the file's bytes (fedrun/hdf5/headers.py) give ``data.name=federated_h5``'s index
exactly what HDF5's own calls give (fedrun/data/federated_h5_index.py), for files h5py writes with its default
settings (TensorFlow Federated's) and with ``libver="latest"``, and a client whose datasets the reader does not
understand goes through HDF5; a damaged file is never read out of bounds nor a traceback."""

from __future__ import annotations

import contextlib
import io

import h5py
import numpy as np
import pytest
from test_federated_h5_checks import h5_settings
from test_scale_data import tff_pair

from fedrun.cli import main
from fedrun.data import federated_h5_cache, federated_h5_index
from fedrun.errors import DataError, NotUnderstood
from fedrun.hdf5.headers import HDF5Headers
from fedrun.hdf5.templates import HDF5Templates

REFUSED = (NotUnderstood, DataError)  # asks HDF5; damage found (one line naming the file)

MEMBERS = federated_h5_index.Members("pixels", "label")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _compact() -> h5py.h5p.PropDCID:
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.COMPACT)
    return dcpl


# per client: (feature dtype, label dtype, label shape [n] or [n, 1], storage of both, the libvers for which it goes
# through HDF5)
ALL = ("earliest", "latest")
VARIANTS = [
    ("<f4", "<i8", "n", "contiguous", ()),
    ("<f2", "<i1", "n1", "contiguous", ()),
    ("<f8", "<i2", "n", "contiguous", ()),
    (">f4", ">i4", "n", "contiguous", ()),
    ("<i4", "<u1", "n1", "contiguous", ()),
    ("<u2", ">u2", "n", "contiguous", ()),
    ("<f4", "<u4", "n", "compact", ()),
    ("<f4", "<i4", "n", "extra", ()),  # a third dataset in the client's group
    ("<f4", "<i4", "n", "many", ("latest",)),  # 11 links: 2 "SNOD"s; a fractal heap (dense, not parsed)
    ("<f4", "<i4", "n", "track_order", ()),  # links with their creation order
    ("<f4", "<i4", "n", "chunked", ALL),
    ("<f4", "<i4", "n", "gzip", ALL),
    ("<f4", "<i4", "n", "external", ALL),
    ("<f4", "<u8", "n", "contiguous", ALL),  # HDF5's conversion to int64 saturates: its path decides
]


def write_variants(path, libver: str, clients: int) -> int:
    """A file of ``clients`` clients cycling through VARIANTS (shape [n, 3, 2], n = 1 + i % 4): how many of them
    must go through HDF5."""
    rng = np.random.default_rng(len(path.name))
    slow = 0
    with h5py.File(path, "w", libver=libver) as f:
        examples = f.create_group("examples")
        for i in range(clients):
            x_type, y_type, y_shape, storage, through = VARIANTS[i % len(VARIANTS)]
            slow += libver in through
            n = 1 + i % 4
            group = examples.create_group(f"c{i:03d}", track_order=storage == "track_order")
            x = rng.integers(0, 50, (n, 3, 2)).astype(x_type)
            y = rng.integers(0, 60, n).astype(y_type).reshape((n,) if y_shape == "n" else (n, 1))
            kwargs = {"compact": {"dcpl": _compact()}, "chunked": {"chunks": True},
                      "gzip": {"compression": "gzip"}}.get(storage, {})
            if storage == "external":
                kwargs = {"external": [(str(path) + f".{i}.raw", 0, h5py.h5f.UNLIMITED)]}
            group.create_dataset("pixels", data=x, **kwargs)
            group.create_dataset("label", data=y, **kwargs)
            for extra in range({"extra": 1, "many": 9}.get(storage, 0)):
                group.create_dataset(f"weights{extra}", data=np.ones(n))
    return slow


def _both_ways(path, monkeypatch, shape=None) -> tuple[federated_h5_index.ClientIndex, ...]:
    """The file's index from its headers, and with every client through HDF5 (no headers understood)."""
    with h5py.File(path, "r") as f:
        ids, links = federated_h5_index.client_ids(f)
        assert links is not None and ids == sorted(f["examples"].keys())
        try:
            fast = federated_h5_index.index_clients(f, str(path), ids, MEMBERS, shape, links)
        finally:
            links.close()
        with monkeypatch.context() as m:
            m.setattr(federated_h5_index, "client_links", lambda f: None)
            slow = federated_h5_index.index_clients(f, str(path), ids, MEMBERS, shape)
    assert slow.through_hdf5 == len(ids)
    return fast, slow


@pytest.mark.parametrize("templates", [0, 4])  # each client parsed alone; templates applied to many at once
@pytest.mark.parametrize("libver", ["earliest", "latest"])
@pytest.mark.parametrize("clients", [5, 2 * len(VARIANTS) + 1])  # under and over 8 links (compact, dense)
def test_the_headers_index_equals_hdf5s(tmp_path, monkeypatch, libver, clients, templates):
    monkeypatch.setattr(federated_h5_index, "_TEMPLATES", templates)
    path = tmp_path / f"train_{libver}.h5"
    expected_slow = write_variants(path, libver, clients)
    fast, slow = _both_ways(path, monkeypatch)
    assert fast.counts.tolist() == slow.counts.tolist() == [1 + i % 4 for i in range(clients)]
    assert fast.shape == slow.shape == (3, 2) and fast.top == slow.top
    assert fast.through_hdf5 == expected_slow  # every plain client from its headers
    fast, slow = _both_ways(path, monkeypatch, shape=(3, 2))  # as the test file is indexed
    assert (fast.counts.tolist(), fast.top) == (slow.counts.tolist(), slow.top)


def test_labels_are_gathered_in_bounded_parts(tmp_path, monkeypatch):
    """With the labels held at once bounded to 3 (not 2^20), a block of clients of 1-4 labels is gathered in parts
    (a client of 4 alone), and the index is still HDF5's, every client from its headers."""
    monkeypatch.setattr(federated_h5_index, "_LABEL_BLOCK", 3)
    parts = []
    real = federated_h5_index._parts
    monkeypatch.setattr(federated_h5_index, "_parts", lambda sizes, limit: parts.extend(
        [sizes[p].tolist() for p in real(sizes, limit)]) or real(sizes, limit))
    path = tmp_path / "train.h5"
    with h5py.File(path, "w") as f:
        for i in range(12):
            f[f"examples/c{i:02d}/pixels"] = np.zeros((1 + i % 4, 3, 2), dtype=np.float32)
            f[f"examples/c{i:02d}/label"] = np.arange(1 + i % 4, dtype=np.int32) + i
    fast, slow = _both_ways(path, monkeypatch, shape=(3, 2))
    assert (fast.counts.tolist(), fast.top, fast.through_hdf5) == (slow.counts.tolist(), slow.top, 0)
    assert parts and all(sum(p) <= 3 or len(p) == 1 for p in parts) and [4] in parts, parts


def _pair(d, libver: str) -> None:
    """tests/test_scale_data.py's pair of files, written with h5py's ``libver``."""
    tff_pair(d)
    for split in ("train", "test"):
        with h5py.File(d / f"{split}.h5", "r") as f:
            data = {cid: (g["pixels"][()], g["label"][()]) for cid, g in f["examples"].items()}
        with h5py.File(d / f"{split}.h5", "w", libver=libver) as f:
            for cid, (x, y) in data.items():
                f[f"examples/{cid}/pixels"], f[f"examples/{cid}/label"] = x, y


@pytest.mark.parametrize("libver", ["earliest", "latest"])
def test_a_run_reads_every_client_from_its_headers(tmp_path, monkeypatch, libver):
    """A whole run's start-up (fedrun/data/federated_h5.py) sends no client of a plain pair through HDF5, and parses
    one client alone (the train file's first, which sets the shape): the others match its templates."""
    _pair(tmp_path, libver)
    indexes, alone = [], []
    real, one_by_one = federated_h5_index.index_clients, federated_h5_index._from_headers
    monkeypatch.setattr(federated_h5_index, "_from_headers", lambda links, cids, *a: alone.extend(cids)
                        or one_by_one(links, cids, *a))
    monkeypatch.setattr(federated_h5_cache, "index_clients", lambda *a, **k: indexes.append(real(*a, **k))
                        or indexes[-1])
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["train", "--quiet", f"run.dir={tmp_path / 'run'}", *h5_settings(tmp_path)]) == 0
    assert [index.through_hdf5 for index in indexes] == [0, 0] and len(alone) == 1


def _flipped(data: bytes, at: int, bit: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 1 << bit
    return bytes(out)


def _read_everything(headers: HDF5Templates, groups: np.ndarray) -> int:
    """Parse the file's groups and datasets one by one and by templates (the clean file's client groups at
    ``groups``): how many datasets were read. Anything but :class:`NotUnderstood` or :class:`DataError` fails the
    test."""
    read = 0
    with contextlib.suppress(*REFUSED):
        root = headers.links(headers.root)
        examples = headers.links(root["examples"]) if root and root.get("examples") is not None else None
        for address in (examples or {}).values():
            members = headers.links(address) if address is not None else None
            for member in (members or {}).values():
                with contextlib.suppress(*REFUSED):
                    dataset = headers.dataset(member)
                    assert headers.read(dataset).nbytes == dataset.nbytes  # in bounds: all of it
                    read += 1
    headers.verify()
    with contextlib.suppress(*REFUSED):
        template = headers.group_template(int(groups[0]), ("pixels", "label"))
        ok, fields = headers.match(template, groups)
        for output in template.outputs:
            addresses = fields[ok, output]
            with contextlib.suppress(*REFUSED):
                dataset = headers.dataset_template(int(addresses[0])) if len(addresses) else None
                if dataset is not None:
                    good, shapes, data = headers.datasets(dataset, addresses)
                    counts = shapes[good].prod(axis=1)
                    assert len(headers.gather(dataset.dataset.dtype, data[good], counts)) == counts.sum()
                    read += int(good.sum())
    return read


@pytest.mark.parametrize("libver", ["earliest", "latest"])
def test_damaged_headers_are_not_understood_or_read_in_bounds(tmp_path, libver):
    """130 truncations and 150 single-bit flips of a small file: the reader, one object at a time
    and by templates, either reads it (in bounds) or says :class:`NotUnderstood` or :class:`DataError`, never
    another exception."""
    path = tmp_path / "clean.h5"
    write_variants(path, libver, 6)
    with h5py.File(path, "r") as f:
        groups = np.array([h5py.h5o.get_info(g.id).addr for g in f["examples"].values()], dtype=np.uint64)
    clean = path.read_bytes()
    damaged = tmp_path / "damaged.h5"
    rng = np.random.default_rng(2)
    cases = [clean[:cut] for cut in [*range(0, 100), *range(100, len(clean), max(1, len(clean) // 30))]]
    cases += [_flipped(clean, int(at), int(rng.integers(8))) for at in rng.integers(0, len(clean), 150)]
    read = 0
    for data in cases:
        damaged.write_bytes(data)
        try:
            headers = HDF5Templates(str(damaged))
        except REFUSED:
            continue
        try:
            read += _read_everything(headers, groups)
        finally:
            headers.close()
    assert read > 0


@pytest.mark.parametrize("libver", ["earliest", "latest"])
@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_a_damaged_file_is_one_line(tmp_path, damage, libver):
    """A train file cut short, or a client's label header declaring 1e12 labels (in a version 2 header, its
    checksum no longer matches): one line naming the file, status 2, no traceback (HDF5's path gives the line
    where the headers are not understood)."""
    _pair(tmp_path, libver)
    train = tmp_path / "train.h5"
    data = train.read_bytes()
    if damage == "truncated":
        train.write_bytes(data[: len(data) * 2 // 3])
    else:  # the dimension of a label's dataspace: 1e12 rows, which the headers refuse to read past the file
        with h5py.File(train, "r") as f:
            address = h5py.h5o.get_info(f["examples/10/label"].id).addr
        headers = HDF5Headers(str(train))
        space = next(pos for kind, _, pos, _ in headers.messages(address) if kind == 0x0001)
        headers.close()
        first = space + (8 if data[space] == 1 else 4)  # the first dimension, in dataspace versions 1 and 2
        train.write_bytes(data[:first] + (10**12).to_bytes(8, "little") + data[first + 8:])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["train", "--quiet", f"run.dir={tmp_path / 'run'}", *h5_settings(tmp_path)])
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err.getvalue(), err.getvalue()
    assert str(train) in lines[0], lines
