"""Order-independent sums: fixed point with an exponent agreed per coordinate (docs/design.md).

A float sum depends on the order of its terms, so a sum over clients taken per rank and then over ranks
changes its last bits with the number of ranks, the placement and the order a rank's clients finished.
Sums of integers do not. A sum of n terms x_i in R^d (n known on every rank) is therefore taken as:

1. every coordinate j gets an exponent E_j with |x_ij| < 2^E_j for every term (from the bits of
   max_i |x_ij|), agreed over ranks by a MAX (exact);
2. every term is rounded to the nearest multiple of the quantum q_j = 2^(E_j - P), as integer "limbs":
   one limb for float32 runs (P = B), two for float64 runs (P = 2B, v = hi 2^B + lo, 0 <= lo <= 2^B), with
   B = 53 - ceil(log2 n), so that n limbs of magnitude <= 2^B sum to at most 2^53;
3. the limbs are summed as float64 integers locally (every partial sum is an integer of magnitude
   <= 2^53, so every addition is exact), and by the collective as int64 or float64 integers, exactly in
   any order and any reduction algorithm;
4. the total T is converted back once: s = fl(T q_j) in the run's dtype (one rounding).

The result is a function of the multiset of terms only. Error bound, per coordinate (u the unit
roundoff of the dtype, S the exact sum, M = max_i |x_ij|, so 2^(E_j - 1) <= M):

    |s - S| <= u |S| + (1 + u) n q_j / 2,   n q_j / 2 <= 2 n^2 2^-53 M (float32), 4 n^3 2^-106 M (float64).

(A coordinate with M below 2^(P - 127) in float32, 2^(P - 1023) in float64, takes E_j = P - 127 resp.
P - 1023, so that 2^(P - E_j) exists in the dtype: its quantum is 2^-127 resp. 2^-1023.) The float sum
this replaces is bounded by (n - 1) u sum_i |x_ij|: the first term is within that for every n >= 2, and
the quantization term is below 2^-17 u M for n <= 1000 in float32 (2^-45 u M in float64).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fedrun.runtime.flat import all_reduce
from fedrun.runtime.world import World

CHUNK = 1 << 18  # elements per temporary in encode_sum and exponents
MAX_TERMS = 1 << 21  # B >= 32: every term keeps at least 32 bits, beyond float32's 24
# per dtype: (integer type of the same width, mantissa bits, exponent bias, largest exponent of a power of 2)
_FORMATS = {torch.float32: (torch.int32, 23, 127, 127), torch.float64: (torch.int64, 52, 1023, 1023)}


def limb_bits(terms: int) -> int:
    """B = 53 - ceil(log2 n): ``terms`` integers of magnitude <= 2^B sum exactly in float64."""
    if not 1 <= terms <= MAX_TERMS:
        raise ValueError(f"an exact sum takes 1 to {MAX_TERMS} terms, got {terms}")
    return 53 - math.ceil(math.log2(terms))


def limbs(dtype: torch.dtype) -> int:
    """Limbs per coordinate: one keeps B >= 32 bits per term, beyond float32's 24; float64 needs two."""
    return 2 if dtype == torch.float64 else 1


def _format(dtype: torch.dtype) -> tuple[torch.dtype, int, int, int]:
    if dtype not in _FORMATS:
        raise ValueError(f"an exact sum takes float32 or float64 terms, got {dtype}")
    return _FORMATS[dtype]


def exponents(rows: Tensor) -> Tensor:
    """int32 ``[d]``: per coordinate an E with |x| < 2^E for every row of ``rows`` ``[C, d]`` (C may be 0): the
    frexp exponent of max |x| (the least exponent of the normal range where that is zero or subnormal).
    Non-finite values are the caller's to leave out."""
    int_type, mantissa, bias, _ = _format(rows.dtype)
    if rows.shape[0] == 0:
        return torch.full(rows.shape[1:], 2 - bias, dtype=torch.int32, device=rows.device)
    if rows.numel() <= CHUNK:  # one temporary as large as the rows: no column slices (a small model's exchange)
        largest = rows.abs().amax(dim=0)
    else:
        largest = torch.empty(rows.shape[1:], dtype=rows.dtype, device=rows.device)
        for sl in _chunks(rows):
            torch.amax(rows[:, sl].abs(), dim=0, out=largest[sl])
    field = (largest.view(int_type) >> mantissa).to(torch.int32)  # the biased exponent (the sign bit is 0)
    return field.clamp_min(1) + (1 - bias)


def agree(world: World, exps: Tensor, dtype: torch.dtype) -> Tensor:
    """The exponents ``[d]`` every rank uses: the MAX over ranks, one collective (int8 for float32 terms,
    whose exponents lie in [-125, 128], so the collective moves a quarter of an int32's bytes)."""
    if world.size == 1:
        return exps
    small = dtype == torch.float32
    wire = (exps - 1).to(torch.int8) if small else exps.clone()
    all_reduce(world, wire, "max")
    return wire.to(torch.int32) + 1 if small else wire


def pow2(k: Tensor, dtype: torch.dtype) -> Tensor:
    """2^k in ``dtype`` for integer ``k`` within the dtype's normal range, built from its bits (exact on every
    device)."""
    int_type, mantissa, bias, _ = _format(dtype)
    return ((k.to(int_type) + bias) << mantissa).view(dtype)


def _precision(exps: Tensor, terms: int, dtype: torch.dtype) -> tuple[int, int, Tensor]:
    """(B, P, the exponents raised to at least P - largest power of 2, so that 2^(P - E) exists in ``dtype``)."""
    bits = limb_bits(terms)
    precision = limbs(dtype) * bits
    return bits, precision, exps.clamp_min(precision - _format(dtype)[3])


def encode_sum(rows: Tensor, exps: Tensor, terms: int) -> Tensor:
    """float64 ``[limbs, d]`` of integers: the sum over the rows of ``rows`` ``[C, d]`` (C <= ``terms``, finite)
    of each row rounded to the quantum 2^(E - P) of the agreed exponents ``exps`` ``[d]``."""
    if rows.shape[0] > terms:
        raise ValueError(f"an exact sum declared for {terms} terms was given {rows.shape[0]} on one rank: "
                         "its limbs could exceed 2^53")
    bits, precision, exps = _precision(exps, terms, rows.dtype)
    scale = pow2(precision - exps, rows.dtype)
    if limbs(rows.dtype) == 1 and rows.numel() <= CHUNK:  # as below, without column slices
        return torch.sum((rows * scale).round_(), dim=0, dtype=torch.float64).unsqueeze(0)
    out = torch.empty(limbs(rows.dtype), rows.shape[1], dtype=torch.float64, device=rows.device)
    for sl in _chunks(rows):
        v = rows[:, sl] * scale[sl]  # exact: a power of 2, |v| < 2^P
        if len(out) == 1:
            torch.sum(v.round_(), dim=0, dtype=torch.float64, out=out[0, sl])
        else:
            hi = torch.floor(v * 2.0 ** -bits)
            torch.sum(hi, dim=0, out=out[0, sl])
            torch.sum(v.sub_(hi * 2.0 ** bits).round_(), dim=0, out=out[1, sl])  # exact difference, in [0, 2^B]
    return out


def _chunks(rows: Tensor) -> list[slice]:
    """Column slices of ``rows`` ``[C, d]`` of about CHUNK elements: temporaries stay small (a fresh [C, d]
    temporary of a large model costs more in page faults than the arithmetic)."""
    step = max(1, CHUNK // max(1, rows.shape[0]))
    return [slice(j, j + step) for j in range(0, rows.shape[1], step)]


def decode(total: Tensor, exps: Tensor, terms: int, dtype: torch.dtype) -> Tensor:
    """The ``dtype`` ``[d]`` value of the summed limbs ``total`` ``[limbs, d]``: T rounded once to float64 (and
    once more to float32), times the quantum (exact but where the result is subnormal)."""
    bits, precision, exps = _precision(exps, terms, dtype)
    t = total[0] if total.shape[0] == 1 else total[0] * 2.0 ** bits + total[1]
    shift = (exps - precision).to(torch.int64)  # q = 2^shift, applied in two halves (2^shift may not exist)
    half = torch.div(shift, 2, rounding_mode="floor")
    return (t * pow2(half, torch.float64) * pow2(shift - half, torch.float64)).to(dtype)


def all_reduce_exact_sum(world: World, rows: Tensor, terms: int) -> Tensor:
    """The exact sum over every rank's ``rows`` ``[C_r, d]`` (at most ``terms`` rows in all), on every rank:
    a MAX of the exponents and a SUM of the limbs, one collective each."""
    exps = agree(world, exponents(rows), rows.dtype)
    total = encode_sum(rows, exps, terms)
    return decode(all_reduce(world, total, "sum"), exps, terms, rows.dtype)
