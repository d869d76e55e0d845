"""What a group links to, read from an HDF5 file's bytes: the groups part of fedrun/hdf5/headers.py's reader.

A group's hard links are either link messages (0x0006) after a link info message (0x0002; ``libver="latest"``)
or a symbol table (0x0011: a version 1 B-tree of "SNOD" nodes and a local "HEAP" of names; h5py's default, as
TensorFlow Federated's files are). Which one HDF5 uses is decided as ``H5G__obj_lookup`` decides it: the first link
info message if any (then its links are the link messages, or in "dense" storage, a fractal heap this reader does
not parse: :meth:`HDF5Groups.links` says so with ``None``), else the first symbol table message.

A symbol table is only taken when HDF5's lookups find every name it lists: ``H5B_find`` and ``H5G__node_found``
are binary searches, so each B-tree node's keys must be in order, each name inside its node's keys
(``key[i] < name <= key[i + 1]``), each node's names in order; the local heap's free list is checked as
``H5HL__fl_deserialize`` checks it, and the entries' cache types as ``H5G__ent_decode`` does. Anything else
is damage, one line naming the file (:meth:`~fedrun.hdf5.headers.HDF5Headers.damaged`): a loop of nodes, a
node past the end of the file or of more entries than it holds, names out of order or twice, a name that is not
UTF-8 text or holds "/".
"""

from __future__ import annotations

import struct

import numpy as np

from fedrun.errors import DataError, NotUnderstood
from fedrun.hdf5.headers import _U16, _U64, UNDEFINED, HDF5Headers, _first

_ENTRY = struct.Struct("<QQI")  # symbol table entry: name's offset in the heap, object header address, cache type


class HDF5Groups(HDF5Headers):
    """:class:`~fedrun.hdf5.headers.HDF5Headers` that also read a group's links."""

    def links(self, address: int) -> dict[str, int | None] | None:
        """The links of the group whose object header is at ``address``: name -> the linked object's header
        address (None: not a hard link). None when the links are in dense storage (not parsed here)."""
        try:
            return self._links(address)
        except (struct.error, IndexError, ValueError) as exc:
            if isinstance(exc, DataError):
                raise
            raise NotUnderstood(f"group at {address} ({exc})") from None

    def _links(self, address: int) -> dict[str, int | None] | None:
        """As HDF5 looks a name up (``H5G__obj_lookup``): the first link info message decides (dense storage, or
        the link messages, the first of a name), else the first symbol table message; neither: not a group."""
        mm = self._mm
        messages = self.messages(address)
        if any(kind in (0x0001, 0x0003, 0x0008, 0x000B, 0x0005) for kind, *_ in messages):
            raise NotUnderstood(f"a dataset at {address}, not a group")
        info, table = _first(messages, 0x0002), _first(messages, 0x0011)
        if info is not None:  # link info: version 0, flags, [max creation index], fractal heap, name index
            data, length = info
            flags = mm[data + 1]
            if mm[data] != 0 or flags & ~0x03 or length < 18 + (8 if flags & 1 else 0) + (8 if flags & 2 else 0):
                raise NotUnderstood("link info message")
            if _U64.unpack_from(mm, data + (10 if flags & 1 else 2))[0] != UNDEFINED:
                return None
            out: dict[str, int | None] = {}
            for kind, _, data, length in messages:
                if kind == 0x0006:
                    name, target, _ = self._link_at(data, length)
                    if name in out:
                        raise self.damaged(f"two links named {name!r} in the group at address {address}")
                    out[name] = target
            return out
        if table is not None:  # symbol table: v1 B-tree, local heap
            data, _ = table
            return self._symbol_table(_U64.unpack_from(mm, data)[0], _U64.unpack_from(mm, data + 8)[0])
        raise NotUnderstood(f"no group at {address}")

    def _name(self, raw: bytes) -> str:
        """A link's name as h5py gives it: UTF-8, no "/" (a path separator), not "." (the group itself); other
        names are damage (HDF5 writes none)."""
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.damaged(f"a link name {raw!r} not in UTF-8") from None
        if not name or "/" in name or "\0" in name or name == ".":
            raise self.damaged(f"a link named {name!r}")
        return name

    def _link_at(self, data: int, length: int) -> tuple[str, int | None, int | None]:
        """A link message (version 1, flags, [type], [creation order], [charset], name length, name, target): its
        name, and for a hard link the object's header address and where it lies in the file. HDF5's checks
        (``H5O__link_decode``): the version, flags, link type, character set, a name of at least one byte."""
        mm = self._mm
        flags, pos = mm[data + 1], data + 2
        if mm[data] != 1 or flags & ~0x1F:
            raise NotUnderstood("link message version or flags")
        kind = 0
        if flags & 0x08:
            kind, pos = mm[pos], pos + 1
        pos += 8 if flags & 0x04 else 0
        if flags & 0x10:
            if mm[pos] > 1:
                raise NotUnderstood(f"link name character set {mm[pos]}")
            pos += 1
        width = 1 << (flags & 3)
        size = int.from_bytes(mm[pos:pos + width], "little")
        pos += width
        if size == 0 or pos + size + (8 if kind == 0 else 0) > data + length:
            raise NotUnderstood("link message past its size")
        name = self._name(mm[pos:pos + size])
        if kind != 0:
            return name, None, None
        return name, _U64.unpack_from(mm, pos + size)[0], pos + size

    def _heap(self, heap: int) -> bytes:
        """A local heap's data segment, as HDF5 checks it (``H5HL__hdr_deserialize``, ``H5HL__fl_deserialize``):
        version 0, and a free list inside the segment, each block at least 16 bytes, not looping."""
        mm = self._mm
        at = self._at(heap, 32)
        if mm[at:at + 5] != b"HEAP\x00":
            raise self.damaged(f"no local heap at address {heap}")
        size, free, segment = (_U64.unpack_from(mm, at + 8)[0], _U64.unpack_from(mm, at + 16)[0],
                               _U64.unpack_from(mm, at + 24)[0])
        names = mm[self._at(segment, size):self._at(segment, size) + size]
        seen = set()
        while free != 1:  # H5HL_FREE_NULL
            if free in seen or free + 16 > size:
                raise self.damaged(f"the local heap at address {heap}: its free list")
            seen.add(free)
            block, (free, length) = free, (_U64.unpack_from(names, free)[0], _U64.unpack_from(names, free + 8)[0])
            if free == 0 or block + length > size:
                raise self.damaged(f"the local heap at address {heap}: its free list")
        return names

    def _heap_name(self, names: bytes, offset: int, heap: int) -> bytes:
        end = names.find(b"\0", offset)
        if offset >= len(names) or end < 0:
            raise self.damaged(f"a name at offset {offset} not ended in the local heap at address {heap}")
        return names[offset:end]

    def _symbol_table(self, btree: int, heap: int) -> dict[str, int | None]:
        """An old-style group's entries: its B-tree (node type 0) down to the "SNOD" nodes, names in the heap. Only
        a tree HDF5's lookups find every name of (``H5B_find``, ``H5G__node_found``: binary searches) is taken:
        each node's keys in order, each name inside its keys, each node's names in order."""
        mm = self._mm
        names = self._heap(heap)
        out: dict[str, int | None] = {}
        width = 24 + 16 * (2 * self.node_k) + 8  # the whole node, as HDF5 reads it
        stack, seen, nodes = [(btree, None, b"", None)], set(), []
        while stack:
            node, level, low, high = stack.pop()
            if node in seen:
                raise self.damaged(f"B-tree node {node} reached twice")
            seen.add(node)
            at = self._at(node, width)
            if mm[at:at + 5] != b"TREE\x00" or (level is not None and mm[at + 5] != level):
                raise self.damaged(f"no group B-tree node at address {node}")
            level, used = mm[at + 5], _U16.unpack_from(mm, at + 6)[0]
            if used > 2 * self.node_k:
                raise self.damaged(f"B-tree node {node} of {used} entries")
            pairs = np.frombuffer(mm, dtype="<u8", count=2 * used + 1, offset=at + 24).tolist()
            keys = [self._heap_name(names, offset, heap) for offset in pairs[0::2]]
            if keys != sorted(keys):
                raise self.damaged(f"B-tree node {node}: keys out of order")
            ranges = [(max(low, keys[i]), keys[i + 1] if high is None else min(high, keys[i + 1]))
                      for i in range(used)]
            if level:
                stack.extend((child, level - 1, *bounds) for child, bounds in
                             reversed(list(zip(pairs[1::2], ranges, strict=True))))
            else:
                nodes.extend(zip(pairs[1::2], ranges, strict=True))
        for node, (low, high) in nodes:
            at = self._at(node, 8 + 40 * 2 * self.leaf_k)
            if mm[at:at + 5] != b"SNOD\x01":
                raise self.damaged(f"no symbol table node at address {node}")
            count = _U16.unpack_from(mm, at + 6)[0]
            if count > 2 * self.leaf_k:
                raise self.damaged(f"symbol table node {node} of {count} entries")
            previous = low
            for entry in range(at + 8, at + 8 + 40 * count, 40):
                offset, header, cache = _ENTRY.unpack_from(mm, entry)
                raw = self._heap_name(names, offset, heap)
                if cache > 2:
                    raise self.damaged(f"symbol table entry {raw!r}: cache type {cache}")
                if not previous < raw <= high:
                    raise self.damaged(f"symbol table node {node}: the name {raw!r} out of order")
                previous = raw
                out[self._name(raw)] = None if cache == 2 or header == UNDEFINED else header
        return out
