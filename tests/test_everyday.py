"""Everyday use through the real commands: Ctrl-C and resume on real ranks (mpiexec, torchrun, one process),
``make demo`` twice, the notebook API (callback, ``model()``, ``fedrun export``), ``fedrun list``,
``fedrun config --defaults``, help texts, ``inspect`` into a closed pipe, ``report`` with fine-tuned figures,
and ``sweep --executor local`` honouring ``array_parallelism``."""

from __future__ import annotations

import inspect
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import REPO, child_env, final_state, metrics, mpiexec, run_ranks, slurm_reason, train_args

import fedrun
from fedrun import catalog
from fedrun.algorithms import ALGORITHMS
from fedrun.cli import main
from fedrun.config import load_config
from fedrun.config.help import describe_keys
from fedrun.data import DATASETS
from fedrun.federation.participation import PATTERNS, make_participation
from fedrun.federation.participation_stats import save_participation_png
from fedrun.models import MODELS, build_model

# a round of about a second on one CPU core: a second Ctrl-C lands inside a round, not after the run
SLOW = ["--config", "configs/quickstart.yaml", "data.num_clients=10", "participation.clients_per_round=10",
        "local.steps=40", "local.strategy=sequential", "eval.every=0", "checkpoint.every=1"]
TINY = ["--config", "configs/quickstart.yaml", "data.num_clients=10", "participation.clients_per_round=3",
        "local.steps=2", "local.strategy=sequential", "eval.every=0"]


def _temporaries(run: Path) -> list[str]:
    return [p.name for p in run.iterdir() if p.name.endswith(".tmp")]


def _start(cmd: list[str], run: Path, rounds: int) -> subprocess.Popen:
    """Start ``cmd`` in its own process group (as a terminal runs a job) and wait for ``rounds`` rounds."""
    proc = subprocess.Popen(cmd, env=child_env(), cwd=REPO, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    log, deadline = run / "metrics.jsonl", time.time() + 180
    while time.time() < deadline and proc.poll() is None and not (
            log.exists() and len(log.read_text().splitlines()) >= rounds):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    return proc


def _assert_stopped_after_checkpoint(run: Path, err: str) -> None:
    done = len((run / "metrics.jsonl").read_text().splitlines())
    assert final_state(run)["meta/round"] == done >= 3
    assert f"stopped by a signal after round {done};" in err and f"ckpt_{done:08d}.h5" in err, err
    assert "Traceback" not in err.split("fedrun: stopped by a signal")[0]  # a launcher's own may follow
    assert _temporaries(run) == []


@pytest.mark.mpi
def test_ctrl_c_under_mpiexec_checkpoints_says_one_line_and_exits_75(tmp_path):
    """SIGINT to the whole process group, as a terminal's Ctrl-C: mpiexec, its proxy and both ranks get it
    (and mpiexec forwards it too, so a rank sees it twice: still one Ctrl-C)."""
    run = tmp_path / "run"
    proc = _start([mpiexec(), "-n", "2", sys.executable, *train_args(run, 100000, [])], run, 3)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    assert len([line for line in err.splitlines() if line.startswith("fedrun")]) == 1, err
    assert "fedrun: Ctrl-C: finishing this round" in out
    _assert_stopped_after_checkpoint(run, err)


def test_ctrl_c_under_torchrun_checkpoints_and_exits_75_without_torchruns_traceback(tmp_path):
    """``fedrun torchrun`` is torchrun's agent with fedrun's statuses: the agent passes the Ctrl-C to its workers
    (they checkpoint) and its SignalException becomes status 75, with fedrun's line the only one."""
    run = tmp_path / "run"
    proc = _start([sys.executable, "-m", "fedrun", "torchrun", "--standalone", "--nproc_per_node", "2",
                   *train_args(run, 100000, [])], run, 3)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    _assert_stopped_after_checkpoint(run, err)


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["gforker", "torchrun"])
def test_a_closed_stdout_under_a_launcher_checkpoints_and_exits_75(tmp_path, launcher):
    """``... | head -3`` (pipefail: the launcher's status): rank 0's stdout is the pipe (gforker's own, or inherited
    from torchrun's agent), the progress line meets it closed, the ranks stop after the round with a checkpoint."""
    run = tmp_path / "run"
    prefix = {"gforker": [str(Path(sys.executable).parent / "mpiexec.gforker"), "-n", "2", sys.executable],
              "torchrun": [sys.executable, "-m", "fedrun", "torchrun", "--standalone", "--nproc_per_node", "2"]}
    args = [a for a in train_args(run, 100000, []) if a != "--quiet"]  # the progress lines reach head
    command = shlex.join([*prefix[launcher], *args])
    done = subprocess.run(["bash", "-o", "pipefail", "-c", f"{command} | head -3"], env=child_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 75, done.stderr[-3000:]
    assert len(done.stdout.splitlines()) == 3
    assert [line for line in done.stderr.splitlines() if line.strip()] == [
        line for line in done.stderr.splitlines() if line.startswith("fedrun: stopped by a closed stdout after round")]
    done_rounds = len((run / "metrics.jsonl").read_text().splitlines())
    assert final_state(run)["meta/round"] == done_rounds >= 1


@pytest.mark.mpi
@pytest.mark.parametrize(("launcher", "sig"), [("hydra", signal.SIGHUP), ("srun", signal.SIGTERM)])
def test_a_launcher_that_kills_its_ranks_outright_loses_at_most_checkpoint_every_s(tmp_path, launcher, sig):
    """MPICH's default mpiexec (Hydra) dies of a closed terminal's SIGHUP, and its proxies SIGKILL the ranks;
    an srun that made its own allocation answers SIGTERM by cancelling the job (its tasks SIGKILLed). Neither
    lets the ranks act: the checkpoints of ``checkpoint.every_s`` are what is left, and the run resumes."""
    if launcher == "srun" and (reason := slurm_reason()):
        pytest.skip(reason)
    prefix = {"hydra": [mpiexec(), "-n", "2"], "srun": ["srun", "--nodes=2", "--ntasks=2", "--mpi=none"]}[launcher]
    run = tmp_path / "run"
    # a launcher started under nohup (the suite itself run with nohup) inherits SIGHUP ignored, and then Hydra
    # goes on to the end (docs/reliability.md): the launcher here starts with SIGHUP's default, as at a terminal
    proc = subprocess.Popen([*prefix, sys.executable, *train_args(run, 10**6, ["checkpoint.every_s=0.5"])],
                            env=child_env(), cwd=REPO, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    deadline = time.time() + 180
    while len(list(run.glob("ckpt_*.h5"))) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    os.killpg(proc.pid, sig)
    proc.communicate(timeout=120)
    assert proc.returncode != 75  # the launcher's own end: fedrun had no say
    done = len((run / "metrics.jsonl").read_text().splitlines())
    kept = final_state(run)["meta/round"]
    assert 2 <= kept <= done
    records = json.loads((run / "runtime.json").read_text())["checkpoints"]
    assert len(records) >= 2  # checkpoint.every is 0: each is the clock's
    again = subprocess.run([sys.executable, *train_args(run, kept + 3, [], resume=True)], env=child_env(), cwd=REPO,
                           capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr
    assert final_state(run)["meta/round"] == kept + 3


def test_ctrl_c_in_one_process_then_again_stops_at_once_without_a_checkpoint(tmp_path):
    run = tmp_path / "run"
    proc = _start([sys.executable, "-m", "fedrun", "train", f"run.dir={run}", "run.rounds=1000", *SLOW], run, 2)
    before = sorted(p.name for p in run.glob("ckpt_*.h5"))
    os.killpg(proc.pid, signal.SIGINT)
    ack = proc.stdout.readline()
    while ack and "Ctrl-C" not in ack:
        ack = proc.stdout.readline()
    assert "Ctrl-C again stops at once" in ack
    time.sleep(0.6)  # a second press, not the first one delivered twice
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().count("\n") == 0 and "stopped at once by a second Ctrl-C" in err, err
    after = sorted(p.name for p in run.glob("ckpt_*.h5"))
    assert after[: len(before)] == before and len(after) <= len(before) + 1  # at most the round it was in
    assert _temporaries(run) == []


def _files(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file() and p.name != ".lock"}


@pytest.mark.mpi
def test_resume_finished_run_lower_and_raise_rounds(tmp_path):
    run = tmp_path / "run"
    run_ranks(0, train_args(run, 4, ["eval.every=2"]))
    before = _files(run)
    done = run_ranks(2, train_args(run, 4, ["eval.every=2"], resume=True))
    assert f"{run} finished all 4 rounds already" in done.stdout and done.stderr == "", done
    assert _files(run) == before  # config_history.jsonl, metrics, result: nothing written
    lower = run_ranks(2, train_args(run, 3, ["eval.every=2"], resume=True), check=False)
    assert lower.returncode == 2 and lower.stderr.count("\n") == 1, lower.stderr
    assert "run.rounds: expected an integer >= 4" in lower.stderr and "got 3" in lower.stderr
    assert _files(run) == before
    run_ranks(0, train_args(run, 6, ["eval.every=2"], resume=True))
    assert yaml.safe_load((run / "config.yaml").read_text())["run"]["rounds"] == 6
    assert [r["round"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]
    assert json.loads((run / "result.json").read_text())["round"] == 6
    assert final_state(run)["meta/round"] == 6


@pytest.mark.mpi
def test_make_demo_twice_resumes_and_says_which(tmp_path):
    venv = Path(sys.executable).parent.parent
    make = ["make", "-s", "-C", str(REPO), "demo", f"VENV={venv}", "-o", f"{venv}/.installed",
            f"DEMO_ARGS=run.dir={tmp_path / 'demo'} run.rounds=2 data.num_clients=10 local.steps=2 eval.every=0"]
    first = subprocess.run(make, capture_output=True, text=True, timeout=300, env=child_env())
    assert first.returncode == 0, first.stderr
    assert "no checkpoint in" in first.stdout and "starting a fresh run" in first.stdout
    second = subprocess.run(make, capture_output=True, text=True, timeout=300, env=child_env())
    assert second.returncode == 0, second.stderr
    assert second.stdout.count("finished all 2 rounds already") == 1 and "error" not in second.stderr


def test_fedrun_run_signature_callback_model_and_export(tmp_path):
    params = inspect.signature(fedrun.run).parameters
    assert {"config", "overrides", "progress", "callback", "resume"} <= set(params)
    assert "progress" in fedrun.run.__doc__ and "callback" in fedrun.run.__doc__
    seen = []

    def stop_after_two(record: dict) -> bool:
        seen.append(record["round"])
        return record["round"] == 2

    run = tmp_path / "run"
    cfg = load_config(REPO / "configs/quickstart.yaml", [*TINY[2:], f"run.dir={run}", "run.rounds=5"])
    result = fedrun.run(cfg, callback=stop_after_two)
    assert seen == [1, 2] and result.stopped and [r["round"] for r in result.metrics] == [1, 2]
    assert final_state(run)["meta/round"] == 2 and not (run / "result.json").exists()
    model = result.model()
    assert isinstance(model, torch.nn.Module)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()
    np.testing.assert_array_equal(flat, result.x)
    proc = subprocess.run([sys.executable, "-m", "fedrun", "export", str(run), "--out", str(tmp_path / "m.pt")],
                          capture_output=True, text=True, env=child_env(), cwd=REPO)
    assert proc.returncode == 0 and "after round 2" in proc.stdout, proc.stderr
    fresh = build_model("cnn_mnist", (1, 28, 28), 10).eval()
    assert not model.training
    fresh.load_state_dict(torch.load(tmp_path / "m.pt"))
    for (name, a), b in zip(fresh.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    images = torch.randn(3, 1, 28, 28)
    assert torch.equal(fresh(images), model(images))


def test_inspect_counts_rounds_from_1_and_ends_quietly_into_a_closed_pipe(tmp_path):
    run = tmp_path / "run"
    run_ranks(0, train_args(run, 3, []))
    ckpt = str(run / "ckpt_00000003.h5")
    text = run_ranks(0, ["-m", "fedrun", "inspect", ckpt]).stdout
    assert "after round 3 (resumes with round 4)" in text
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line, as `| head -0`
    proc = subprocess.run([sys.executable, "-m", "fedrun", "inspect", ckpt], stdout=write, stderr=subprocess.PIPE,
                          text=True, env=child_env(), cwd=REPO)
    os.close(write)
    assert proc.returncode == 0 and proc.stderr == ""


def test_inspect_takes_a_run_directory_and_consolidate_calls_a_full_checkpoint_whole(tmp_path, capsys):
    """``inspect RUN_DIR`` inspects the newest checkpoint (as export and flatness take a run directory);
    ``checkpoint consolidate`` of a full checkpoint is one line saying it is whole (exit 0, nothing written),
    with ``--out`` a verified byte-for-byte copy; an empty directory is one line, exit 2."""
    run = tmp_path / "run"
    run_ranks(0, train_args(run, 3, ["checkpoint.every=1", "checkpoint.keep=5"]))
    newest = run / "ckpt_00000003.h5"
    assert main(["inspect", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"{newest}: the newest checkpoint of {run}" and "after round 3 (resumes" in out
    assert main(["inspect", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"fedrun: error: {tmp_path}: no checkpoint in this run directory " \
                                              "(expected ckpt_*.h5)"
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["checkpoint", "consolidate", str(newest)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{newest}: already whole (a full checkpoint of round 3, verified); nothing to consolidate\n", err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    copy = tmp_path / "copy.h5"
    assert main(["checkpoint", "consolidate", str(newest), "--out", str(copy)]) == 0
    assert "copied to" in capsys.readouterr().out and copy.read_bytes() == newest.read_bytes()
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted([*before, "copy.h5"])


def test_list_names_every_registry_entry_once_with_a_line():
    assert set(catalog.ALGORITHMS) == set(ALGORITHMS)
    assert set(catalog.PATTERNS) == set(PATTERNS)
    assert set(catalog.MODELS) == set(MODELS)
    assert set(catalog.DATASETS) == set(DATASETS)
    out = run_ranks(0, ["-m", "fedrun", "list"]).stdout
    for entries in catalog.SECTIONS.values():
        for name, line in entries.items():
            assert f"  {name} " in out and line in out


def test_config_defaults_lists_every_key_with_its_default_and_meaning(capsys):
    out = run_ranks(0, ["-m", "fedrun", "config", "--defaults"]).stdout.splitlines()
    rows = describe_keys(load_config())
    assert len(out) == len(rows)
    for (key, value, meaning), line in zip(rows, out, strict=True):
        assert meaning, f"{key}: no comment next to the field in its dataclass"
        assert line.split()[0] == key and json.dumps(value) in line and meaning in line
    assert main(["config", "--defaults", "algorithm.name=fedadam"]) == 0
    assert "\nalgorithm.beta1 " in capsys.readouterr().out
    assert main(["config", "local.lr=0.5"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["local"]["lr"] == 0.5


def test_help_is_written_for_users(capsys):
    usage = run_ranks(0, ["-m", "fedrun", "--help"]).stdout
    assert "Argument parsing" not in usage and "fedrun list" in usage and "Ctrl-C" in usage
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    report = capsys.readouterr().out
    assert "a sweep directory" in report and "one run directory" in report


def test_report_shows_fine_tuned_figures(tmp_path):
    run = tmp_path / "run"
    run_ranks(0, ["-m", "fedrun", "train", "--quiet", f"run.dir={run}", "run.rounds=2", *TINY,
                  "data.client_test_fraction=0.2", "eval.every=1", "eval.finetune_steps=2"])
    proc = run_ranks(0, ["-m", "fedrun", "report", str(run)])
    header = (run / "summary.csv").read_text().splitlines()[0]
    assert "finetuned_accuracy_mean_mean" in header and "finetuned_accuracy_worst10_mean" in header
    assert "finetuned_accuracy_mean" in proc.stdout and (run / "clients.png").is_file()


def test_local_executor_honours_array_parallelism(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "serial", "root": str(tmp_path / "sweep"), "base": str(REPO / "configs/quickstart.yaml"),
        "overrides": TINY[2:] + ["run.rounds=2"], "grid": {"run.seed": [0, 1]},
        "resources": {"tasks": 1, "array_parallelism": 1, "time_min": 10}}))
    proc = run_ranks(0, ["-m", "fedrun", "sweep", str(sweep), "--executor", "local", "--wait"], timeout=600)
    assert proc.returncode == 0, proc.stderr
    # what it is doing while it checks and runs, and a summary in words (not a dict)
    assert "fedrun sweep: checking 2 run(s) before submitting" in proc.stderr and "skipped none" in proc.stdout
    assert "fedrun sweep: 2 tasks: 0 pending, 0 running, 2 done, 0 failed" in proc.stdout, proc.stdout
    spans = []
    for runtime in (tmp_path / "sweep").rglob("runtime.json"):
        start = json.loads(runtime.read_text())["provenance"]["started"]
        spans.append((datetime.fromisoformat(start).timestamp(), (runtime.parent / "result.json").stat().st_mtime))
    assert len(spans) == 2
    spans.sort()
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= int(end) - 1, spans  # one run at a time (start times have whole seconds)


def test_participation_plot_counts_rounds_from_1(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    titles, save = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (titles.append(fig.axes[0].get_title()),
                                                                 save(fig, *a, **k)))
    cfg = load_config(None, ["data.num_clients=6", "participation.clients_per_round=2"])
    save_participation_png(make_participation(cfg.participation, 6, 0, 30), 30, tmp_path / "p.png", window=(10, 20))
    assert titles == ["participation: uniform (N=6, rounds 11..20)"] and (tmp_path / "p.png").is_file()
