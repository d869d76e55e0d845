"""Per-client evaluation, personalization, TensorBoard events, provenance and the round numbering of a
run's outputs (docs/evaluation.md, README "Rounds count from 1")."""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import REPO, federation, run_ranks

# the embedded MNIST, a CNN (whose outputs depend on the batch: the case the fixed batches are for),
# 12 clients with 20% of their examples held out, evaluation batches of 64 examples (several per rank)
MNIST = ["data.name=mnist5k", "data.num_clients=12", "data.alpha=0.5", "model.name=cnn_mnist", "run.seed=3",
         "local.steps=2", "local.batch_size=16", "local.lr=0.05", "local.strategy=sequential",
         "participation.pattern=uniform", "participation.clients_per_round=4", "data.client_test_fraction=0.2",
         "eval.batch_size=64"]


def train(run_dir, rounds, *extra, ranks=0, resume=False):
    args = ["-m", "fedrun", "train", f"run.dir={run_dir}", f"run.rounds={rounds}", *MNIST, *extra]
    return run_ranks(ranks, [*args, "--resume", "auto"] if resume else args)


def read_clients(run_dir) -> dict[str, np.ndarray]:
    with h5py.File(run_dir / "clients.h5", "r") as f:
        return {name: f[name][()] for name in f}


def test_per_client_results_are_identical_on_1_2_and_3_ranks(tmp_path):
    """One client per round (cyclic), so the reduce sums one upload and zeros and the global models are
    the same on any number of ranks; the per-client figures of both evaluations (global model and
    fine-tuned with 2 local steps) must then agree bit for bit."""
    runs = {}
    for ranks in (1, 2, 3):
        run_dir = tmp_path / f"r{ranks}"
        train(run_dir, 2, "participation.pattern=cyclic", "participation.clients_per_round=1", "eval.every=1",
              "eval.finetune_steps=2", ranks=ranks)
        runs[ranks] = read_clients(run_dir)
    one = runs[1]
    assert one["round"].tolist() == [1, 2] and one["accuracy"].shape == (2, 12) and (one["test_examples"] > 0).all()
    assert not np.array_equal(one["finetuned_accuracy"], one["accuracy"])  # the local steps changed the models
    for ranks in (2, 3):
        assert set(runs[ranks]) == set(one)
        for name, value in one.items():
            np.testing.assert_array_equal(runs[ranks][name], value, err_msg=f"{name} on {ranks} ranks")
    rows = [json.loads(line) for line in (tmp_path / "r1" / "metrics.jsonl").read_text().splitlines()]
    acc, counts = one["accuracy"][0], one["test_examples"]
    assert rows[0]["client_accuracy_mean"] == pytest.approx((acc * counts).sum() / counts.sum(), rel=1e-12)
    assert rows[0]["client_accuracy_mean_unweighted"] == pytest.approx(acc.mean(), rel=1e-12)
    assert rows[0]["client_accuracy_worst10"] == pytest.approx(np.sort(acc)[:2].mean(), rel=1e-12)  # ceil(1.2)
    assert rows[0]["client_accuracy_p50"] == pytest.approx(np.median(acc), rel=1e-12)


def test_finetune_with_zero_steps_gives_the_global_model_figures():
    overrides = dict(item.split("=", 1) for item in MNIST)
    cfg: dict = {}
    for key, value in overrides.items():
        section, name = key.split(".")
        cfg.setdefault(section, {})[name] = type(value)(value)
    cfg = {s: {k: _yaml(v) for k, v in sec.items()} for s, sec in cfg.items()}
    cfg["run"].update(rounds=2, device="cpu")
    fed = federation(cfg)
    fed.round(0)
    setup, state = fed.setup, fed.state
    x = fed.global_model()
    args = (x, 0, state.strategy)
    zero = setup.client_eval.evaluate(*args, finetune_steps=0)
    # the fine-tuned models are evaluated one client at a time, the global one in shared batches: the
    # losses agree to float32 rounding, the counts of correct answers exactly
    np.testing.assert_array_equal(zero["finetuned_accuracy"], zero["accuracy"])
    np.testing.assert_allclose(zero["finetuned_loss"], zero["loss"], rtol=1e-5)
    tuned = setup.client_eval.evaluate(*args, finetune_steps=3)
    np.testing.assert_array_equal(tuned["accuracy"], zero["accuracy"])
    assert not np.allclose(tuned["finetuned_loss"], zero["loss"], rtol=1e-3)


def _yaml(value: str):
    import yaml

    return yaml.safe_load(value)


def test_tensorboard_events_and_rounds_from_1_after_a_resume(tmp_path):
    """A run to round 4 with checkpoints after rounds 2 and 4; the round-4 checkpoint is removed and the run
    resumed from round 2 (as after a kill): TensorBoard's reader sees every round once, metrics.jsonl,
    result.json and clients.h5 count rounds from 1, and runtime.json has the provenance."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    extra = ["eval.every=2", "checkpoint.every=2", "metrics.tensorboard=true"]
    first = train(run_dir, 4, *extra)
    assert [line.split(" |")[0] for line in first.stdout.splitlines() if line.startswith("round")] == \
        [f"round {r}/4" for r in range(1, 5)]
    before = read_clients(run_dir)
    (run_dir / "ckpt_00000004.h5").unlink()
    second = train(run_dir, 4, *extra, resume=True)
    assert "resumed from" in second.stdout and "after round 2" in second.stdout
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    for tag in ("train_loss", "test_accuracy", "client_accuracy_worst10", "cum_uplink_floats"):
        scalars = events.Scalars(tag)
        steps = [e.step for e in scalars]
        want = [r["round"] for r in rows if tag in r]
        assert steps == want, (tag, steps)
        np.testing.assert_allclose([e.value for e in scalars], [r[tag] for r in rows if tag in r], rtol=1e-6)
    assert [e.step for e in events.Histograms("clients/accuracy")] == [2, 4]
    after = read_clients(run_dir)
    assert after["round"].tolist() == [2, 4]
    np.testing.assert_array_equal(after["accuracy"], before["accuracy"])  # the resumed run is bit-identical
    result = json.loads((run_dir / "result.json").read_text())
    assert result["round"] == 4 and "NaN" not in (run_dir / "metrics.jsonl").read_text()
    prov = json.loads((run_dir / "runtime.json").read_text())["provenance"]
    assert prov["fedrun"] and prov["versions"]["torch"] and prov["versions"]["h5py"] and prov["hosts"]
    assert prov["command"][-1] == "auto" and "T" in prov["started"]
    assert prov["git_commit"] is None or len(prov["git_commit"]) == 40
    assert (REPO / ".git").exists() == (prov["git_commit"] is not None)
    assert prov["cpu"]["machine"] and prov["cpu"]["torch_capability"]  # the CPU kind the bits depend on

    # fedrun report on this one run directory: the run's time in rounds, and the per-client plots
    from fedrun.sweep.report import make_report

    rep = make_report(run_dir, tmp_path / "report")
    (row,) = rep["table"]
    assert row["done"] == 1 and row["round_mean"] == 4
    assert row["run_s_mean"] == pytest.approx(sum(r["wall_s"] for r in rows)) and row["run_s_mean"] > rows[-1]["wall_s"]
    assert row["client_accuracy_mean_mean"] == rows[-1]["client_accuracy_mean"]
    names = {p.name for p in rep["plots"]}
    assert {"curves_rounds.png", "curves_communicated.png", "clients.png"} <= names
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in rep["plots"])


def test_provenance_names_the_cpu_kind_and_no_commit_for_a_package_outside_a_checkout(tmp_path):
    """The CPU kind: vendor, model, vector instruction sets from /proc/cpuinfo, torch's dispatch level. A fedrun
    copied into a folder of another git repository (as site-packages inside a project's checkout) records
    no commit (null, not that repository's), and never fails."""
    import platform
    import shutil
    import subprocess
    import sys

    import torch

    from fedrun.runtime.provenance import _ISA, cpu_kind

    cpu = cpu_kind()
    assert cpu["machine"] == platform.machine()
    assert cpu["torch_capability"] == torch.backends.cpu.get_cpu_capability()
    if Path("/proc/cpuinfo").is_file() and platform.machine() == "x86_64":
        assert cpu["vendor"] and cpu["model"] and "sse4_2" in cpu["isa"] and set(cpu["isa"]) <= set(_ISA)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "another project"], check=True)  # a HEAD that is not fedrun's
    shutil.copytree(REPO / "fedrun", tmp_path / "lib" / "fedrun", ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-c", "from fedrun.runtime.provenance import _git; "
                           "print(_git('rev-parse', 'HEAD'))"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path / "lib")}, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "None\n", proc.stderr
