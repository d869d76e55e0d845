"""The Fashion-MNIST configs of docs/results.md run as written, on a small slice of the real data.

The slice (the first 600 training and 200 test images of the Debian package dataset-fashion-mnist,
written as IDX files) is read through ``data.root``; everything else is the config file's.
"""

from __future__ import annotations

import gzip
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

import fedrun
from fedrun.data import sources

REPO = Path(__file__).resolve().parents[1]
DEBIAN = sources.DEBIAN_FASHION_MNIST_DIR
pytestmark = pytest.mark.skipif(not (DEBIAN / "train-images-idx3-ubyte.gz").is_file(),
                                reason="Debian package dataset-fashion-mnist not installed")


def _slice(src: Path, dst: Path, n: int) -> None:
    raw = gzip.decompress(src.read_bytes())
    ndim = raw[3]
    dims = list(struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim]))
    item = int(np.prod(dims[1:])) if ndim > 1 else 1
    dims[0] = n
    body = raw[4 + 4 * ndim: 4 + 4 * ndim + n * item]
    dst.write_bytes(gzip.compress(raw[:4] + struct.pack(f">{ndim}I", *dims) + body))


@pytest.fixture(scope="module")
def fmnist_slice(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fmnist") / "fashion-mnist"
    root.mkdir()
    for split, n in (("train", 600), ("t10k", 200)):
        for kind in ("images-idx3", "labels-idx1"):
            name = f"{split}-{kind}-ubyte.gz"
            _slice(DEBIAN / name, root / name, n)
    return root


@pytest.mark.parametrize("base", ["fedsum_cnn.yaml", "fedadamom_cnn.yaml"])
@pytest.mark.parametrize("algorithm", ["fedsum", "scaffold", "fedadamom", "fedcada"])
def test_config_runs_on_a_slice(fmnist_slice, tmp_path, base, algorithm):
    result = fedrun.run(REPO / "configs" / "fmnist" / base, overrides=[
        f"data.root={fmnist_slice}", "run.rounds=2", "eval.every=1", f"run.dir={tmp_path}",
        f"algorithm.name={algorithm}"], write_files=False)
    assert np.isfinite(result.x).all() and len(result.x) == 21840
    assert "test_accuracy" in result.metrics[-1] and result.metrics[-1]["active_clients"] >= 1


def test_driver_choices():
    sys.path.insert(0, str(REPO / "experiments"))
    import fmnist_runs as fmnist

    ok = {"finite": True, "train_objective": 0.5}
    worse = {"finite": True, "train_objective": 0.7}
    diverged = {"finite": False, "train_objective": None}
    # each grid value holds its runs on the tuning seeds; the choice is the lowest mean f(x)
    assert fmnist.best({0.1: [worse, worse], 0.3: [ok, worse], 1.0: [ok, diverged]}) == 0.3
    assert fmnist.best({0.1: [ok, ok], 0.3: [ok, None]}) is None  # not all runs finished
    assert fmnist.best({0.1: [ok, worse], 0.3: [worse, ok]}) == 0.1  # ties: the smaller value
    assert fmnist.best({0.1: [worse, worse], 0.3: [ok, {"finite": True, "train_objective": 1.0}]}) == 0.1
    specs = fmnist.fedsum_specs(0.3, seeds=(0,), patterns=("p1",))
    assert [s["label"] for s in specs] == list(fmnist.FEDSUM_ALGORITHMS)
    assert all("local.lr=0.3" in s["overrides"] and "participation.pattern=p1" in s["overrides"] for s in specs)
