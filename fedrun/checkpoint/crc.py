"""CRC-32 of checkpoint data, and of a concatenation from the CRCs of its parts.

Every dataset's ``crc32`` is zlib's CRC-32 of its bytes in row (C) order. A dataset written row by row
gets one CRC per chunk, and its whole CRC is combined from those, so it costs no second pass over the
data: crc(A + B) = (crc(A) * x^(8 len B) mod P) ^ crc(B), in zlib's bit-reflected form.
"""

from __future__ import annotations

import zlib
from functools import lru_cache
from typing import Any

import numpy as np


def crc32(data: Any, crc: int = 0) -> int:
    """zlib's CRC-32 of ``data`` (an array: its bytes in row order) continuing from ``crc``."""
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data)
        return zlib.crc32(data.reshape(-1).view(np.uint8), crc)
    return zlib.crc32(data, crc)


_POLY = 0xEDB88320  # the CRC-32 polynomial P, bit-reflected


def _mul_mod_p(a: int, b: int) -> int:
    """a * b modulo the CRC-32 polynomial (bit-reflected: 1 << 31 is x^0)."""
    product = 0
    bit = 1 << 31
    while a:
        if a & bit:
            product ^= b
            a ^= bit
        bit >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


_X_POW_2K = [1 << 30]  # x^(2^k) mod P for k = 0..63
for _ in range(63):
    _X_POW_2K.append(_mul_mod_p(_X_POW_2K[-1], _X_POW_2K[-1]))


@lru_cache(maxsize=64)
def _x_pow_8n(n: int) -> int:
    """x^(8 n) mod P: the effect of appending n bytes on a CRC register."""
    result, k = 1 << 31, 3
    while n:
        if n & 1:
            result = _mul_mod_p(_X_POW_2K[k], result)
        n >>= 1
        k += 1
    return result


def crc32_combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """CRC-32 of A + B from crc32(A), crc32(B) and len(B) in bytes."""
    return _mul_mod_p(_x_pow_8n(len_b), crc_a) ^ crc_b if len_b else crc_a


@lru_cache(maxsize=16)
def _fill_crc(fill: bytes, size: int) -> int:
    return zlib.crc32(fill * (size // len(fill)))


def fill_crc(fill: Any, dtype: np.dtype, size: int) -> int:
    """CRC-32 of ``size`` bytes of the value ``fill`` stored as ``dtype`` (a chunk HDF5 never allocated)."""
    return _fill_crc(np.asarray(fill, dtype=dtype).tobytes(), int(size))


def crc32_repeat(crc: int, length: int, times: int) -> int:
    """CRC-32 of ``times`` copies of a block of ``length`` bytes whose CRC-32 is ``crc`` (by doubling:
    log2(times) combines, so a million skipped chunks cost microseconds)."""
    out, out_len, part, part_len = 0, 0, crc, length
    while times:
        if times & 1:
            out, out_len = crc32_combine(out, part, part_len), out_len + part_len
        part, part_len = crc32_combine(part, part, part_len), 2 * part_len
        times >>= 1
    return out
