"""A run of an algorithm with per-client vectors writes its end-of-run checkpoint (clients/<name> rows)."""

from __future__ import annotations

import h5py

import fedrun


def test_scaffold_run_writes_client_rows(tmp_path):
    fedrun.run({"run": {"rounds": 2, "dir": str(tmp_path / "r"), "dtype": "float64"},
                "data": {"name": "least_squares", "partition": "natural", "num_clients": 4},
                "model": {"name": "linear"},
                "local": {"steps": 2, "batch_size": 8, "lr": 0.05},
                "participation": {"pattern": "uniform", "clients_per_round": 2},
                "algorithm": {"name": "scaffold"}, "eval": {"every": 0}})
    ckpts = sorted((tmp_path / "r").glob("ckpt_*.h5"))
    assert ckpts
    with h5py.File(ckpts[-1], "r") as f:
        names = []
        f.visit(names.append)
        rows = [n for n in names if n.startswith("clients/") and isinstance(f[n], h5py.Dataset)]
        assert rows and all(f[n].shape[0] == 4 for n in rows)
