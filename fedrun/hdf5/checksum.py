"""HDF5's metadata checksum, Bob Jenkins' lookup3 ``hashlittle`` (``H5_checksum_lookup3``), of many byte strings
of one length at once with numpy.

Version 2 object headers ("OHDR", "OCHK") and superblocks 2 and 3 end with it; HDF5 refuses one whose checksum does
not match, so a reader of the same bytes (fedrun/hdf5/headers.py) must check it too. In plain Python the hash
of a 200-byte header costs more than its parse; as uint32 numpy arrays, one row per header, the cost per header is
a few hundred nanoseconds (the 12-byte rounds run over all rows at once).
"""

from __future__ import annotations

import numpy as np


def _rot(x: np.ndarray, k: int) -> np.ndarray:
    return (x << np.uint32(k)) | (x >> np.uint32(32 - k))


def lookup3(rows: np.ndarray, length: int) -> np.ndarray:
    """Bob Jenkins' lookup3 ``hashlittle`` (initial value 0), HDF5's metadata checksum, of each row of ``rows``
    ([N, 12 * ceil(length / 12)] uint8: ``length`` bytes, then zeros): N uint32 hashes. The last block's missing
    bytes are zeros, which is what the byte-wise switch of the C code adds."""
    a = b = c = np.full(len(rows), (0xDEADBEEF + length) & 0xFFFFFFFF, dtype=np.uint32)
    if length == 0:
        return c
    words = np.ascontiguousarray(rows).view("<u4").astype(np.uint32)
    blocks = words.shape[1] // 3
    with np.errstate(over="ignore"):
        for i in range(blocks):
            a, b, c = a + words[:, 3 * i], b + words[:, 3 * i + 1], c + words[:, 3 * i + 2]
            if i < blocks - 1:  # mix: a -= c, a ^= rot(c, 4), c += b; then the same on (b, a, c), (c, b, a), ...
                x, y, z = a, c, b
                for k in (4, 6, 8, 16, 19, 4):
                    x = (x - y) ^ _rot(y, k)
                    y = y + z
                    x, y, z = z, x, y
                a, c, b = x, y, z
        # final: c ^= b, c -= rot(b, 14); then the same on (a, c), (b, a), (c, b), ...
        x, y, z = c, b, a
        for k in (14, 11, 25, 16, 4, 14, 24):
            x = (x ^ y) - _rot(y, k)
            x, y, z = z, x, y
        a, c, b = x, y, z
    return c


def checksums_match(rows: np.ndarray) -> np.ndarray:
    """Whether each row of ``rows`` ([N, L + 4] uint8) ends with the lookup3 checksum of its first L bytes."""
    length = rows.shape[1] - 4
    padded = np.zeros((len(rows), 12 * -(-length // 12)), dtype=np.uint8)
    padded[:, :length] = rows[:, :length]
    stored = np.ascontiguousarray(rows[:, length:]).view("<u4")[:, 0]
    return lookup3(padded, length) == stored
