"""One parse of an HDF5 object applied to many objects at once with numpy: a :class:`Template`.

Why: parsing each of 342,477 clients' three headers in Python (fedrun/hdf5/headers.py) costs about 0.1 ms per
client, a minute for two files. But h5py writes every client's group and datasets alike: the same bytes but for a
few values (the number of examples, the data's address, the links' addresses, checksums). So one client is parsed
in full, recording which bytes it read as values (:class:`~fedrun.hdf5.headers.Record` fields) and which may
differ without changing the parse (times, checksums); then the bytes of a block of other clients' objects are
gathered into one [clients, bytes] array and compared with the template's (``(rows == fixed) | free``): a row that
matches parses exactly as the template did, with its own values, which are then checked with numpy (every address
inside the file, a data size equal to ``itemsize * prod(shape)``, every checksum). Rows that do not match are
parsed one by one, or go to HDF5.

A group's template follows the records one parse visits: for link messages (``libver="latest"``), its header;
for a symbol table (h5py's default), its header, its B-tree's one node, the node's "SNOD", its local heap and the
heap's names.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from fedrun.errors import DataError, NotUnderstood
from fedrun.hdf5.checksum import checksums_match
from fedrun.hdf5.groups import HDF5Groups
from fedrun.hdf5.headers import UNDEFINED, DatasetHeader, Record, _first

_U16, _U64 = struct.Struct("<H"), struct.Struct("<Q")
MAX_RECORD_BYTES = 4096  # a template's records (headers, a group's heap): a block's bytes held at once stay small


@dataclass
class Template:
    """A parse done once, applied to many objects at once (:meth:`HDF5Templates.match`): an object matches when
    each record's bytes equal the template's except the free ones, so it parses the same with other values.
    ``outputs``: the numbers of the fields the caller wants (a group's members); ``dataset``: for a dataset's
    template, its parse (dtype and rank; the shape, data address and size are fields), and ``limits``: whether
    its maximum dimensions are fields too (after the dimensions)."""

    records: list[Record]
    fixed: list[np.ndarray]
    outputs: tuple[int, ...] = ()
    dataset: DatasetHeader | None = None
    limits: bool = False


class HDF5Templates(HDF5Groups):
    """:class:`~fedrun.hdf5.groups.HDF5Groups` that also apply a parse to many objects at once."""

    def dataset_template(self, address: int) -> Template:
        """The dataset at ``address`` as a :class:`Template` (fields: its dimensions, then for contiguous storage
        the data's address and size)."""
        try:
            dataset, record, limits = self._dataset(address)
        except DataError:
            raise
        except (struct.error, IndexError, ValueError, TypeError) as exc:
            raise NotUnderstood(f"dataset at {address} ({exc})") from None
        if record is None:
            raise NotUnderstood(f"the header at {address} has continuation chunks")
        return self._template([record], (), dataset, limits)

    def group_template(self, address: int, names: tuple[str, ...]) -> Template:
        """The group at ``address`` as a :class:`Template` whose outputs are the header addresses of its hard links
        ``names``: link messages in its header, or a symbol table of one B-tree node, one "SNOD" and its heap."""
        try:
            links = self._links(address)
            if links is None or any(links.get(name) is None for name in names):
                raise NotUnderstood(f"not all of {names} are hard links of the group at {address}")
            messages, header = self._messages(address)
            if header is None:
                raise NotUnderstood(f"the header at {address} has continuation chunks")
            table = _first(messages, 0x0011)
            if _first(messages, 0x0002) is not None:  # link messages (the link info decides): each address a field
                fields = {}
                for kind, _, data, length in messages:
                    if kind == 0x0006:
                        name, _, at = self._link_at(data, length)
                        if at is not None:
                            fields[name] = len(header.fields)
                            header.field(at)
                return self._template([header], tuple(fields[name] for name in names))
            if table is None:
                raise NotUnderstood(f"no group at {address}")
            return self._table_template(header, table[0], links, names)
        except DataError:
            raise
        except (struct.error, IndexError, ValueError) as exc:
            raise NotUnderstood(f"group at {address} ({exc})") from None

    def _table_template(self, header: Record, table: int, links: dict[str, int | None],
                        names: tuple[str, ...]) -> Template:
        """Records of a symbol-table group: header (fields 0, 1: B-tree, heap), B-tree node of one child (field 2:
        the "SNOD"), the SNOD (fields 3...: each entry's header address), the heap (its data's address), its data."""
        mm = self._mm
        header.field(table)
        header.field(table + 8)
        btree, heap = _U64.unpack_from(mm, table)[0], _U64.unpack_from(mm, table + 8)[0]
        at = self._at(btree, 24)
        if mm[at + 5] != 0 or _U16.unpack_from(mm, at + 6)[0] != 1:
            raise NotUnderstood("a group B-tree of more than one node")
        node = Record(at, 48, extent=24 + 16 * (2 * self.node_k) + 8)  # HDF5 reads the whole node
        node.source = 0
        node.field(at + 32)
        snod = self._at(_U64.unpack_from(mm, at + 32)[0], 8)
        count = _U16.unpack_from(mm, snod + 6)[0]
        symbols = Record(snod, 8 + 40 * count, extent=8 + 40 * (2 * self.leaf_k))
        symbols.source = 2
        for entry in range(count):
            symbols.field(snod + 8 + 40 * entry + 8)
        at = self._at(heap, 32)
        size = _U64.unpack_from(mm, at + 8)[0]
        local = Record(at, 32)
        local.source = 1
        local.field(at + 24)
        data = Record(self._at(_U64.unpack_from(mm, at + 24)[0], size), size)
        data.source = 3 + count
        targets = [_U64.unpack_from(mm, snod + 8 + 40 * entry + 8)[0] for entry in range(count)]
        outputs = tuple(3 + targets.index(links[name]) for name in names)
        return self._template([header, node, symbols, local, data], outputs)

    def _template(self, records: list[Record], outputs: tuple[int, ...], dataset: DatasetHeader | None = None,
                  limits: bool = False) -> Template:
        if any(r.length > MAX_RECORD_BYTES for r in records):  # matched [clients, bytes] at once: kept small
            raise NotUnderstood(f"a record of more than {MAX_RECORD_BYTES} bytes")
        return Template(records, [self.bytes[r.start:r.start + r.length].copy() for r in records], outputs, dataset,
                        limits)

    def match(self, template: Template, addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which objects at ``addresses`` (uint64, relative to the base) parse as ``template`` does, and their fields
        ([N, fields] uint64; rows that do not match hold anything). Every record's bytes are checked inside the
        file before they are compared; version 2 headers' checksums are checked too."""
        ok = np.ones(len(addresses), dtype=bool)
        fields: list[np.ndarray] = []
        limit = self.size - self.base
        for record, fixed in zip(template.records, template.fixed, strict=True):
            at = addresses if record.source < 0 else fields[record.source]
            if record.extent > limit:
                return np.zeros(len(addresses), dtype=bool), np.zeros((len(addresses), 0), dtype=np.uint64)
            ok &= at <= np.uint64(limit - record.extent)
            start = np.where(ok, at, 0).astype(np.int64) + self.base
            rows = self.bytes[start[:, None] + np.arange(record.length)]
            free = np.zeros(record.length, dtype=bool)
            for offset, length in record.freed:
                free[offset:offset + length] = True
            ok &= ((rows == fixed) | free).all(axis=1)
            if record.checksum:
                ok &= checksums_match(rows)
            fields.extend(np.ascontiguousarray(rows[:, at:at + 8]).view("<u8")[:, 0] for at in record.fields)
        empty = np.zeros((len(addresses), 0), dtype=np.uint64)
        return ok, (np.stack(fields, axis=1) if fields else empty)

    def datasets(self, template: Template, addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The datasets at ``addresses`` that parse as dataset ``template``: which do, their shapes ([N, rank] int64)
        and their data's file offsets (compact or contiguous; each ``dtype.itemsize * prod(shape)`` bytes, inside
        the file)."""
        dataset = template.dataset
        ok, fields = self.match(template, addresses)
        rank = len(dataset.shape)
        dims = fields[:, :rank]
        ok &= (dims < np.uint64(1 << 40)).all(axis=1)
        if template.limits:  # maximum dimensions: each at least its dimension, or unlimited (as HDF5 checks)
            most = fields[:, rank:2 * rank]
            ok &= ((most == np.uint64(UNDEFINED)) | (most >= dims)).all(axis=1)
            fields = np.concatenate([fields[:, :rank], fields[:, 2 * rank:]], axis=1)
        shapes = np.where(ok[:, None], dims, 0).astype(np.int64)
        nbytes = dataset.dtype.itemsize * np.prod(shapes.astype(np.float64), axis=1)  # exact where it matters
        if fields.shape[1] > rank:  # contiguous: address, size
            where, size = fields[:, rank], fields[:, rank + 1]
            limit = np.uint64(self.size - self.base)
            ok &= (where <= limit) & (size <= limit - np.minimum(where, limit)) & (size.astype(np.float64) == nbytes)
            ok &= size > 0  # HDF5 refuses contiguous storage of no bytes at a defined address
            data = np.where(ok, where, 0).astype(np.int64) + self.base
        else:  # compact: the data where the template's is in its header
            ok &= nbytes == dataset.nbytes
            data = addresses.astype(np.int64) + self.base + (dataset.data - template.records[0].start)
        return ok, shapes, data

    def gather(self, dtype: np.dtype, data: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """The values of many datasets of one ``dtype``, ``counts[i]`` elements at file offset ``data[i]`` each
        (checked inside the file by :meth:`datasets`), one after the other as int64. The caller bounds the total
        (fedrun.data.federated_h5_index._parts): the byte index costs 8 bytes per byte gathered."""
        if len(counts) == 1:  # one client, however large: a view of the mapped file, no index array
            return self.bytes[int(data[0]):int(data[0]) + int(counts[0]) * dtype.itemsize].view(dtype).astype(np.int64)
        sizes = counts * dtype.itemsize
        total = int(sizes.sum())
        starts = np.repeat(data - np.cumsum(sizes) + sizes, sizes)
        raw = self.bytes[starts + np.arange(total)]
        return raw.view(dtype).astype(np.int64)
