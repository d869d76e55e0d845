"""The bench workloads are deterministic and have the stated sizes; the bare loop runs (W2, 2 rounds)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import workloads  # noqa: E402


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(workloads, "CACHE_DIR", tmp_path / "cache")


def small_w1(**kw):
    return workloads.get_workload("W1", num_clients=20, test_size=40, **kw)


@pytest.mark.parametrize("partition", ["dirichlet", "iid"])
def test_generator_is_deterministic(partition):
    for wl in (workloads.get_workload("W2"), small_w1()):
        a = workloads.generate(wl, partition)
        b = workloads.generate(wl, partition)
        for key in a:
            assert a[key].dtype == b[key].dtype
            np.testing.assert_array_equal(a[key], b[key])
    other = workloads.generate(workloads.get_workload("W2"), partition, seed=workloads.DATA_SEED + 1)
    w2 = workloads.generate(workloads.get_workload("W2"), partition)
    assert not np.array_equal(other["x_train"], w2["x_train"])


def test_cache_round_trip_equals_generator():
    wl = small_w1()
    cached = workloads.load_arrays(wl, "dirichlet")
    again = workloads.load_arrays(wl, "dirichlet")  # read back from .npy
    fresh = workloads.generate(wl, "dirichlet")
    for key in fresh:
        np.testing.assert_array_equal(np.asarray(cached[key]), fresh[key])
        np.testing.assert_array_equal(np.asarray(again[key]), fresh[key])
    assert len(list(workloads.CACHE_DIR.glob("*.npy"))) == 4


@pytest.mark.parametrize("name", ["W1", "W2"])
def test_partition_sizes_and_shapes(name):
    wl = workloads.get_workload(name)
    if name == "W1":
        wl = small_w1()  # full W1 is 600 MB; shapes per client are the same
    clients, (x_test, y_test) = workloads.client_data(wl, "dirichlet")
    assert len(clients) == wl.num_clients
    for x, y in clients:
        assert x.shape == (wl.examples_per_client, *wl.input_shape) and x.dtype == np.float32
        assert y.shape == (wl.examples_per_client,) and y.dtype == np.int64
        assert y.min() >= 0 and y.max() < wl.num_classes
    assert x_test.shape == (wl.test_size, *wl.input_shape) and y_test.shape == (wl.test_size,)


def test_full_w2_sizes_and_dirichlet_is_skewed():
    wl = workloads.get_workload("W2")
    assert (wl.num_clients, wl.examples_per_client, wl.test_size, wl.cohort) == (1000, 50, 1000, 100)
    assert workloads.get_workload("W1").local_steps == 5 and wl.local_steps == 1
    d = workloads.generate(wl, "dirichlet")
    i = workloads.generate(wl, "iid")
    assert d["x_train"].shape == (50_000, 32) and d["y_train"].shape == (50_000,)

    def distinct(y):
        return np.mean([len(np.unique(r)) for r in y.reshape(1000, 50)])

    # alpha=0.3 concentrates each client on few labels; IID clients see nearly all 10
    assert distinct(d["y_train"]) < 7.5 < 9.0 < distinct(i["y_train"])
    # the test set is the same for both partitions
    np.testing.assert_array_equal(d["x_test"], i["x_test"])


def test_cohort_schedule_is_reproducible():
    for name in ("W1", "W2"):
        wl = workloads.get_workload(name)
        s1 = workloads.cohort_schedule(wl)
        s2 = workloads.cohort_schedule(name)
        np.testing.assert_array_equal(s1, s2)
        assert s1.shape == (wl.rounds, wl.cohort)
        for row in s1:
            assert len(np.unique(row)) == wl.cohort and row.min() >= 0 and row.max() < wl.num_clients
            assert np.all(np.diff(row) > 0)
        # a prefix does not depend on the number of rounds requested
        np.testing.assert_array_equal(workloads.cohort_schedule(wl, rounds=3), s1[:3])
        assert not np.array_equal(s1[0], s1[1])


def test_bare_loop_two_rounds_w2():
    from bench import bare_loop

    line = bare_loop.run("W2", "dirichlet", rounds=2)
    rec = json.loads(line)
    assert rec["system"] == "bare" and rec["workload"] == "W2" and rec["rounds"] == 2
    assert 0.0 <= rec["final_accuracy"] <= 1.0
    for key in ("s_per_round_median", "s_per_round_min", "s_per_round_max", "total_s"):
        assert isinstance(rec[key], float) and rec[key] >= 0
    assert rec["s_per_round_min"] <= rec["s_per_round_median"] <= rec["s_per_round_max"]


@pytest.mark.slow
def test_gpu_check_script_runs_every_part_on_cpu(tmp_path):
    """bench/gpu.py is what a lent GPU machine runs in one call: ``--device cpu --tiny`` runs every part with every
    model of its lists, so that no list names a model a part does not know (part 4 once crashed on one)."""
    import subprocess

    from bench import gpu

    repo = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, str(repo / "bench" / "gpu.py"), "--device", "cpu", "--tiny", "--out",
                    str(tmp_path)], check=True, capture_output=True, text=True, timeout=1500)
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert set(gpu.PARTS) <= set(report) and all(report[part] for part in gpu.PARTS)
    assert report["collectives"] == [{**report["collectives"][0], "backend": "gloo", "unchanged": True}]
    assert [r["model"] for r in report["local"]] == list(gpu.LOCAL_MODELS)
    for row in report["local"]:  # the bare loop and every strategy the tiny run times, as ratios or a reason
        assert row["bare loop s"] > 0 and all(f"{s} / bare" in row for s in gpu.TINY.strategies)
    assert [(r["model"], r["exact"]) for r in report["batched"]] == [(m, True) for m in gpu.BATCHED_MODELS]
    assert [(r["model"], r["same bits as autograd"]) for r in report["written_out"]] == [("logistic", True),
                                                                                        ("linear", True)]
    assert [r["strategy"] for r in report["w1"]] == [*gpu.TINY.strategies, "auto", "bare loop", "stacked vmap"]
    two = report["ranks"][1]  # 2 ranks on one device, after 1 rank and before 2 CPU ranks
    assert two["same bits as 1 rank"] is True and two["collectives"].startswith("gloo")
    md = (tmp_path / "gpu.md").read_text()
    assert all(f"\n{part} (" in md for part in gpu.PARTS)


def test_round_phases_accounts_for_the_rounds_time(tmp_path):
    """bench/round_phases.py's table: every phase named, and the phases with 'other' add up to the round."""
    import re
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "FEDRUN_BENCH_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(repo / "bench" / "round_phases.py"), "--workload", "W2", "--rounds",
                          "8", "--clients", "40"], check=True, capture_output=True, text=True, timeout=300,
                         env=env, cwd=repo / "bench").stdout
    total = float(re.search(r"([\d.]+) ms a round", out).group(1))
    top = {m[0]: float(m[1]) for m in re.findall(r"^  (\S[\w -]*?)\s+([-\d.]+) ms$", out, re.M)}
    assert set(top) == {"schedule", "downlink", "batches", "oracle set-up", "solver", "client rules", "exchange",
                        "bookkeeping", "fingerprint", "other"}
    assert top["solver"] > 0 and top["exchange"] > 0
    assert abs(sum(top.values()) - total) < 0.01 * total + 0.01


def test_bench_run_marks_runs_on_a_loaded_machine():
    from bench import run

    cores = os.cpu_count() or 1
    assert run.quiet_for("fedrun-1", cores - 1) and not run.quiet_for("fedrun-1", cores + 0.6)
    assert not run.quiet_for("fedrun-2", cores - 1 + 0.6)  # two ranks need two free cores
    assert set(run.SYSTEMS) <= set(run.PROCESSES)
    assert 0 <= run.busy_cores(0.05) <= cores
