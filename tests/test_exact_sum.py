"""The exact sum (fedrun/runtime/exact_sum.py, docs/design.md): the same bits for any order and any split of
the terms over ranks, within its error bound of the correctly rounded sum (math.fsum), no overflow."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from helpers import run_ranks
from mpi_reductions import buffers

from fedrun.runtime import exact_sum

U = {torch.float32: 2.0 ** -24, torch.float64: 2.0 ** -53}


def summed(parts: list[torch.Tensor], terms: int) -> torch.Tensor:
    """The exact sum of ``parts`` (each one rank's rows), as the ranks and the collective take it."""
    exps = torch.stack([exact_sum.exponents(p) for p in parts]).amax(dim=0)  # the all-reduce MAX
    total = sum(exact_sum.encode_sum(p, exps, terms) for p in parts)  # the reduce
    return exact_sum.decode(total, exps, terms, parts[0].dtype)


def adversarial(n: int, d: int, seed: int) -> np.ndarray:
    """Terms over 60 binary orders of magnitude with cancellation: big +a, -a pairs around small ones."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) * np.exp2(rng.integers(-30, 30, (n, d)))
    x[1] = -x[0] * (1 + 2.0 ** -40)  # cancels x[0] but for its last bits
    return x


def bound(x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """docs/design.md: u |S| + (1 + u) n q / 2 with q = 2^(E - P)."""
    n, u = x.shape[0], U[dtype]
    e = exact_sum.exponents(torch.as_tensor(x, dtype=dtype)).double().numpy()
    bits = exact_sum.limb_bits(n)
    q = np.exp2(e - exact_sum.limbs(dtype) * bits)
    exact = np.array([math.fsum(col) for col in x.T])
    return u * np.abs(exact) + (1 + u) * n * q / 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_any_order_and_any_split_over_ranks_gives_the_same_bits(dtype):
    x = torch.as_tensor(adversarial(13, 257, 0), dtype=dtype)
    whole = summed([x], 13)
    for seed in range(4):
        perm = x[torch.randperm(13, generator=torch.Generator().manual_seed(seed))]
        cuts = sorted(np.random.default_rng(seed).choice(np.arange(1, 13), 2, replace=False))
        parts = [perm[:cuts[0]], perm[cuts[0]:cuts[1]], perm[cuts[1]:], perm[:0]]  # an empty rank too
        assert torch.equal(summed(parts, 13), whole)
    # the data make the order matter: row-by-row float sums (elementwise IEEE adds, the same bits on any CPU)
    # forwards and backwards disagree, so the equalities above are not vacuous
    forwards, backwards = functools.reduce(torch.add, x), functools.reduce(torch.add, x.flip(0))
    assert not torch.equal(forwards, backwards)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_error_within_the_bound_and_no_worse_than_the_float_sum(dtype):
    x64 = adversarial(50, 400, 1)
    x = torch.as_tensor(x64, dtype=dtype)
    terms = x.double().numpy()  # the terms as the dtype holds them
    exact = np.array([math.fsum(col) for col in terms.T])
    err = np.abs(summed([x], 50).double().numpy() - exact)
    assert (err <= bound(terms, dtype)).all()
    naive = np.abs(x.sum(dim=0).double().numpy() - exact)
    assert err.sum() <= naive.sum()
    assert (err <= naive + U[dtype] * np.abs(exact)).all()


def test_float64_cancellation_is_exact_where_the_float_sum_loses_everything():
    x = torch.tensor([[1e16], [1.0], [-1e16], [2.0 ** -20]], dtype=torch.float64)
    assert summed([x], 4).item() == math.fsum([1e16, 1.0, -1e16, 2.0 ** -20]) == 1.0 + 2.0 ** -20
    assert x.sum(dim=0).item() != 1.0 + 2.0 ** -20


def test_no_overflow_at_the_extremes_and_too_many_rows_refused():
    for dtype in (torch.float32, torch.float64):
        big = torch.finfo(dtype).max
        assert summed([torch.full((3, 2), big, dtype=dtype)], 3).isinf().all()  # as large as it truly is
        half = torch.tensor([[big / 2], [big / 4], [-big / 8]], dtype=dtype)
        exact = math.fsum(half[:, 0].tolist())  # 0.625 x max: no overflow on the way, one rounding
        assert summed([half], 3).item() == torch.tensor(exact, dtype=dtype).item()
        zeros = torch.tensor([[0.0, -0.0], [-0.0, -0.0]], dtype=dtype)
        assert summed([zeros], 2).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="declared for 2 terms was given 3"):
        exact_sum.encode_sum(torch.ones(3, 1), torch.ones(1, dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="1 to 2097152 terms"):
        exact_sum.limb_bits(exact_sum.MAX_TERMS + 1)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_the_gathered_and_the_collective_reductions_agree_on_real_ranks(tmp_path, ranks):
    """A small buffer is gathered and combined on the receiving ranks, a large one reduced by the collective
    (fedrun.runtime.flat): both paths give the exact integer sum and max on every rank."""
    out = tmp_path / "out.npz"
    run_ranks(ranks, ["tests/mpi_reductions.py", str(out)])
    got = np.load(out)
    terms, values = zip(*(buffers(r) for r in range(ranks)), strict=True)
    total = np.sum([t.numpy() for t in terms], axis=0)
    largest = np.max([v.numpy() for v in values], axis=0)
    for path in ("gathered", "collective"):
        assert np.array_equal(got[f"{path}_root"], total), path
        assert all(np.array_equal(s, total) for s in got[f"{path}_sum"]), path
        assert all(np.array_equal(m, largest) for m in got[f"{path}_max"]), path
    assert got["gathered_sum"].shape[0] == ranks
