"""The tutorial's plugin package (examples/myfl, docs/extending.md) through the real CLI: an algorithm, a
model, a dataset and a stateful participation pattern outside fedrun, on 2 real ranks; a run killed
mid-way and resumed with ``--resume auto`` ends bit-identical to the uninterrupted one; the tutorial's
sweep as a Slurm job array (skipped, with the reason, when the local Slurm is not up)."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import pytest
import yaml
from helpers import REPO, final_state, kill_after, metrics, run_ranks, slurm_reason

pytestmark = pytest.mark.mpi

ROUNDS = 80


@pytest.fixture
def examples_on_path(monkeypatch):
    """examples/ on the Python path of the child processes and, as for a user who submits a sweep with
    PYTHONPATH set, of this process (the sweep validates every task before it queues)."""
    monkeypatch.setenv("PYTHONPATH", str(REPO / "examples"))
    monkeypatch.syspath_prepend(str(REPO / "examples"))


def train(run_dir: Path, resume: bool = False, every: int = 4) -> list[str]:
    args = ["-m", "fedrun", "train", "--quiet", "--config", "examples/experiment.yaml", f"run.dir={run_dir}",
            f"run.rounds={ROUNDS}", f"checkpoint.every={every}", "eval.every=40"]
    return [*args, "--resume", "auto"] if resume else args


def test_example_plugins_on_two_ranks_killed_and_resumed_bit_identical(tmp_path, examples_on_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    run_ranks(2, train(whole, every=0))  # only the final checkpoint
    kill_after(train(cut), cut, 25)
    assert final_state(cut)["meta/round"] < ROUNDS
    run_ranks(2, train(cut, resume=True))
    a, b = final_state(whole), final_state(cut)
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    assert metrics(whole) == metrics(cut)
    assert json.loads((whole / "result.json").read_text())["test_accuracy"] > 0.8  # it learned the blobs
    with h5py.File(sorted(cut.glob("ckpt_*.h5"))[-1], "r") as f:
        recorded = yaml.safe_load(f["meta/config"][()].decode())["plugins"]  # the resolved config's
    assert sorted(recorded) == ["algorithm.name", "data.name", "model.name", "participation.pattern"]
    assert recorded["algorithm.name"].startswith("myfl.algorithm:ClippedFedAvg@")


@pytest.mark.slurm
def test_example_sweep_runs_as_a_slurm_job_array(tmp_path, examples_on_path):
    reason = slurm_reason()
    if reason:
        pytest.skip(reason)
    from fedrun.sweep.spec import load_sweep
    from fedrun.sweep.submit import submit_sweep

    spec = load_sweep(REPO / "examples" / "sweep.yaml", root=tmp_path / "sweep")
    spec.grid["run.seed"] = spec.grid["run.seed"][:1]  # the tutorial's file, one seed: 2 array elements
    jobs = submit_sweep(spec, executor="slurm", out=lambda line: None)
    assert len(jobs) == 2 and len({job.job_id.split("_")[0] for _, job in jobs}) == 1  # one job array
    clips = set()
    for run, job in jobs:
        result = job.result()  # the run's result.json, through submitit
        assert result["round"] == json.loads(run.dir.joinpath("result.json").read_text())["round"]
        clips.add(run.point["algorithm.clip"])
    assert clips == {0.1, 1.0}
