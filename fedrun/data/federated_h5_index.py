"""A TensorFlow-Federated HDF5 file checked where it enters: one pass over its clients, bounded reads.

``data.name=federated_h5`` files come from elsewhere and hold one group per client (fedrun/data/federated_h5.py).
What a bad file did before it was checked here: labels shaped ``[n, 2]`` became 2n labels (a run ending 0,
silently wrong), NaN pixels surfaced as a "non-finite update" (status 3), string or compound pixels, ragged
shapes, a scalar feature and a soft-link loop were tracebacks, a dataset declaring 1e12 rows asked for
7 TiB, and gzip bombs (gigabytes of zeros in kilobytes) grew without a message. So:

* :func:`index_clients` visits every client once and checks the metadata: the group and both datasets open (a
  soft-link loop does not), the feature is ``[n, ...]`` of real numbers with one per-example shape in every client
  (and, by the caller, in train and test), the label is ``[n]`` (or ``[n, 1]``) integers, n >= 1, and every
  dataset's declared size, and its chunk's, is at most :data:`MAX_READ_BYTES` before a byte is read. Then it
  reads the labels (bounded) and checks ``0 <= label < MAX_CLASSES`` on blocks of clients at once
  (:class:`_LabelRanges`).

  HDF5's own open of a dataset costs about 0.15 ms (it reads the object header, builds caches and property
  lists): through HDF5 (:func:`_by_hdf5`: h5py's low-level calls, each client's two datasets opened by path)
  indexing cost 0.39 ms of CPU per client and file, 248 s for the two files of 342,477 clients, when the target
  is a 30 s start. So a client's group and datasets are read from the file's bytes instead
  (fedrun/hdf5/headers.py), and since h5py writes every client alike, one client's parse is applied to a
  block of :data:`_BLOCK` clients at once with numpy (fedrun/hdf5/templates.py, :func:`_templated`), the
  labels gathered from the mapped file in one go: about 6 us of CPU per client and file. The clients are listed
  once (:func:`client_links`: the ``examples`` group's links with their objects' addresses, which also give the
  sorted ids). A client that no template matches is parsed alone (:func:`_from_headers`); a client whose headers
  are not fully understood (chunked, compressed, external or virtual storage, data never written, soft links,
  other types, uint64 labels, a checksum that does not match, anything odd) or that fails a check goes through HDF5
  (:func:`_by_hdf5`), which gives the line: the headers never refuse a file themselves, so every message is
  HDF5's path's. :attr:`ClientIndex.through_hdf5` counts those clients.
* fedrun/data/federated_h5_cache.py keeps what :func:`index_clients` learnt of a file in fedrun's cache directory
  (the cold start at 342,477 clients is measured in bench/federated_h5_index.py).
* :func:`check_examples` checks examples as they are read (a client for training or evaluation, the pooled
  test set): finite float32 inputs. The bound holds for every read, so memory stays bounded whatever the
  file declares: HDF5 never decompresses more than a dataset's declared shape (a chunk's, for one chunk).

Each failure is one :class:`~fedrun.errors.DataError` naming the file, the client and the field, status 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import h5py
import numpy as np

from fedrun.data.validate import MAX_CLASSES
from fedrun.errors import DataError, NotUnderstood
from fedrun.hdf5.headers import DatasetHeader
from fedrun.hdf5.templates import HDF5Templates, Template

MAX_READ_BYTES = 1 << 31  # one dataset, one chunk, or one read of examples as float32 (2 GiB)


@dataclass(frozen=True)
class Members:
    """The names of the two datasets of every client group: the inputs (``data.federated_h5.feature``) and the
    class labels (``data.federated_h5.label``)."""

    feature: str
    label: str


@dataclass
class ClientIndex:
    """What start-up learns of one file: examples per client, the per-example shape, the largest label."""

    counts: np.ndarray  # [N] int64
    shape: tuple[int, ...]
    top: int
    through_hdf5: int = 0  # clients checked through HDF5's calls, not from their headers (none: from the cache)


def _where(path: str, cid: str, name: str | None = None) -> str:
    return f"{path}: client {cid!r}: " + (f"examples/{cid}/{name}: " if name else "")


# what h5py raises for an HDF5 error (a damaged or odd file): HDF5's own error stack, as one of these
HDF5_ERRORS = (KeyError, OSError, RuntimeError, ValueError, TypeError)


@contextmanager
def hdf5_errors(where: str) -> Iterator[None]:
    """Any error h5py raises inside, for a file HDF5 cannot read, as one :class:`DataError` line (``where``: the
    file and what was being read, ending in ": "); a :class:`DataError` passes as it is."""
    try:
        yield
    except DataError:
        raise
    except HDF5_ERRORS as exc:
        raise DataError(f"{where}HDF5 cannot read it ({type(exc).__name__}: {exc}); expected an undamaged HDF5 "
                        "file") from None


def _open_dataset(group: h5py.h5g.GroupID, path: str, cid: str, name: str, key: str) -> h5py.h5d.DatasetID:
    try:
        return h5py.h5d.open(group, name.encode())
    except (KeyError, OSError, RuntimeError, ValueError) as exc:
        raise DataError(f"{_where(path, cid)}no dataset examples/{cid}/{name} that opens ({exc}); expected "
                        f"data.federated_h5.{key}={name!r} in every client group, a dataset, not a link "
                        "loop") from None


def _open_client(examples: h5py.h5g.GroupID, path: str, cid: str, feature: str,
                 label: str) -> tuple[h5py.h5d.DatasetID, h5py.h5d.DatasetID]:
    """Client ``cid``'s feature and label datasets, opened by their paths from ``examples`` (no group object: one
    HDF5 open fewer per client); when one does not open, the group and then each dataset are opened alone, so
    that the line names what is missing."""
    try:
        return (h5py.h5d.open(examples, f"{cid}/{feature}".encode()),
                h5py.h5d.open(examples, f"{cid}/{label}".encode()))
    except (KeyError, OSError, RuntimeError, ValueError):
        pass
    try:
        group = h5py.h5g.open(examples, cid.encode())
    except (KeyError, OSError, RuntimeError, ValueError) as exc:
        raise DataError(f"{_where(path, cid)}no group examples/{cid} that opens ({exc}); expected every train "
                        "client's group in the test file, a group, not a link loop") from None
    return _open_dataset(group, path, cid, feature, "feature"), _open_dataset(group, path, cid, label, "label")


def _bounded(dset: h5py.h5d.DatasetID, size: int, shape: tuple[int, ...], where: str) -> None:
    """Refuse before reading: a declared size, or a chunk, over MAX_READ_BYTES (``size``: bytes per element as
    stored; counted as at least a float32's). Data stored contiguously in the file (an offset) has no chunks,
    so only other layouts' creation properties are asked for (a costly HDF5 call)."""
    itemsize = max(4, size)
    total = itemsize * math.prod(shape)
    chunk = None
    if dset.get_offset() is None:
        plist = dset.get_create_plist()
        if plist.get_layout() == h5py.h5d.CHUNKED:
            chunk = plist.get_chunk()
    chunk_bytes = 0 if chunk is None else itemsize * math.prod(chunk)
    if max(total, chunk_bytes) > MAX_READ_BYTES:
        what = f"shape {list(shape)}" if total >= chunk_bytes else f"chunks of shape {list(chunk)}"
        raise DataError(f"{where}{what} declares {max(total, chunk_bytes) / 2**30:.3g} GiB; expected at most "
                        f"{MAX_READ_BYTES / 2**30:g} GiB per dataset and per chunk (read before anything else)")


_LABEL_BLOCK = 1 << 20  # labels held at once for the range check (int64: 8 MiB), whatever the clients' sizes


class _LabelRanges:
    """The range check of every client's labels, ``0 <= label < MAX_CLASSES``, done on blocks of clients at once:
    per client, ``min`` and ``max`` of its segment of the block (``np.minimum.reduceat``), not two numpy calls per
    client (which cost as much as HDF5's reads of tiny clients). Holds at most about :data:`_LABEL_BLOCK` labels."""

    def __init__(self, path: str, label: str) -> None:
        self.path, self.label, self.top = path, label, 0
        self.labels: list[np.ndarray] = []
        self.sizes: list[np.ndarray] = []
        self.cids: list[str] = []
        self.held = 0

    def add(self, cids: list[str], labels: np.ndarray, sizes: np.ndarray) -> None:
        """The labels of clients ``cids``, one after the other (``sizes[i]`` of client i, each at least one)."""
        self.labels.append(labels.reshape(-1))
        self.sizes.append(sizes)
        self.cids.extend(cids)
        self.held += labels.size
        if self.held >= _LABEL_BLOCK:
            self.check()

    def check(self) -> None:
        """Check the labels held, then forget them."""
        if not self.cids:
            return
        block, sizes = np.concatenate(self.labels), np.concatenate(self.sizes)
        starts = np.cumsum(sizes) - sizes
        low, high = np.minimum.reduceat(block, starts), np.maximum.reduceat(block, starts)
        bad = np.flatnonzero((low < 0) | (high >= MAX_CLASSES))
        if len(bad):
            i = int(bad[0])
            value = int(low[i]) if low[i] < 0 else int(high[i])
            at = int(np.argmax(block[starts[i]:starts[i] + sizes[i]] == value))
            raise DataError(f"{_where(self.path, self.cids[i], self.label)}label {value} at index {at}; expected "
                            f"class labels in [0, {MAX_CLASSES})")
        self.top = max(self.top, int(high.max()))
        self.labels, self.sizes, self.cids, self.held = [], [], [], 0


def _by_hdf5(examples: h5py.h5g.GroupID, path: str, cid: str, feature: str, label: str,
             shape: tuple[int, ...] | None) -> tuple[tuple[int, ...], np.ndarray]:
    """Client ``cid`` checked through HDF5's calls (module docstring): its feature's shape and its labels as int64;
    ``shape``: the per-example shape it must have (None: its own)."""
    with hdf5_errors(_where(path, cid)):
        return _by_hdf5_checked(examples, path, cid, feature, label, shape)


def _by_hdf5_checked(examples: h5py.h5g.GroupID, path: str, cid: str, feature: str, label: str,
                     shape: tuple[int, ...] | None) -> tuple[tuple[int, ...], np.ndarray]:
    """:func:`_by_hdf5` outside its guard."""
    x, y = _open_client(examples, path, cid, feature, label)
    x_shape, y_shape = x.shape, y.shape
    x_type, y_type = x.get_type(), y.get_type()
    x_class, y_class = x_type.get_class(), y_type.get_class()
    if x_class not in (h5py.h5t.INTEGER, h5py.h5t.FLOAT) or len(x_shape) < 2:
        raise DataError(f"{_where(path, cid, feature)}dtype {x.dtype}, shape {list(x_shape)}; expected [n, ...] "
                        "real numbers (n examples of one shape)")
    if shape is None:
        shape = x_shape[1:]
    if x_shape[1:] != shape:
        raise DataError(f"{_where(path, cid, feature)}examples of shape {list(x_shape[1:])}, but the train "
                        f"file's first client's are {list(shape)}; expected one shape in every client of both "
                        "files")
    _bounded(x, x_type.get_size(), x_shape, _where(path, cid, feature))
    n = x_shape[0]
    if y_class != h5py.h5t.INTEGER or y_shape not in ((n,), (n, 1)):
        raise DataError(f"{_where(path, cid, label)}dtype {y.dtype}, shape {list(y_shape)}; expected integer "
                        f"class labels of shape [{n}] (one per example of {feature})")
    if n == 0:
        raise DataError(f"{_where(path, cid, feature)}no examples; expected at least one")
    _bounded(y, y_type.get_size(), y_shape, _where(path, cid, label))
    labels = np.empty(y_shape, dtype=np.int64)
    y.read(h5py.h5s.ALL, h5py.h5s.ALL, labels)
    return x_shape, labels


@dataclass
class ClientLinks:
    """The ``examples`` group of a file, enumerated once: each client id's group, as the address of its object
    header (None: not a hard link), and the file's headers (fedrun/hdf5/headers.py) to read them."""

    headers: HDF5Templates
    groups: dict[str, int | None]

    def close(self) -> None:
        self.headers.close()


def client_links(f: h5py.File) -> ClientLinks | None:
    """The clients of file ``f`` read from its bytes (a symbol-table or compact group) or, for a group in dense
    storage (a fractal heap, as ``libver="latest"`` keeps more than 8 links), HDF5's one iteration over its
    links; None when the file is not one :class:`~fedrun.hdf5.headers.HDF5Headers` understands."""
    try:
        headers = HDF5Templates(f.filename)
    except NotUnderstood:
        return None
    try:
        link = f.id.links.get_info(b"examples")  # the root's link alone: HDF5's object info of the group walks it
        if link.type != h5py.h5l.TYPE_HARD:
            raise NotUnderstood("examples is not a hard link")
        groups = headers.links(link.u)
        if groups is None:
            listed: dict[bytes, int | None] = {}

            def visit(name: bytes, info: h5py.h5l.LinkInfo) -> None:  # raising in here is h5py's SystemError
                listed[name] = info.u if info.type == h5py.h5l.TYPE_HARD else None

            group = f["examples"].id  # held: a LinkProxy does not keep the group open
            group.links.iterate(visit, info=True)
            groups = {name.decode("utf-8"): address for name, address in listed.items()}
        return ClientLinks(headers, groups)
    except DataError:  # damage the headers found: not handed to HDF5
        headers.close()
        raise
    except (NotUnderstood, *HDF5_ERRORS):  # UnicodeDecodeError is a ValueError
        headers.close()
        return None


def client_ids(f: h5py.File) -> tuple[list[str], ClientLinks | None]:
    """The sorted client ids of file ``f`` and, when understood, its :class:`ClientLinks` (the caller closes);
    else HDF5's listing, whose names must be text, each once (h5py gives a name that is not UTF-8 as bytes)."""
    links = client_links(f)
    if links is not None:
        return sorted(links.groups), links
    with hdf5_errors(f"{f.filename}: the client groups in examples/: "):
        names = list(f["examples"].keys())
    odd = next((name for name in names if not isinstance(name, str)), None)
    if odd is not None or len(set(names)) != len(names):
        what = f"a client name {odd!r} not in UTF-8" if odd is not None else "a client name listed twice"
        raise DataError(f"{f.filename}: {what} in examples/; expected each client's group once, named in text")
    return sorted(names), None


_BLOCK = 4096  # clients indexed at once: templates matched, checksums checked, labels gathered


def _from_headers(links: ClientLinks, cids: list[str], feature: str,
                  label: str) -> list[tuple[DatasetHeader, DatasetHeader] | None]:
    """Each client's feature and label datasets as their headers declare them, None where anything is not
    understood or a checksum does not match (that client is then checked through HDF5)."""
    h, found, spans = links.headers, [], []
    for cid in cids:
        first = len(h.spans)
        try:
            address = links.groups.get(cid)
            members = None if address is None else h.links(address)
            x, y = (None, None) if members is None else (members.get(feature), members.get(label))
            found.append(None if x is None or y is None else (h.dataset(x), h.dataset(y)))
        except NotUnderstood:
            found.append(None)
        spans.append((first, len(h.spans)))
    ok = h.verify()
    return [pair if pair is not None and ok[a:b].all() else None for pair, (a, b) in zip(found, spans, strict=True)]


def _passes(x: DatasetHeader, y: DatasetHeader, shape: tuple[int, ...] | None) -> bool:
    """Whether headers ``x`` (feature) and ``y`` (label) pass every check of :func:`_by_hdf5` (where one does not,
    HDF5's path gives the line). Labels of uint64 go through HDF5, whose conversion to int64 saturates."""
    n = x.shape[0] if x.shape else 0
    return (len(x.shape) >= 2 and x.shape[1:] == (shape if shape is not None else x.shape[1:]) and n >= 1
            and y.dtype.kind in "iu" and y.dtype.str[1:] != "u8" and y.shape in ((n,), (n, 1))
            and all(max(4, d.dtype.itemsize) * math.prod(d.shape) <= MAX_READ_BYTES for d in (x, y)))


_TEMPLATES = 4  # templates tried per block and step before the clients left are parsed one by one


def _by_templates(build: Callable[[int], Template], apply: Callable[..., tuple[np.ndarray, ...]],
                  addresses: np.ndarray, rows: np.ndarray) -> Iterator[tuple[Template, np.ndarray, list[np.ndarray]]]:
    """Apply templates (fedrun/hdf5/templates.py) to the objects at ``addresses[rows]``, each built from the
    first object no template matched yet: yields (template, rows matched, ``apply``'s values for them)."""
    for _ in range(_TEMPLATES):
        if not len(rows):
            return
        try:
            template = build(int(addresses[rows[0]]))
        except NotUnderstood:
            rows = rows[1:]
            continue
        ok, *values = apply(template, addresses[rows])
        yield template, rows[ok], [v[ok] for v in values]
        rows = rows[~ok] if ok[0] else rows[~ok][1:]


def _templated(links: ClientLinks, cids: list[str], members: Members, shape: tuple[int, ...],
               counts: np.ndarray, ranges: _LabelRanges) -> np.ndarray:
    """The clients ``cids`` whose group and datasets match a template and pass every check of :func:`_passes`
    (vectorised), their counts written into ``counts`` and labels given to ``ranges``: which they are."""
    h, feature, label = links.headers, members.feature, members.label
    found = [links.groups.get(cid) for cid in cids]  # None: no hard link of that name
    known = np.array([i for i, address in enumerate(found) if address is not None], dtype=np.int64)
    groups = np.array([0 if address is None else address for address in found], dtype=np.uint64)
    members = np.zeros((len(cids), 2), dtype=np.uint64)
    grouped = np.zeros(len(cids), dtype=bool)
    for template, rows, (fields,) in _by_templates(lambda a: h.group_template(a, (feature, label)), h.match, groups,
                                                   known):
        members[rows] = fields[:, list(template.outputs)]
        grouped[rows] = True
    n = np.zeros(len(cids), dtype=np.int64)
    for template, rows, (shapes, _) in _by_templates(h.dataset_template, h.datasets, members[:, 0],
                                                     np.flatnonzero(grouped)):
        x = template.dataset
        if len(x.shape) == len(shape) + 1 >= 2:
            per_example = max(4, x.dtype.itemsize) * float(math.prod(shape))
            fits = (shapes[:, 1:] == np.array(shape)).all(axis=1) & (shapes[:, 0] >= 1) & \
                (per_example * shapes[:, 0] <= MAX_READ_BYTES)
            n[rows[fits]] = shapes[fits, 0]
    done = np.zeros(len(cids), dtype=bool)
    for template, rows, (shapes, data) in _by_templates(h.dataset_template, h.datasets, members[:, 1],
                                                        np.flatnonzero(n)):
        y = template.dataset
        if y.dtype.kind not in "iu" or y.dtype.str[1:] == "u8" or len(y.shape) not in (1, 2):
            continue
        fits = (shapes[:, 0] == n[rows]) & ((shapes[:, 1] == 1) if len(y.shape) == 2 else True)
        fits &= max(4, y.dtype.itemsize) * shapes[:, 0].astype(np.float64) <= MAX_READ_BYTES
        rows, sizes, where = rows[fits], shapes[fits, 0], data[fits]
        for part in _parts(sizes, _LABEL_BLOCK):  # labels held at once: at most a block's, or one client's
            ranges.add([cids[i] for i in rows[part]], h.gather(y.dtype, where[part], sizes[part]), sizes[part])
        counts[rows] = sizes
        done[rows] = True
    return done


def _parts(sizes: np.ndarray, limit: int) -> Iterator[slice]:
    """Consecutive slices of ``sizes`` that sum to at most ``limit`` each, or hold one entry larger than it."""
    ends, start = np.cumsum(sizes), 0
    while start < len(sizes):
        before = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, before + limit, side="right")))
        yield slice(start, stop)
        start = stop


def index_clients(f: h5py.File, path: str, ids: list[str], members: Members, shape: tuple[int, ...] | None = None,
                  links: ClientLinks | None = None) -> ClientIndex:
    """Check every client's metadata and labels in file ``f`` (module docstring); ``shape``: the per-example
    shape every client must have (the train file's, for the test file; None: the first client's); ``links``: the
    file's clients when enumerated already (else enumerated here)."""
    feature, label = members.feature, members.label
    own = links is None
    if own:
        links = client_links(f)
    fast = links is not None and "/" not in feature + label  # names of members of the client's group, not paths
    examples = f["examples"].id
    counts = np.zeros(len(ids), dtype=np.int64)
    ranges = _LabelRanges(path, label)
    slow = start = 0
    try:
        while start < len(ids):
            block = ids[start:start + (_BLOCK if shape is not None else 1)]  # the first client sets the shape
            done = np.zeros(len(block), dtype=bool)
            if fast and shape is not None:
                done = _templated(links, block, members, shape, counts[start:start + len(block)], ranges)
            rest = [cid for cid, hit in zip(block, done, strict=True) if not hit]
            found = _from_headers(links, rest, feature, label) if fast else [None] * len(rest)
            for i, cid, pair in zip(start + np.flatnonzero(~done), rest, found, strict=True):
                if pair is not None and _passes(*pair, shape):
                    x_shape, labels = pair[0].shape, links.headers.read(pair[1]).astype(np.int64)
                else:
                    x_shape, labels = _by_hdf5(examples, path, cid, feature, label, shape)
                    slow += 1
                if shape is None:
                    shape = x_shape[1:]
                ranges.add([cid], labels, np.array([x_shape[0]]))
                counts[i] = x_shape[0]
            start += len(block)
    finally:
        if own and links is not None:
            links.close()
    ranges.check()
    return ClientIndex(counts, tuple(shape or ()), ranges.top, slow)


def read_bound(counts: np.ndarray, shape: tuple[int, ...], path: str, what: str) -> None:
    """Refuse a read of ``counts.sum()`` examples of ``shape`` over MAX_READ_BYTES as float32 (the pooled test set
    of many clients, before anything is read)."""
    total = 4 * float(counts.sum()) * float(np.prod(shape, dtype=np.float64))
    if total > MAX_READ_BYTES:
        raise DataError(f"{path}: {what} would read {total / 2**30:.3g} GiB as float32; expected at most "
                        f"{MAX_READ_BYTES / 2**30:g} GiB (lower data.federated_h5.test_clients)")


def check_examples(x: np.ndarray, path: str, cid: str, feature: str) -> None:
    """One client's inputs as read (float32): every value finite, else one line naming the first one."""
    finite = np.isfinite(x)
    if not finite.all():
        index = tuple(int(i) for i in np.unravel_index(int(np.argmin(finite)), x.shape))
        raise DataError(f"{_where(path, cid, feature)}element {list(index)} is {x[index]} (as float32); expected "
                        "finite numbers")
