"""Cluster side: sweep files, reports, launchers, and a real single-node Slurm.

Unit tests (sweep expansion, report on synthetic metrics, launcher command lines, a local-executor
sweep) need no Slurm. Tests marked ``slurm`` need the daemons of tests/cluster/slurm_up.sh and skip,
saying so, when they are not up. They run the machinery twice: with tests/cluster/fake_train.py (a
stand-in honouring the ``fedrun train`` contract, so the Slurm side is tested on its own) and with the
real ``python -m fedrun train`` (skipped, saying why, while the core lacks what they need).
"""

from __future__ import annotations

import csv
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from helpers import slurm_reason

from fedrun.sweep import report as report_mod
from fedrun.sweep.spec import SweepError, expand_grid, load_sweep, run_name

REPO = Path(__file__).resolve().parents[1]
FAKE = [sys.executable, str(REPO / "tests" / "cluster" / "fake_train.py"), "train"]
# a small real problem: least squares on 6 clients, float64 (bit-exact resume), no evaluation cost.
# The strategy is fixed: the uninterrupted reference is a separate run, and `auto` picks by timing, so two
# fresh runs may pick differently and differ in the last bits (README, "local.strategy").
REAL_OVERRIDES = ["data.name=least_squares", "data.partition=natural", "data.num_clients=6",
                  "participation.clients_per_round=3", "model.name=linear", "run.dtype=float64",
                  "local.batch_size=8", "local.steps=2", "local.strategy=sequential", "eval.every=5",
                  "run.device=cpu"]


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def write_sweep(tmp_path: Path, grid: dict, config: dict, resources: dict, command=None,
                name: str = "t", overrides=None) -> Path:
    data = {"name": name, "root": str(tmp_path / name), "config": config, "grid": grid,
            "resources": resources}
    if command:
        data["command"] = command
    if overrides:
        data["overrides"] = overrides
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def final_x(run_dir: Path) -> np.ndarray:
    ckpts = sorted(run_dir.glob("ckpt_*.h5"), key=lambda p: int(p.stem.split("_")[1]))
    assert ckpts, f"no checkpoint in {run_dir}"
    with h5py.File(ckpts[-1], "r") as f:
        return f["server/x"][...]


# ------------------------------------------------------------------------------------- sweep spec


def test_grid_expansion_order_names_and_overrides(tmp_path):
    points = expand_grid({"algorithm.name": ["fedavg", "fedsum"], "run.seed": [0, 1, 2]})
    assert len(points) == 6
    assert points[0] == {"algorithm.name": "fedavg", "run.seed": 0}
    assert points[3] == {"algorithm.name": "fedsum", "run.seed": 0}  # first key varies slowest
    assert expand_grid({}) == [{}]
    name = run_name({"algorithm.name": "fedsum", "local.lr": 0.1, "run.seed": 0})
    assert name.startswith("fedsum_lr0.1_seed0-") and len(name.rsplit("-", 1)[1]) == 6
    assert name == run_name({"algorithm.name": "fedsum", "local.lr": 0.1, "run.seed": 0})  # deterministic
    # same last key part, different sections: the hash keeps them apart
    assert run_name({"local.lr": 0.1, "server.lr": 1.0}) != run_name({"local.lr": 1.0, "server.lr": 0.1})
    assert "/" not in run_name({"data.root": "/data/x y"})

    base = tmp_path / "base.yaml"
    base.write_text("run: {rounds: 3}\n")
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": "base.yaml", "grid": {"algorithm.name": ["a", "b"],
                                     "run.seed": [0, 1]}, "overrides": ["run.rounds=5"],
                                     "resources": {"tasks": 2}}))
    spec = load_sweep(sweep, root=tmp_path / "root")
    assert spec.name == "s" and spec.base == base and spec.resources.tasks == 2
    runs = spec.runs()
    assert len(runs) == 4 and len({r.dir for r in runs}) == 4
    assert runs[1].overrides == ["run.rounds=5", "algorithm.name=a", "run.seed=1", f"run.dir={runs[1].dir}"]
    assert all(r.dir.parent == tmp_path / "root" for r in runs)


@pytest.mark.parametrize("value", [0.1, 1e-05, 3e20, -2.5e-7, 7, True, None, "fedsum", [1, 2], float("inf")])
def test_override_values_read_back_as_yaml(value):
    from fedrun.sweep.spec import format_value

    assert yaml.safe_load(format_value(value)) == value


def test_example_sweep_file_loads():
    spec = load_sweep(REPO / "slurm" / "example_sweep.yaml")
    runs = spec.runs()
    assert len(runs) == 6 and spec.resources.tasks == 2 and spec.base.name == "quickstart.yaml"
    assert {r.point["algorithm.name"] for r in runs} == {"fedavg", "fedsum"}


@pytest.mark.parametrize("body, message", [
    ({"grid": {"run.seed": []}}, "grid.run.seed: expected a non-empty list"),
    ({"grid": {"run.dir": ["x"]}}, "run directories are chosen by the sweep"),
    ({"bogus": 1}, "bogus: unknown key"),
    ({"base": "missing.yaml"}, "base: config file missing.yaml not found"),
    ({"resources": {"tasks": 0}}, "resources.tasks: expected an integer >= 1"),
    ({"resources": {"gpus": 1}}, "resources.gpus: unknown key"),
    ({"config": {}, "base": "x.yaml"}, "base: config file"),
])
def test_sweep_file_errors_name_the_key(tmp_path, body, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(body))
    with pytest.raises(SweepError, match=message):
        load_sweep(path)


def test_dry_run_prints_one_line_per_run(tmp_path, capsys):
    from fedrun.sweep import sweep_main

    path = write_sweep(tmp_path, {"algorithm.name": ["fedavg", "fedsum"], "run.seed": [0, 1]},
                       {"run": {"rounds": 2}}, {"tasks": 2})
    assert sweep_main([str(path), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5 and lines[-1].startswith("4 runs in ")
    assert lines[0].split()[0] == "new" and "algorithm.name=fedavg run.seed=0" in lines[0]
    assert not (tmp_path / "t").exists()  # a dry run writes nothing


# ------------------------------------------------------------------------------------- report


def synthetic_sweep(root: Path) -> None:
    """2 algorithms x 3 seeds of metrics.jsonl; fedsum learns faster; one run unfinished."""
    runs = []
    for algo, rate in (("fedavg", 0.1), ("fedsum", 0.3)):
        for seed in range(3):
            point = {"algorithm.name": algo, "run.seed": seed}
            name = run_name(point)
            d = root / name
            d.mkdir(parents=True)
            rows, up = [], 0
            for r in range(1, 11):
                up += 100
                row = {"round": r, "train_loss": float(np.exp(-rate * r) + 0.01 * seed), "wall_s": 0.1 * r,
                       "uplink_floats": 100, "downlink_floats": 50}
                if r % 5 == 0:
                    row.update(test_accuracy=1 - row["train_loss"] / 2, test_loss=row["train_loss"])
                rows.append(row)
            last = 10 if (algo, seed) != ("fedsum", 2) else 7  # this one stopped at round 7
            text = "".join(json.dumps(r) + "\n" for r in rows[:last])
            if last < 10:
                text += '{"round": 8, "train_lo'  # killed mid-write
            (d / "metrics.jsonl").write_text(text)
            if last == 10:
                (d / "result.json").write_text(json.dumps(rows[-1]))
            runs.append({"name": name, "point": point, "overrides": []})
    (root / "sweep.json").write_text(json.dumps({"name": "syn", "seed_key": "run.seed", "runs": runs}))


def test_report_tables_and_plots_from_synthetic_metrics(tmp_path, capsys):
    root = tmp_path / "syn"
    synthetic_sweep(root)
    from fedrun.sweep import report_main

    assert report_main([str(root)]) == 0
    assert "2 configurations" not in capsys.readouterr().err
    with (root / "summary.csv").open() as f:
        rows = {r["algorithm"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"fedavg", "fedsum"}
    avg = rows["fedavg"]
    assert avg["seeds"] == "3" and avg["done"] == "3"
    expected = [np.exp(-1.0) + 0.01 * s for s in range(3)]
    assert float(avg["train_loss_mean"]) == pytest.approx(np.mean(expected))
    assert float(avg["train_loss_std"]) == pytest.approx(np.std(expected, ddof=1))
    assert float(avg["uplink_total_mean"]) == 1000  # cumulated from the per-round uplink_floats
    assert rows["fedsum"]["done"] == "2" and float(rows["fedsum"]["round_std"]) > 0  # 10, 10, 7
    md = (root / "summary.md").read_text()
    assert md.count("\n") == 4 and "±" in md and "| algorithm.name=fedsum | 3 | 2 |" in md
    for png in ("curves_rounds.png", "curves_uplink.png"):
        data = (root / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_report_without_manifest_and_cumulative_fields(tmp_path):
    d = tmp_path / "loose" / "only"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text("algorithm: {name: scaffold}\n")
    (d / "metrics.jsonl").write_text("".join(json.dumps(
        {"round": r, "train_loss": 1.0 / r, "uplink_floats": 7, "uplink_floats_total": 10 * r}) + "\n"
        for r in range(1, 4)))
    rep = report_mod.make_report(tmp_path / "loose")
    (row,) = rep["table"]
    assert row["algorithm"] == "scaffold" and row["uplink_total_mean"] == 30  # the core's own total wins
    assert row["done"] == 0
    with pytest.raises(FileNotFoundError, match="no run with a metrics.jsonl"):
        report_mod.make_report(tmp_path / "empty")


# ------------------------------------------------------------------------------------- launchers


def launcher(script: str, args: list[str], extra_env: dict[str, str]) -> str:
    env = {k: v for k, v in child_env().items() if not k.startswith("SLURM_")}
    env.update(FEDRUN_PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="", **extra_env)
    proc = subprocess.run(["bash", str(REPO / "launch" / script), "--dry-run", *args], env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr.strip().split(": ", 1)[1]


def test_launcher_command_lines(tmp_path):
    run_dir = tmp_path / "r"
    cmd = launcher("mpirun.sh", ["-n", "2", "--run-dir", str(run_dir), "--config", "c.yaml", "a.b=1"], {})
    assert cmd.endswith(f"-m fedrun train --config c.yaml a.b=1 run.dir={tmp_path / 'r'}")
    assert " -n 2 " in cmd and "mpiexec" in cmd.split()[0]
    assert (tmp_path / "r").is_dir()
    # srun: ranks from the allocation, one per GPU when there are GPUs, CPUs per task passed on
    cmd = launcher("srun.sh", ["--config", "c.yaml"], {"SLURM_NTASKS": "3", "SLURM_CPUS_PER_TASK": "4"})
    assert cmd.startswith("srun --ntasks=3 --mpi=pmi2 --kill-on-bad-exit=1 --cpu-bind=cores "
                          "--cpus-per-task=4 ")
    assert "--gpus-per-task" not in cmd
    cmd = launcher("srun.sh", [], {"SLURM_NTASKS": "8", "SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_NUM_NODES": "2",
                                    "FEDRUN_MPI": "pmix"})
    assert cmd.startswith("srun --ntasks=8 --mpi=pmix") and "--gpus-per-task=1" in cmd
    cmd = launcher("srun.sh", ["-n", "5", "x=1"], {"FEDRUN_TRAIN": "/bin/echo hello"})
    assert cmd.endswith("/bin/echo hello x=1") and "--ntasks=5" in cmd


def test_fedrun_task_command(monkeypatch):
    from fedrun.sweep.submit import FedrunTask

    task = FedrunTask(["py", "-m", "fedrun", "train"], "/c.yaml", "/runs/a", ["run.dir=/runs/a"], tasks=2,
                      cpus_per_task=3, gpus_per_task=1)
    assert task.train_args() == ["py", "-m", "fedrun", "train", "--config", "/c.yaml", "--resume", "auto",
                                 "run.dir=/runs/a"]
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    in_slurm = task.command({"SLURM_JOB_ID": "7"})
    assert in_slurm[:6] == ["srun", "--ntasks=2", "--mpi=pmi2", "--kill-on-bad-exit=1", "--cpus-per-task=3",
                            "--gpus-per-task=1"]
    assert task.command({})[1:3] == ["-n", "2"]
    single = FedrunTask(["py"], None, "/r", [], tasks=1)
    assert single.command({}) == ["py", "--resume", "auto"]


def test_local_executor_sweep_skips_finished_runs(tmp_path, monkeypatch):
    """No Slurm: submitit's local executor runs each grid point with mpiexec; a resubmit skips them."""
    from fedrun.sweep.spec import load_sweep
    from fedrun.sweep.submit import submit_sweep

    monkeypatch.setenv("PYTHONPATH", child_env()["PYTHONPATH"])
    path = write_sweep(tmp_path, {"algorithm.name": ["fedavg", "fedsum"]}, {"run": {"rounds": 4}},
                       {"tasks": 2, "time_min": 2}, command=FAKE)
    jobs = submit_sweep(load_sweep(path), executor="local", out=lambda s: None)
    assert len(jobs) == 2
    results = [job.result() for _, job in jobs]
    assert [r["round"] for r in results] == [4, 4] and results[0]["uplink_floats"] == 16  # 2 ranks x 8
    lines = []
    assert submit_sweep(load_sweep(path), executor="local", out=lines.append) == []
    assert "nothing to submit" in lines[0] and "'done': 2" in lines[0]


# ------------------------------------------------------------------------------------- real Slurm


@functools.cache
def real_core_reason(resume: bool = False) -> str | None:
    """Why the real ``fedrun train`` cannot serve a test yet, or None."""
    if not (REPO / "fedrun" / "cli.py").is_file():
        return "the fedrun core (fedrun/cli.py) has not landed on this branch"
    help_text = subprocess.run([sys.executable, "-m", "fedrun", "train", "--help"], capture_output=True,
                               text=True, timeout=120, env=child_env(), cwd=REPO).stdout
    if resume and "--resume" not in help_text:
        return "fedrun train has no --resume option yet (the contract's --resume auto|PATH)"
    return None


slurm = pytest.mark.slurm


@pytest.fixture(scope="module")
def cluster():
    reason = slurm_reason()
    if reason:
        pytest.skip(reason)


def squeue_state(job_id: str) -> str:
    out = subprocess.run(["squeue", "--states=all", "-h", "-o", "%T", "-j", job_id], capture_output=True,
                         text=True, timeout=30).stdout.split()
    return out[0] if out else "UNKNOWN"


def run_srun_two_ranks(tmp_path: Path, train: list[str] | None, overrides: list[str]) -> Path:
    run_dir = tmp_path / "srun2"
    env = child_env()
    env.update(FEDRUN_PYTHON=sys.executable, FEDRUN_CPU_BIND="none")
    if train:
        env["FEDRUN_TRAIN"] = " ".join(train)
    proc = subprocess.run(["bash", str(REPO / "launch" / "srun.sh"), "-n", "2", "--run-dir", str(run_dir),
                           *overrides], env=env, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (run_dir / "result.json").is_file()
    return run_dir


@dataclass
class Trainer:
    """What the Slurm tests run: the real core when it can serve, else the contract's stand-in."""

    name: str
    command: list[str] | None  # None: the sweep default, <python> -m fedrun train
    overrides: list[str]

    def rows(self, run_dir: Path) -> list[dict]:
        return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def trainer(resume: bool) -> Trainer:
    reason = real_core_reason(resume)
    if reason is None:
        return Trainer("real core", None, REAL_OVERRIDES)
    print(f"using tests/cluster/fake_train.py: {reason}")
    return Trainer("fake_train.py", FAKE, [])


@slurm
def test_srun_two_ranks(cluster, tmp_path):
    t = trainer(resume=False)
    run_dir = run_srun_two_ranks(tmp_path, t.command, [*t.overrides, "run.rounds=5"])
    rounds = [r["round"] for r in t.rows(run_dir)]
    assert len(rounds) == 5 and rounds == list(range(rounds[0], rounds[0] + 5))  # 0- or 1-based
    result = json.loads((run_dir / "result.json").read_text())
    assert result["round"] == rounds[-1]
    if t.command == FAKE:
        assert result["uplink_floats"] == 16  # 2 ranks x 8 floats: both ranks took part


@slurm
def test_sweep_of_four_through_submitit_slurm_and_report(cluster, tmp_path):
    from fedrun.sweep import report_main
    from fedrun.sweep.spec import load_sweep
    from fedrun.sweep.submit import submit_sweep

    t = trainer(resume=False)  # the real core: fedrun train under srun, 2 ranks per array element
    path = write_sweep(tmp_path, {"algorithm.name": ["fedavg", "fedsum"], "run.seed": [0, 1]},
                       {"run": {"rounds": 4}}, {"tasks": 2, "time_min": 3, "array_parallelism": 2},
                       command=t.command, overrides=t.overrides)
    spec = load_sweep(path)
    jobs = submit_sweep(spec, executor="slurm", out=lambda s: None)
    assert len(jobs) == 4 and len({j.job_id.split("_")[0] for _, j in jobs}) == 1  # one job array
    for run, job in jobs:
        result = job.result()  # the run's result.json, through submitit
        rows = t.rows(run.dir)
        assert len(rows) == 4 and result["round"] == rows[-1]["round"], run.name
    assert report_main([str(spec.root)]) == 0
    table = list(csv.DictReader((spec.root / "summary.csv").open()))
    summary = [(r["algorithm"], r["seeds"], r["done"]) for r in table]
    assert summary == [("fedavg", "2", "2"), ("fedsum", "2", "2")]
    assert (spec.root / "curves_uplink.png").stat().st_size > 10_000
    lines: list[str] = []
    assert submit_sweep(load_sweep(path), executor="slurm", out=lines.append) == []  # all done: skipped
    assert "'done': 4" in lines[0]


def submit_one(tmp_path: Path, t: Trainer, config: dict, resources: dict):
    from fedrun.sweep.spec import load_sweep
    from fedrun.sweep.submit import submit_sweep

    path = write_sweep(tmp_path, {"run.seed": [1]}, config, resources, command=t.command, name="rq",
                       overrides=t.overrides)
    ((run, job),) = submit_sweep(load_sweep(path), executor="slurm", out=lambda s: None)
    return run, job


def job_log(job) -> str:
    return "".join(Path(str(p)).read_text() for p in (job.paths.stdout, job.paths.stderr)
                   if Path(str(p)).exists())


def result_after_one_requeue(job, t0: float, timings: dict, marker: str) -> dict:
    """Wait for the requeued job's result; its log must show ``marker`` and exactly two starts."""
    result = job.result()
    timings["total_s"] = round(time.time() - t0, 1)
    log = job_log(job)
    timings["starts"] = log.count("Loading pickle")
    assert marker in log and timings["starts"] == 2, log[-3000:]
    return result


def start_reference(tmp_path: Path, t: Trainer, rounds: int):
    """Start the same run, uninterrupted, on 2 ranks with mpiexec (alongside the Slurm job); the
    returned function waits for it and gives its final server/x."""
    ref_dir = tmp_path / "reference"
    program = t.command or [sys.executable, "-m", "fedrun", "train"]
    cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", "2", *program, *t.overrides, "run.seed=1",
           f"run.rounds={rounds}", "checkpoint.every=5", f"run.dir={ref_dir}"]
    proc = subprocess.Popen(cmd, env=child_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)

    def final() -> np.ndarray:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out[-3000:]
        return final_x(ref_dir)

    return final


@slurm
def test_time_limit_requeue_resumes_to_same_model(cluster, tmp_path):
    """A 75-s run under a 1-min Slurm time limit with --signal=USR1@55. slurmctld acts on time limits
    and warning signals only every 30-60 s, so SIGUSR1 arrives somewhere between 5 and ~60 s after the
    start; the ranks checkpoint and exit 75, submitit requeues the array element, and the next start
    resumes from the checkpoint. (Once requeued, the test lifts the element's limit to 5 min with
    scontrol so that the remainder is not stopped again.) The final model equals an uninterrupted
    run's and metrics.jsonl has every round exactly once. Takes ~1.5 min, so it runs only with
    FEDRUN_SLURM_TIMELIMIT_TEST=1; test_signal_requeue_resumes_to_same_model forces the same signal."""
    if os.environ.get("FEDRUN_SLURM_TIMELIMIT_TEST") != "1":
        pytest.skip("~1.5 min: set FEDRUN_SLURM_TIMELIMIT_TEST=1 to wait for a real Slurm time limit")
    t = Trainer("fake_train.py", FAKE, [])  # needs rounds of a known duration: the stand-in
    rounds = 150
    t0 = time.time()
    run, job = submit_one(tmp_path, t, {"run": {"rounds": rounds, "round_s": 0.5}, "checkpoint": {"every": 5}},
                          {"tasks": 2, "time_min": 1, "signal_delay_s": 55, "max_requeues": 3})
    timings = {}
    deadline = time.time() + 120
    while "Requeued job" not in job_log(job):
        assert time.time() < deadline, "not requeued within 120 s\n" + job_log(job)[-3000:]
        assert squeue_state(job.job_id) in ("PENDING", "RUNNING", "CONFIGURING", "REQUEUED", "COMPLETING")
        time.sleep(0.5)
    timings["requeued_after_s"] = round(time.time() - t0, 1)
    subprocess.run(["scontrol", "update", f"JobId={job.job_id}", "TimeLimit=5"], check=True, timeout=30)
    result = result_after_one_requeue(job, t0, timings, "this job is timed-out")
    rows = t.rows(run.dir)
    assert [r["round"] for r in rows] == list(range(1, rounds + 1)) and result["round"] == rounds
    np.testing.assert_array_equal(final_x(run.dir), start_reference(tmp_path, t, rounds)())
    print(f"requeue timings (real 1-min time limit): {timings}")


@slurm
def test_signal_requeue_resumes_to_same_model(cluster, tmp_path):
    """Slurm's warning signal forced after the first checkpoint (scancel --signal=USR1, what slurmctld
    sends at --signal time): checkpoint, exit 75, requeue, resume; same final server/x as an
    uninterrupted 2-rank run. Runs the real core when it supports --resume."""
    t = trainer(resume=True)
    rounds = 60 if t.command is None else 30
    config = {"run": {"rounds": rounds, **({"round_s": 0.2} if t.command else {})}, "checkpoint": {"every": 5}}
    t0 = time.time()
    run, job = submit_one(tmp_path, t, config, {"tasks": 2, "time_min": 5, "signal_delay_s": 60})
    reference = start_reference(tmp_path, t, rounds)
    deadline = time.time() + 120
    while not any(run.dir.glob("ckpt_*.h5")):
        assert time.time() < deadline, "no checkpoint within 120 s\n" + job_log(job)[-3000:]
        assert squeue_state(job.job_id) in ("PENDING", "RUNNING", "CONFIGURING"), job_log(job)[-3000:]
        time.sleep(0.2)
    timings = {"signal_at_s": round(time.time() - t0, 1)}
    subprocess.run(["scancel", "--signal=USR1", job.job_id], check=True, timeout=30)
    result = result_after_one_requeue(job, t0, timings, "Requeued job")
    rows = t.rows(run.dir)
    assert len(rows) == rounds and result["round"] == rows[-1]["round"]
    np.testing.assert_array_equal(final_x(run.dir), reference())
    # the report reads what this trainer writes (the core's cum_uplink_floats, for one)
    runs, seed_key = report_mod.load_sweep_dir(run.dir.parent)
    (row,) = report_mod.summarize(runs, seed_key)
    assert row["done"] == 1 and row["uplink_total_mean"] == rows[-1].get("cum_uplink_floats",
                                                                         rows[-1].get("uplink_floats_total"))
    print(f"requeue timings ({t.name}, forced signal): {timings}")
