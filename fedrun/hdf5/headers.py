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
  link info message (0x0002), in fedrun/hdf5/groups.py. A group whose links are in "dense" storage (a
  fractal heap) is not parsed: the caller asks HDF5 for that group's links;
* a dataset's dataspace (0x0001), datatype (0x0003: fixed-point and floating-point classes), data layout
  (0x0008 versions 3 and 4: compact, or contiguous with the data's address and size).

Every structure is read the way HDF5 reads it, and every field HDF5 checks there is checked: the first of
duplicate messages (``H5O_msg_read`` takes the first), continuation chunks in the order found, a group's link info
before its symbol table, the maximum dimensions not under the dimensions, version 1 headers' message count and
8-byte alignment, message flags, the datatype's every bit (fixed-point with every bit used, IEEE floats), the fill
value message, a local heap's free list, a symbol table's cache types, and a group B-tree's keys and names in the
order HDF5's binary searches need (a name the searches would not find is not listed). Bounds are HDF5's: the
superblock's end-of-file address (EOA), not the file's size.

Two outcomes besides a parse. :class:`NotUnderstood`: a valid layout this reader does not take (chunked, filtered,
external or virtual storage, a data address never written, soft or external links, other datatype classes,
shared messages, message types, versions or flags h5py does not write, a checksum that does not match, a field
HDF5 would refuse); the caller asks HDF5 instead, inside a guard that turns HDF5's error into one line.
:class:`~fedrun.errors.DataError` (one line naming the file): damage the reader itself found and that HDF5 must not
be handed, since HDF5 may crash on it (a B-tree node pointing at itself made it segfault): a loop of B-tree nodes,
continuation chunks or heap free blocks, an address or a length past the EOA, a signature missing where a
structure is pointed at, more entries than a node holds, names out of order or duplicated, a name not ended in
its heap. A damaged file is thus never read out of bounds and never raises anything else.
Version 2 headers carry a checksum (Bob Jenkins' lookup3, as ``H5_checksum_lookup3``); HDF5 refuses a header
whose checksum does not match, so must a reader of the same bytes: the spans parsed are collected in
:attr:`HDF5Headers.spans` and checked many at a time with numpy (fedrun/hdf5/checksum.py), since the hash in
plain Python costs more than the parse. Each parse also records which bytes it read as values, so that
fedrun/hdf5/templates.py can apply it to many objects at once.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass

import numpy as np

from fedrun.errors import DataError, NotUnderstood
from fedrun.hdf5.checksum import checksums_match

SIGNATURE = b"\x89HDF\r\n\x1a\n"
UNDEFINED = (1 << 64) - 1
_U8, _U16, _U32, _U64 = struct.Struct("<B"), struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")
_V1_MESSAGE = struct.Struct("<HHB")  # type, size, flags (then 3 reserved bytes)
_V2_MESSAGE = struct.Struct("<BHB")  # type, size, flags
# message types a dataset's or group's header may hold that HDF5 does not decode when it opens the object, or
# that are checked here (0x0005 fill value, 0x000A group info, 0x0016 reference count)
_IGNORED = {0x0000, 0x0005, 0x000A, 0x000C, 0x000D, 0x000E, 0x0012, 0x0015, 0x0016}
_READ = {0x0001, 0x0002, 0x0003, 0x0006, 0x0008, 0x000B, 0x0010, 0x0011}
_CONSTANT = 0x01  # the only message flag h5py writes (the datatype's and fill value's "constant")
_V2_FLAGS = 0x3F  # object header version 2 flags HDF5 knows (size width, attribute order, phase change, times)
_MAX_CHUNKS = 64  # object header chunks followed per header
_VERIFY_BYTES = 1 << 24  # bytes of spans hashed at once (an odd file may hold large header chunks)
# IEEE floats as numpy holds them: size -> (exponent location, exponent size, mantissa location and size, bias)
_IEEE = {2: (10, 5, 0, 10, 15), 4: (23, 8, 0, 23, 127), 8: (52, 11, 0, 52, 1023)}


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
    (fedrun/hdf5/templates.py): the bytes ``free`` may differ from object to object (values read, times, the
    checksum); ``fields`` are the offsets of the 8-byte values read (an address, a size, a dimension), numbered in
    order across a template's records; ``extent`` (at least ``length``): the bytes HDF5 reads there, which must
    lie inside the file (a B-tree node's or symbol table node's unused entries)."""

    def __init__(self, start: int, length: int, checksum: bool = False, extent: int = 0) -> None:
        self.start, self.length, self.checksum = start, length, checksum
        self.extent = max(length, extent)
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


def _first(messages: list[tuple[int, int, int, int]], kind: int) -> tuple[int, int] | None:
    """The data offset and size of the first message of type ``kind`` (HDF5 reads the first), or None."""
    return next(((data, length) for k, _, data, length in messages if k == kind), None)


class HDF5Headers:
    """One HDF5 file, mapped read-only; :class:`NotUnderstood` when its superblock is not one this reader knows.

    ``size``: the end of what may be read, the superblock's end-of-file address (HDF5's bound; an opened file is
    at least that long). ``spans``: the (start, length) of every version 2 header chunk parsed since the last
    :meth:`verify`; a chunk's checksum is the 4 bytes after it."""

    def __init__(self, path: str) -> None:
        self.path = path
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
    def damaged(self, what: str) -> DataError:
        """The one line for damage found here (module docstring: never handed to HDF5)."""
        return DataError(f"{self.path}: damaged HDF5 file: {what}; expected an HDF5 file as written (fedrun's "
                         "header reader refuses it rather than hand it to HDF5)")

    def _at(self, address: int, length: int) -> int:
        """The file offset of ``length`` bytes at ``address`` (relative to the base), checked inside the file:
        an undefined address is not understood (data never written), one past the end is damage."""
        if address == UNDEFINED:
            raise NotUnderstood("an undefined address")
        if length < 0 or self.base + address + length > self.size:
            raise self.damaged(f"address {address} + {length} bytes past the end of the file ({self.size} bytes)")
        return self.base + address

    def _superblock(self) -> tuple[int, int]:
        """The base address and the root group's header address; :attr:`size` set to the EOA. Also the group
        B-tree's and symbol table node's K (superblocks 0 and 1; HDF5's defaults, 16 and 4, otherwise)."""
        mm, at = self._mm, 0
        while mm[at:at + 8] != SIGNATURE:
            at = 512 if at == 0 else 2 * at
            if at + 8 > self.size:
                raise NotUnderstood("no HDF5 signature")
        version = mm[at + 8]
        self.leaf_k, self.node_k = 4, 16
        if version in (0, 1):
            if (mm[at + 13], mm[at + 14]) != (8, 8):
                raise NotUnderstood("offsets or lengths not of 8 bytes")
            self.leaf_k, self.node_k = _U16.unpack_from(mm, at + 16)[0], _U16.unpack_from(mm, at + 18)[0]
            if not self.leaf_k or not self.node_k:
                raise NotUnderstood("a K of 0")
            fields = at + (24 if version == 0 else 28)
            base, eoa = _U64.unpack_from(mm, fields)[0], _U64.unpack_from(mm, fields + 16)[0]
            root = _U64.unpack_from(mm, fields + 40)[0]  # the root's symbol table entry: name offset, header
        elif version in (2, 3):
            if (mm[at + 9], mm[at + 10]) != (8, 8):
                raise NotUnderstood("offsets or lengths not of 8 bytes")
            if at + 48 > self.size:
                raise NotUnderstood("superblock cut short")
            base, eoa, root = (_U64.unpack_from(mm, at + 12)[0], _U64.unpack_from(mm, at + 28)[0],
                               _U64.unpack_from(mm, at + 36)[0])
            self.spans.append((at, 44))
        else:
            raise NotUnderstood(f"superblock version {version}")
        if base != at:
            raise NotUnderstood(f"base address {base}, superblock at {at}")
        if base + eoa > self.size:  # HDF5 does not open such a file ("truncated file")
            raise NotUnderstood(f"end of file address {eoa} past the file's {self.size} bytes")
        self.size = base + eoa
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
        """The messages of the object header at ``address``: (type, flags, file offset of the data, size), in
        HDF5's order (chunk 0, then continuation chunks in the order found); version 2 chunks added to
        :attr:`spans`."""
        try:
            return self._messages(address)[0]
        except (struct.error, IndexError) as exc:
            raise NotUnderstood(f"object header at {address} ({exc})") from None

    def _messages(self, address: int) -> tuple[list[tuple[int, int, int, int]], Record | None]:
        """:meth:`messages`, and the header as a record of a template (None: it has continuation
        chunks, elsewhere in the file). HDF5's checks of the prefix and of each message (``H5O__prefix_deserialize``,
        ``H5O__chunk_deserialize``) are made; what h5py never writes is not understood."""
        mm = self._mm
        at = self._at(address, 16)
        out: list[tuple[int, int, int, int]] = []
        if mm[at] == 1:  # version 1: version, reserved, messages (2), references (4), header size (4), padding
            v2, tracked = False, 0
            count, size = _U16.unpack_from(mm, at + 2)[0], _U32.unpack_from(mm, at + 8)[0]
            if count == 0 or size < 8:
                raise NotUnderstood(f"a version 1 header at {address} of {count} messages in {size} bytes")
            chunks = [(at + 16, self._at(address + 16, size) + size)]
            record = Record(at, 16 + size)
        elif mm[at:at + 5] == b"OHDR\x02":
            v2, flags, count = True, mm[at + 5], -1
            if flags & ~_V2_FLAGS:
                raise NotUnderstood(f"object header flags {flags:#04x} at {address}")
            start = at + 6 + (16 if flags & 0x20 else 0)
            if flags & 0x10:  # attribute phase change: most compact, fewest dense
                if _U16.unpack_from(mm, start)[0] < _U16.unpack_from(mm, start + 2)[0]:
                    raise NotUnderstood(f"attribute phase change values at {address}")
                start += 4
            width = 1 << (flags & 3)
            size = int.from_bytes(mm[start:start + width], "little")
            begin = start + width
            end = self._at(begin - self.base, size + 4) + size
            if size < 4 + (2 if flags & 0x04 else 0):
                raise NotUnderstood(f"a version 2 header at {address} of {size} bytes")
            self.spans.append((at, end - at))
            chunks = [(begin, end)]
            tracked = 2 if flags & 0x04 else 0
            record = Record(at, end + 4 - at, checksum=True)
            if flags & 0x20:  # access, modification, change and birth times
                record.free(at + 6, 16)
        else:
            raise self.damaged(f"no object header at address {address}")
        seen, parsed = set(), 0
        while chunks:
            begin, end = chunks.pop(0)
            step = (4 + tracked) if v2 else 8
            pos = begin
            while pos + step <= end:
                if v2:
                    kind, length, mflags = _V2_MESSAGE.unpack_from(mm, pos)
                else:
                    kind, length, mflags = _V1_MESSAGE.unpack_from(mm, pos)
                    if length % 8:
                        raise NotUnderstood(f"a message of {length} bytes in the version 1 header at {address}")
                parsed += 1
                data = pos + step
                pos = data + length
                if pos > end:
                    raise NotUnderstood(f"message of {length} bytes past its header chunk at {address}")
                if mflags & ~_CONSTANT:
                    raise NotUnderstood(f"message flags {mflags:#04x} in the header at {address}")
                if kind in (0x000E, 0x0012) and record is not None:  # modification times
                    record.free(data, length)
                if kind == 0x0010:  # continuation: address, length
                    if length < 16:
                        raise NotUnderstood(f"a continuation message of {length} bytes at {address}")
                    record = None
                    where, more = _U64.unpack_from(mm, data)[0], _U64.unpack_from(mm, data + 8)[0]
                    if where in seen or len(seen) >= _MAX_CHUNKS:
                        raise self.damaged(f"a loop of continuation chunks in the header at address {address}")
                    seen.add(where)
                    first = self._at(where, more)
                    if v2:
                        if mm[first:first + 4] != b"OCHK" or more < 8:
                            raise self.damaged(f"no continuation chunk at address {where}")
                        self.spans.append((first, more - 4))
                        chunks.append((first + 4, first + more - 4))
                    else:
                        chunks.append((first, first + more))
                elif kind in _READ:
                    out.append((kind, mflags, data, length))
                elif kind == 0x0016 and (not v2 or length < 5 or mm[data] != 0):  # reference count: version 2 only
                    raise NotUnderstood(f"a reference count message in the header at {address}")
                elif kind == 0x000A and (length < 2 or mm[data] != 0 or mm[data + 1] & ~0x03):  # group info
                    raise NotUnderstood(f"a group info message in the header at {address}")
                elif kind not in _IGNORED:
                    raise NotUnderstood(f"message {kind:#06x} in the header at {address}")
                elif kind == 0x0005:
                    out.append((kind, mflags, data, length))
            if not v2 and pos != end:  # version 1 chunks hold no gaps (HDF5: "gap found in early version")
                raise NotUnderstood(f"a gap in the version 1 header at {address}")
        if not v2 and parsed != count:
            raise NotUnderstood(f"{parsed} messages in the version 1 header at {address}, which says {count}")
        return out, record

    # -- datasets -----------------------------------------------------------------------------------------------
    def dataset(self, address: int) -> DatasetHeader:
        """The dataset whose object header is at ``address``: compact or contiguous storage, no filters, a
        fixed-point or floating-point type, a simple or scalar dataspace."""
        try:
            return self._dataset(address)[0]
        except (struct.error, IndexError, ValueError, TypeError) as exc:
            if isinstance(exc, DataError):
                raise
            raise NotUnderstood(f"dataset at {address} ({exc})") from None

    def _dataset(self, address: int) -> tuple[DatasetHeader, Record | None, bool]:
        """:meth:`dataset`, its header as a record whose fields are the dimensions, the maximum dimensions (when
        stored: the bool returned) and, for contiguous storage, the data's address and size (None: a header with
        continuation chunks). The first message of each type, as HDF5 reads them (``H5D__open_oid``)."""
        mm = self._mm
        messages, record = self._messages(address)
        scratch = record or Record(0, 0)
        if _first(messages, 0x000B) is not None:
            raise NotUnderstood("filters")
        space, kind, layout = _first(messages, 0x0001), _first(messages, 0x0003), _first(messages, 0x0008)
        if space is None or kind is None or layout is None or any(k in (0x0002, 0x0006, 0x0011)
                                                                   for k, *_ in messages):
            raise NotUnderstood(f"no dataset at {address}")
        shape, first, limits = self._dataspace(*space)
        for i in range(len(shape)):
            scratch.field(first + 8 * i)
        for i in range(len(shape) if limits else 0):
            scratch.field(first + 8 * (len(shape) + i))
        raw = mm[kind[0]:kind[0] + kind[1]]
        dtype = self._types.get(raw)
        if dtype is None:
            dtype = self._types[raw] = self._datatype(raw)
        fill = _first(messages, 0x0005)
        if fill is not None:
            self._fill(*fill, dtype)
        pos, length = layout
        if mm[pos] not in (3, 4) or length < 4:
            raise NotUnderstood(f"data layout version {mm[pos]}")
        if mm[pos + 1] == 0:  # compact: size (2), the raw data
            nbytes, data = _U16.unpack_from(mm, pos + 2)[0], pos + 4
            if nbytes + 4 > length:
                raise NotUnderstood("compact data past its message")
            scratch.free(data, nbytes)
        elif mm[pos + 1] == 1 and length >= 18:  # contiguous: address, size
            where, nbytes = _U64.unpack_from(mm, pos + 2)[0], _U64.unpack_from(mm, pos + 10)[0]
            if nbytes != dtype.itemsize * math.prod(shape) or nbytes == 0:
                raise NotUnderstood(f"{nbytes} bytes of data for shape {shape} of {dtype}")
            data = self._at(where, nbytes)
            scratch.field(pos + 2)
            scratch.field(pos + 10)
        else:
            raise NotUnderstood(f"data layout class {mm[pos + 1]} (chunked or virtual)")
        if nbytes != dtype.itemsize * math.prod(shape):
            raise NotUnderstood(f"{nbytes} bytes of data for shape {shape} of {dtype}")
        return DatasetHeader(shape, dtype, data, nbytes), record, limits

    def _dataspace(self, pos: int, length: int) -> tuple[tuple[int, ...], int, bool]:
        """The dimensions, the file offset of the first, whether maximum dimensions follow them (each at least
        its dimension, or unlimited). Versions 1 and 2, scalar or simple (``H5O__sdspace_decode``)."""
        mm = self._mm
        version, rank, flags = mm[pos], mm[pos + 1], mm[pos + 2]
        if version == 1:
            first = pos + 8
        elif version == 2 and (mm[pos + 3] == 1 or (mm[pos + 3] == 0 and rank == 0)):  # simple, scalar
            first = pos + 4
        else:
            raise NotUnderstood(f"dataspace version {version}")
        limits = bool(flags & 1)
        if flags & ~0x01 or rank > 32 or first + 8 * rank * (2 if limits else 1) > pos + length:
            raise NotUnderstood(f"dataspace of rank {rank}, flags {flags}")
        shape = struct.unpack_from(f"<{rank}Q", mm, first)
        if limits:
            most = struct.unpack_from(f"<{rank}Q", mm, first + 8 * rank)
            if any(m != UNDEFINED and m < d for d, m in zip(shape, most, strict=True)):
                raise NotUnderstood(f"maximum dimensions {most} under the dimensions {shape}")
        return shape, first, limits

    @staticmethod
    def _datatype(raw: bytes) -> np.dtype:
        """Fixed-point (class 0: byte order, sign, no padding; no offset, every bit used) or IEEE floating-point
        (class 1: byte order, implied mantissa bit, numpy's exponent and mantissa) types only: what numpy reads
        from the same bytes is then what HDF5's conversion gives."""
        if len(raw) < 12 or raw[0] >> 4 not in (1, 2, 3, 4):
            raise NotUnderstood("datatype version")
        kind, bits, size = raw[0] & 0x0F, raw[1], _U32.unpack_from(raw, 4)[0]
        order = ">" if bits & 1 else "<"
        exact = raw[2:4] == b"\0\0" and _U16.unpack_from(raw, 8)[0] == 0 and _U16.unpack_from(raw, 10)[0] == 8 * size
        if kind == 0 and size in (1, 2, 4, 8) and not bits & ~0x09 and exact:
            return np.dtype(f"{order}{'i' if bits & 0x08 else 'u'}{size}")
        if kind == 1 and size in _IEEE and bits & ~0x01 == 0x20 and raw[2] == 8 * size - 1 and raw[3] == 0 \
                and len(raw) >= 20 and _U16.unpack_from(raw, 8)[0] == 0 and _U16.unpack_from(raw, 10)[0] == 8 * size \
                and (raw[12], raw[13], raw[14], raw[15], _U32.unpack_from(raw, 16)[0]) == _IEEE[size]:
            return np.dtype(f"{order}f{size}")
        raise NotUnderstood(f"datatype class {kind} of {size} bytes")

    def _fill(self, pos: int, length: int, dtype: np.dtype) -> None:
        """The fill value message as h5py writes it (versions 2 and 3; ``H5O__fill_new_decode``'s checks): known
        allocation and fill times, a value, if any, of the dataset's element size."""
        mm = self._mm
        version = mm[pos]
        if version == 2 and length >= 4:
            alloc, when, defined, size_at = mm[pos + 1], mm[pos + 2], mm[pos + 3], pos + 4
            value = defined == 1
            ok = defined in (0, 1)
        elif version == 3 and length >= 2:
            flags, size_at = mm[pos + 1], pos + 2
            alloc, when, value = flags & 0x03, (flags >> 2) & 0x03, bool(flags & 0x20)
            ok = not flags & ~0x3F and not (flags & 0x10 and value)
        else:
            raise NotUnderstood(f"fill value message version {version}")
        if not ok or alloc not in (1, 2, 3) or when > 2:
            raise NotUnderstood("fill value message")
        if value:
            if size_at + 4 > pos + length:
                raise NotUnderstood("fill value message")
            size = _U32.unpack_from(mm, size_at)[0]
            if size not in (0, dtype.itemsize) or size_at + 4 + size > pos + length:
                raise NotUnderstood(f"a fill value of {size} bytes")

    def read(self, dataset: DatasetHeader) -> np.ndarray:
        """The dataset's values as stored (a view of the mapped file; copy before the file is closed)."""
        return self.bytes[dataset.data:dataset.data + dataset.nbytes].view(dataset.dtype).reshape(dataset.shape)
