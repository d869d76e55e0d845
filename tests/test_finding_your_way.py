"""Finding your way (README, docs/scale.md): each through the real command or the real Python API, as a new
user would meet it."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys

import h5py
import numpy as np
import pytest
from helpers import REPO, child_env, run_ranks

import fedrun
from fedrun.errors import ConfigError

QUICK = ["data.name=least_squares", "data.num_clients=8", "data.partition=iid", "model.name=linear",
         "participation.clients_per_round=2", "local.steps=2", "eval.every=0"]


def fedrun_cli(*args: str, check: bool = False):
    return run_ranks(0, ["-m", "fedrun", *args], check=check, timeout=300)


def test_list_names_the_on_demand_datasets():
    out = fedrun_cli("list", check=True).stdout
    datasets = out.split("datasets (data.name):")[1]
    assert "synthetic_fedprox" in datasets and "federated_h5" in datasets


def test_a_million_clients_of_a_resident_dataset_is_refused_with_a_pointer_to_on_demand_datasets(tmp_path):
    proc = fedrun_cli("train", "--quiet", f"run.dir={tmp_path / 'r'}", "data.name=mnist5k", "data.num_clients=1000000")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "data.num_clients=1000000" in lines[0] and "data.name=synthetic_fedprox" in lines[0] and \
        "federated_h5" in lines[0] and "docs/scale.md" in lines[0], lines


def write_tff(path, clients: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    with h5py.File(path, "w") as f:
        for cid, (x, y) in clients.items():
            group = f.create_group(f"examples/{cid}")
            group["pixels"], group["label"] = x, y


def tff_files(tmp_path, label_dtype=np.int64) -> list[str]:
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("test", 3)):
        write_tff(tmp_path / f"{split}.h5", {str(c): (rng.normal(size=(n, 4)).astype(np.float32),
                                                      rng.integers(0, 3, n).astype(label_dtype)) for c in range(7)})
    return ["data.name=federated_h5", f"data.federated_h5.train={tmp_path / 'train.h5'}",
            f"data.federated_h5.test={tmp_path / 'test.h5'}", "model.name=logistic",
            "participation.clients_per_round=3", "data.federated_h5.test_clients=7"]


def test_federated_h5_takes_the_files_client_count_without_restating_it(tmp_path):
    """Seven client groups in the file and no data.num_clients: the run has 7 clients (config.yaml says so);
    a restated count that differs is still refused."""
    run_dir = tmp_path / "r"
    fedrun_cli("train", "--quiet", f"run.dir={run_dir}", "run.rounds=2", *tff_files(tmp_path), check=True)
    assert "num_clients: 7" in (run_dir / "config.yaml").read_text()
    proc = fedrun_cli("train", "--quiet", f"run.dir={tmp_path / 'r2'}", *tff_files(tmp_path), "data.num_clients=9")
    assert proc.returncode == 2 and "has 7 clients" in proc.stderr, proc.stderr


def test_float_labels_in_a_federated_h5_file_are_named_as_such(tmp_path):
    proc = fedrun_cli("train", "--quiet", f"run.dir={tmp_path / 'r'}", *tff_files(tmp_path, np.float32))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "train.h5: client '0'" in lines[0] and "examples/0/label" in lines[0] and "float32" in lines[0] and \
        "expected integer class labels" in lines[0], lines


def test_compare_says_identical_through_the_shorter_run_and_when_a_run_is_in_progress(tmp_path):
    """A 2-round run against the 4-round run with the same settings: its rounds and its checkpoint agree, so
    compare says "identical through round 2" (exit 1: the runs are not the same); a run directory whose lock a
    live process holds is reported as still in progress."""
    long, short = tmp_path / "long", tmp_path / "short"
    fedrun_cli("train", "--quiet", f"run.dir={long}", "run.rounds=4", "checkpoint.every=2", *QUICK, check=True)
    fedrun_cli("train", "--quiet", f"run.dir={short}", "run.rounds=2", "checkpoint.every=2", *QUICK, check=True)
    proc = fedrun_cli("compare", str(long), str(short))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith(f"identical through round 2: {short} is a prefix"), \
        proc.stdout
    with open(short / ".lock", "a+") as fh:  # this process holds it, as a live run does
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = fedrun_cli("compare", str(long), str(short))
    assert f"{short}: still in progress" in proc.stdout, proc.stdout
    same = fedrun_cli("compare", str(long), str(long))
    assert same.returncode == 0 and same.stdout.strip().splitlines()[-1] == "identical"


def test_the_python_api_names_its_own_arguments_and_a_callbacks_stop_prints_a_line(tmp_path, capsys):
    overrides = [f"run.dir={tmp_path / 'r'}", "run.rounds=5", "run.device=cpu", *QUICK]
    result = fedrun.run({}, overrides, callback=lambda record: record["round"] == 2)
    assert result.stopped and result.rounds_run == 2
    out = capsys.readouterr().out
    assert "fedrun: the callback stopped the run after round 2" in out and 'resume="auto"' in out, out
    with pytest.raises(ConfigError, match='resume="auto"') as info:  # a fresh run on a directory with checkpoints
        fedrun.run({}, overrides)
    assert "--resume" not in str(info.value)
    with pytest.raises(TypeError, match="config must be a Config, a dict of sections"):  # not an AttributeError
        fedrun.run(None, overrides)


def test_a_refused_resume_from_the_cli_names_the_flags(tmp_path):
    run_dir = tmp_path / "r"
    fedrun_cli("train", "--quiet", f"run.dir={run_dir}", "run.rounds=2", *QUICK, check=True)
    proc = fedrun_cli("train", "--quiet", f"run.dir={run_dir}", "run.rounds=3", *QUICK)
    assert proc.returncode == 2 and "--resume auto" in proc.stderr, proc.stderr
    proc = fedrun_cli("train", "--quiet", f"run.dir={run_dir}", "run.rounds=3", *QUICK, "local.steps=3",
                      "--resume", "auto")
    assert proc.returncode == 2 and "--accept-changes local.steps" in proc.stderr, proc.stderr
    assert json.loads((run_dir / "runtime.json").read_text())["start_round"] == 0
    assert sys.executable and REPO.is_dir() and child_env()


def test_a_script_beside_a_clone_named_fedrun_imports_the_package_not_the_clones_folder(tmp_path):
    """A folder holding the clone as ``fedrun/`` puts the clone's folder first on a script's sys.path; without
    the clone's root ``__init__.py`` Python takes that folder for an empty namespace package (``module 'fedrun'
    has no attribute 'run'``) ahead of any installed fedrun. No PYTHONPATH: only the script's folder."""
    (tmp_path / "fedrun").symlink_to(REPO, target_is_directory=True)
    (tmp_path / "script.py").write_text("import fedrun\nfrom fedrun.config import load_config\n"
                                        "print(fedrun.__file__, callable(fedrun.run), load_config(None).run.rounds)\n")
    env = {k: v for k, v in child_env().items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, str(tmp_path / "script.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    where, runs, _ = proc.stdout.split()
    assert where == str(tmp_path / "fedrun" / "fedrun" / "__init__.py") and runs == "True", proc.stdout
