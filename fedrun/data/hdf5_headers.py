"""What an HDF5 file declares about its groups and datasets, read straight from the file's bytes (an ``mmap``).

Why: HDF5's own open of a dataset (``H5Dopen``: object header, caches, property lists) costs about 0.15 ms, so
checking the two datasets of each of 342,477 clients through HDF5 takes minutes (fedrun/data/federated_h5_index.py).
The same declarations parsed from the bytes with ``struct.unpack_from`` cost a few microseconds. This reader
follows the HDF5 File Format Specification (version 3.0) for the layouts h5py writes, with default settings
(superblock 0, version 1 object headers, groups as symbol tables: a version 1 B-tree of "SNOD" nodes and a
local "HEAP" of names, as TensorFlow Federated's files are) and with ``libver="latest"`` (superblock 2 or 3,
version 2 "OHDR"/"OCHK" object headers, a group's links as link messages):

* the superblock (8-byte offsets and lengths only), the root group's object header;
* object headers, version 1 and 2, with their continuation chunks (message 0x0010);
* a group's hard links: a symbol table (0x0011, walked through its B-tree) or link messages (0x0006) with the
  link info message (0x0002). A group whose links are in "dense" storage (a fractal heap) is not parsed:
  :meth:`HDF5Headers.links` says so with ``None`` and the caller asks HDF5 for that group's links;
* a dataset's dataspace (0x0001), datatype (0x0003: fixed-point and floating-point classes), data layout
  (0x0008 versions 3 and 4: compact, or contiguous with the data's address and size).

Anything else is :class:`NotUnderstood`: chunked, filtered, external or virtual storage, a data address never
written, soft or external links, other datatype classes (strings, compounds, ...), shared messages, message
types or versions not listed above, other offset sizes, and every inconsistency (an address or a length past the
end of the file, a bad signature, a loop of continuation chunks or B-tree nodes). A corrupted file is thus never
read out of bounds (every address is checked against the file's size) and never raises anything else.
Version 2 headers carry a checksum (Bob Jenkins' lookup3, as ``H5_checksum_lookup3``); HDF5 refuses a header
whose checksum does not match, so must a reader of the same bytes: the spans parsed are collected in
:attr:`HDF5Headers.spans` and checked many at a time with numpy (fedrun/data/hdf5_checksum.py), since the hash in
plain Python costs more than the parse. Each parse also records which bytes it read as values, so that
fedrun/data/hdf5_templates.py can apply it to many objects at once.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass

import numpy as np

from fedrun.data.hdf5_checksum import checksums_match
from fedrun.errors import NotUnderstood

SIGNATURE = b"\x89HDF\r\n\x1a\n"
UNDEFINED = (1 << 64) - 1
_U8, _U16, _U32, _U64 = struct.Struct("<B"), struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")
_V1_MESSAGE = struct.Struct("<HHB")  # type, size, flags (then 3 reserved bytes)
_V2_MESSAGE = struct.Struct("<BHB")  # type, size, flags
_ENTRY = struct.Struct("<QQI")  # symbol table entry: name's offset in the heap, object header address, cache type
# message types a dataset's or group's header may hold that change nothing read here
_IGNORED = {0x0000, 0x0004, 0x0005, 0x000A, 0x000C, 0x000D, 0x000E, 0x0012, 0x0015, 0x0016}
_READ = {0x0001, 0x0002, 0x0003, 0x0006, 0x0008, 0x000B, 0x0010, 0x0011}
_MAX_CHUNKS = 64  # object header chunks followed per header
_VERIFY_BYTES = 1 << 24  # bytes of spans hashed at once (an odd file may hold large header chunks)


@dataclass(frozen=True)
class DatasetHeader:
    """A dataset as its header declares it: ``shape``, the element type as stored (``dtype``, with its byte
    order; kind ``i``, ``u`` or ``f``) and where its raw data lies in the file: ``data`` (an offset in the file)
    and ``nbytes``, in the header itself (compact storage) or in one contiguous block."""

    shape: tuple[int, ...]
    dtype: np.dtype
    data: int
    nbytes: int


class Record:
    """One stretch of bytes of a parse (``length`` bytes at file offset ``start``), as a step of a template
    (fedrun/data/hdf5_templates.py): the bytes ``free`` may differ from object to object (values read, times, the
    checksum); ``fields`` are the offsets of the 8-byte values read (an address, a size, a dimension), numbered in
    order across a template's records."""

    def __init__(self, start: int, length: int, checksum: bool = False) -> None:
        self.start, self.length, self.checksum = start, length, checksum
        self.freed: list[tuple[int, int]] = [(length - 4, 4)] if checksum else []
        self.fields: list[int] = []
        self.source = -1  # the field holding this record's address (-1: the address the template is applied to)

    def free(self, at: int, length: int) -> None:
        self.freed.append((at - self.start, length))

    def field(self, at: int) -> int:
        """Read the 8 bytes at file offset ``at`` as a value (they may differ); their offset in the record."""
        self.free(at, 8)
        self.fields.append(at - self.start)
        return at - self.start


class HDF5Headers:
    """One HDF5 file, mapped read-only; :class:`NotUnderstood` when its superblock is not one this reader knows.

    ``spans``: the (start, length) of every version 2 header chunk parsed since the last :meth:`verify`; a
    chunk's checksum is the 4 bytes after it."""

    def __init__(self, path: str) -> None:
        try:
            with open(path, "rb") as fh:
                self._mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise NotUnderstood(str(exc)) from None
        self.size = len(self._mm)
        self.bytes = np.frombuffer(self._mm, dtype=np.uint8)
        self.spans: list[tuple[int, int]] = []
        self._types: dict[bytes, np.dtype] = {}
        try:
            self.base, self.root = self._superblock()
            if not self.verify().all():
                raise NotUnderstood("superblock checksum")
        except (NotUnderstood, struct.error, IndexError, ValueError) as exc:
            self.close()
            raise NotUnderstood(f"superblock ({exc})") from None

    def close(self) -> None:
        """Unmap the file (arrays still viewing it keep it mapped until they go)."""
        del self.bytes
        try:
            self._mm.close()
        except BufferError:
            pass

    # -- bounds -------------------------------------------------------------------------------------------------
    def _at(self, address: int, length: int) -> int:
        """The file offset of ``length`` bytes at ``address`` (relative to the base), checked inside the file."""
        if address == UNDEFINED or length < 0 or self.base + address + length > self.size:
            raise NotUnderstood(f"address {address} + {length} past the end of the file ({self.size} bytes)")
        return self.base + address

    def _superblock(self) -> tuple[int, int]:
        mm, at = self._mm, 0
        while mm[at:at + 8] != SIGNATURE:
            at = 512 if at == 0 else 2 * at
            if at + 8 > self.size:
                raise NotUnderstood("no HDF5 signature")
        version = mm[at + 8]
        if version in (0, 1):
            if (mm[at + 13], mm[at + 14]) != (8, 8):
                raise NotUnderstood("offsets or lengths not of 8 bytes")
            fields = at + (24 if version == 0 else 28)
            base = _U64.unpack_from(mm, fields)[0]
            root = _U64.unpack_from(mm, fields + 40)[0]  # the root's symbol table entry: name offset, header
        elif version in (2, 3):
            if (mm[at + 9], mm[at + 10]) != (8, 8):
                raise NotUnderstood("offsets or lengths not of 8 bytes")
            if at + 48 > self.size:
                raise NotUnderstood("superblock cut short")
            base, root = _U64.unpack_from(mm, at + 12)[0], _U64.unpack_from(mm, at + 36)[0]
            self.spans.append((at, 44))
        else:
            raise NotUnderstood(f"superblock version {version}")
        if base != at:
            raise NotUnderstood(f"base address {base}, superblock at {at}")
        return base, root

    # -- checksums ----------------------------------------------------------------------------------------------
    def verify(self) -> np.ndarray:
        """Whether each span of :attr:`spans` matches its checksum (then ``spans`` is emptied): hashed with numpy,
        all spans of one length at once."""
        spans, self.spans = self.spans, []
        ok = np.ones(len(spans), dtype=bool)
        if not spans:
            return ok
        table = np.array(spans, dtype=np.int64)
        for length in np.unique(table[:, 1]):
            same = np.flatnonzero(table[:, 1] == length)
            step = max(1, _VERIFY_BYTES // (int(length) + 4))  # [spans, bytes] held at once
            for rows in (same[i:i + step] for i in range(0, len(same), step)):
                ok[rows] = checksums_match(self.bytes[table[rows, 0][:, None] + np.arange(int(length) + 4)])
        return ok

    # -- object headers -----------------------------------------------------------------------------------------
    def messages(self, address: int) -> list[tuple[int, int, int, int]]:
        """The messages of the object header at ``address``: (type, flags, file offset of the data, size),
        continuation chunks followed; version 2 chunks added to :attr:`spans`."""
        try:
            return self._messages(address)[0]
        except (struct.error, IndexError) as exc:
            raise NotUnderstood(f"object header at {address} ({exc})") from None

    def _messages(self, address: int) -> tuple[list[tuple[int, int, int, int]], Record | None]:
        """:meth:`messages`, and the header as a record of a template (None: it has continuation
        chunks, elsewhere in the file)."""
        mm = self._mm
        at = self._at(address, 16)
        out: list[tuple[int, int, int, int]] = []
        if mm[at] == 1:  # version 1: version, reserved, messages (2), references (4), header size (4), padding
            v2, tracked, size = False, 0, _U32.unpack_from(mm, at + 8)[0]
            chunks = [(at + 16, self._at(address + 16, size) + size)]
            record = Record(at, 16 + size)
        elif mm[at:at + 5] == b"OHDR\x02":
            v2, flags = True, mm[at + 5]
            start = at + 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
            width = 1 << (flags & 3)
            size = int.from_bytes(mm[start:start + width], "little")
            begin = start + width
            end = self._at(begin - self.base, size + 4) + size
            self.spans.append((at, end - at))
            chunks = [(begin, end)]
            tracked = 2 if flags & 0x04 else 0
            record = Record(at, end + 4 - at, checksum=True)
            if flags & 0x20:  # access, modification, change and birth times
                record.free(at + 6, 16)
        else:
            raise NotUnderstood(f"no object header at {address}")
        seen = set()
        while chunks:
            begin, end = chunks.pop()
            step = (4 + tracked) if v2 else 8
            pos = begin
            while pos + step <= end:
                if v2:
                    kind, length, mflags = _V2_MESSAGE.unpack_from(mm, pos)
                else:
                    kind, length, mflags = _V1_MESSAGE.unpack_from(mm, pos)
                data = pos + step
                pos = data + length
                if pos > end:
                    raise NotUnderstood(f"message of {length} bytes past its header chunk at {address}")
                if kind in (0x000E, 0x0012):  # modification times
                    record.free(data, length)
                if kind == 0x0010:  # continuation: address, length
                    record = None
                    where, more = _U64.unpack_from(mm, data)[0], _U64.unpack_from(mm, data + 8)[0]
                    if where in seen or len(seen) >= _MAX_CHUNKS:
                        raise NotUnderstood(f"continuation loop in the header at {address}")
                    seen.add(where)
                    first = self._at(where, more)
                    if v2:
                        if mm[first:first + 4] != b"OCHK" or more < 8:
                            raise NotUnderstood(f"no continuation chunk at {where}")
                        self.spans.append((first, more - 4))
                        chunks.append((first + 4, first + more - 4))
                    else:
                        chunks.append((first, first + more))
                elif kind in _READ:
                    if mflags & 0x02:
                        raise NotUnderstood(f"shared message {kind:#06x} in the header at {address}")
                    out.append((kind, mflags, data, length))
                elif kind not in _IGNORED:
                    raise NotUnderstood(f"message {kind:#06x} in the header at {address}")
        return out, record

    # -- groups -------------------------------------------------------------------------------------------------
    def links(self, address: int) -> dict[str, int | None] | None:
        """The links of the group whose object header is at ``address``: name -> the linked object's header
        address (None: not a hard link). None when the links are in dense storage (not parsed here)."""
        try:
            return self._links(address)
        except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
            raise NotUnderstood(f"group at {address} ({exc})") from None

    def _links(self, address: int) -> dict[str, int | None] | None:
        mm = self._mm
        out: dict[str, int | None] = {}
        group = False
        for kind, _, data, length in self.messages(address):
            if kind == 0x0011:  # symbol table: v1 B-tree, local heap
                btree, heap = _U64.unpack_from(mm, data)[0], _U64.unpack_from(mm, data + 8)[0]
                out.update(self._symbol_table(btree, heap))
                group = True
            elif kind == 0x0002:  # link info: version 0, flags, [max creation index], fractal heap, name index
                if mm[data] != 0:
                    raise NotUnderstood("link info version")
                if _U64.unpack_from(mm, data + (10 if mm[data + 1] & 1 else 2))[0] != UNDEFINED:
                    return None
                group = True
            elif kind == 0x0006:
                name, target = self._link(data, length)
                out[name] = target
            elif kind in (0x0001, 0x0003, 0x0008, 0x000B):
                raise NotUnderstood(f"a dataset at {address}, not a group")
        if not group:
            raise NotUnderstood(f"no group at {address}")
        return out

    def _link(self, data: int, length: int) -> tuple[str, int | None]:
        name, target, _ = self._link_at(data, length)
        return name, target

    def _link_at(self, data: int, length: int) -> tuple[str, int | None, int | None]:
        """A link message (version 1, flags, [type], [creation order], [charset], name length, name, target): its
        name, and for a hard link the object's header address and where it lies in the file."""
        mm = self._mm
        flags, pos = mm[data + 1], data + 2
        if mm[data] != 1:
            raise NotUnderstood("link message version")
        kind = 0
        if flags & 0x08:
            kind, pos = mm[pos], pos + 1
        pos += (8 if flags & 0x04 else 0) + (1 if flags & 0x10 else 0)
        width = 1 << (flags & 3)
        size = int.from_bytes(mm[pos:pos + width], "little")
        pos += width
        if pos + size + (8 if kind == 0 else 0) > data + length:
            raise NotUnderstood("link message past its size")
        name = mm[pos:pos + size].decode("utf-8")
        if kind != 0:
            return name, None, None
        return name, _U64.unpack_from(mm, pos + size)[0], pos + size

    def _symbol_table(self, btree: int, heap: int) -> dict[str, int | None]:
        """An old-style group's entries: its B-tree (node type 0) down to the "SNOD" nodes, names in the heap."""
        mm = self._mm
        at = self._at(heap, 32)
        if mm[at:at + 5] != b"HEAP\x00":
            raise NotUnderstood(f"no local heap at {heap}")
        size, segment = _U64.unpack_from(mm, at + 8)[0], _U64.unpack_from(mm, at + 24)[0]
        names = mm[self._at(segment, size):self._at(segment, size) + size]
        out: dict[str, int | None] = {}
        stack, seen, nodes = [(btree, None)], set(), []
        while stack:
            node, level = stack.pop()
            if node in seen:
                raise NotUnderstood(f"B-tree node {node} reached twice")
            seen.add(node)
            at = self._at(node, 24)
            if mm[at:at + 5] != b"TREE\x00" or (level is not None and mm[at + 5] != level):
                raise NotUnderstood(f"no group B-tree node at {node}")
            level, used = mm[at + 5], _U16.unpack_from(mm, at + 6)[0]
            self._at(node, 24 + 16 * used + 8)
            children = np.frombuffer(mm, dtype="<u8", count=2 * used + 1, offset=at + 24)[1::2].tolist()
            if level:
                stack.extend((child, level - 1) for child in reversed(children))
            else:
                nodes.extend(children)
        for node in nodes:
            at = self._at(node, 8)
            if mm[at:at + 5] != b"SNOD\x01":
                raise NotUnderstood(f"no symbol table node at {node}")
            count = _U16.unpack_from(mm, at + 6)[0]
            self._at(node, 8 + 40 * count)
            for entry in range(at + 8, at + 8 + 40 * count, 40):
                offset, header, cache = _ENTRY.unpack_from(mm, entry)
                end = names.index(b"\0", offset)
                out[names[offset:end].decode("utf-8")] = None if cache == 2 or header == UNDEFINED else header
        return out

    # -- datasets -----------------------------------------------------------------------------------------------
    def dataset(self, address: int) -> DatasetHeader:
        """The dataset whose object header is at ``address``: compact or contiguous storage, no filters, a
        fixed-point or floating-point type, a simple or scalar dataspace."""
        try:
            return self._dataset(address)[0]
        except (struct.error, IndexError, ValueError, TypeError) as exc:
            raise NotUnderstood(f"dataset at {address} ({exc})") from None

    def _dataset(self, address: int) -> tuple[DatasetHeader, Record | None]:
        """:meth:`dataset`, and its header as a record whose fields are the dimensions and, for contiguous
        storage, the data's address and size (None: a header with continuation chunks)."""
        mm = self._mm
        shape = dtype = data = None
        nbytes = 0
        messages, record = self._messages(address)
        scratch = record or Record(0, 0)
        for kind, _, pos, length in messages:
            if kind == 0x0001:
                shape, first = self._dataspace(pos, length)
                for i in range(len(shape)):
                    scratch.field(first + 8 * i)
                if mm[pos + 2] & 1:  # maximum dimensions (not read)
                    scratch.free(first + 8 * len(shape), 8 * len(shape))
            elif kind == 0x0003:
                raw = mm[pos:pos + length]
                dtype = self._types.get(raw)
                if dtype is None:
                    dtype = self._types[raw] = self._datatype(raw)
            elif kind == 0x0008:
                if mm[pos] not in (3, 4):
                    raise NotUnderstood(f"data layout version {mm[pos]}")
                if mm[pos + 1] == 0:  # compact: size (2), the raw data
                    nbytes, data = _U16.unpack_from(mm, pos + 2)[0], pos + 4
                    if nbytes + 4 > length:
                        raise NotUnderstood("compact data past its message")
                    scratch.free(data, nbytes)
                elif mm[pos + 1] == 1:  # contiguous: address, size
                    where, nbytes = _U64.unpack_from(mm, pos + 2)[0], _U64.unpack_from(mm, pos + 10)[0]
                    data = self._at(where, nbytes)
                    scratch.field(pos + 2)
                    scratch.field(pos + 10)
                else:
                    raise NotUnderstood(f"data layout class {mm[pos + 1]} (chunked or virtual)")
            else:
                raise NotUnderstood(f"message {kind:#06x} in a dataset's header")
        if shape is None or dtype is None or data is None:
            raise NotUnderstood(f"no dataset at {address}")
        if nbytes != dtype.itemsize * math.prod(shape):
            raise NotUnderstood(f"{nbytes} bytes of data for shape {shape} of {dtype}")
        return DatasetHeader(shape, dtype, data, nbytes), record

    def _dataspace(self, pos: int, length: int) -> tuple[tuple[int, ...], int]:
        """The dimensions, and the file offset of the first."""
        mm = self._mm
        version, rank = mm[pos], mm[pos + 1]
        if version == 1:
            first = pos + 8
        elif version == 2 and mm[pos + 3] in (0, 1):  # scalar, simple (not null)
            first = pos + 4
        else:
            raise NotUnderstood(f"dataspace version {version}")
        if rank > 32 or first + 8 * rank > pos + length:
            raise NotUnderstood(f"dataspace of rank {rank}")
        return struct.unpack_from(f"<{rank}Q", mm, first), first

    @staticmethod
    def _datatype(raw: bytes) -> np.dtype:
        """Fixed-point (class 0: byte order, sign; no offset, every bit used) or floating-point (class 1: byte
        order, not VAX) types only."""
        if len(raw) < 12 or raw[0] >> 4 not in (1, 2, 3, 4):
            raise NotUnderstood("datatype version")
        kind, bits, size = raw[0] & 0x0F, raw[1], _U32.unpack_from(raw, 4)[0]
        order = ">" if bits & 1 else "<"
        if kind == 0 and size in (1, 2, 4, 8) and _U16.unpack_from(raw, 8)[0] == 0 \
                and _U16.unpack_from(raw, 10)[0] == 8 * size:
            return np.dtype(f"{order}{'i' if bits & 0x08 else 'u'}{size}")
        if kind == 1 and size in (2, 4, 8) and not bits & 0x40:
            return np.dtype(f"{order}f{size}")
        raise NotUnderstood(f"datatype class {kind} of {size} bytes")

    def read(self, dataset: DatasetHeader) -> np.ndarray:
        """The dataset's values as stored (a view of the mapped file; copy before the file is closed)."""
        return self.bytes[dataset.data:dataset.data + dataset.nbytes].view(dataset.dtype).reshape(dataset.shape)
