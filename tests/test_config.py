"""Config validation: typed fields, unknown keys, one-line errors through the real CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import REPO, run_ranks

from fedrun.config import load_config
from fedrun.errors import ConfigError


@pytest.mark.parametrize("override, field", [
    ("run.rounds=0", "run.rounds"),
    ("run.rounds=ten", "run.rounds"),
    ("run.dtype=float16", "run.dtype"),
    ("run.bogus=1", "run.bogus"),
    ("local.lr=-1", "local.lr"),
    ("local.lr=[1]", "local.lr"),
    ("local.steps=2.5", "local.steps"),
    ("local.momentum=1.0", "local.momentum"),
    ("local.strategy=gpu", "local.strategy"),
    ("data.num_clients=0", "data.num_clients"),
    ("data.alpha=0", "data.alpha"),
    ("data.synthetic.shape=[3,32]", "data.synthetic.shape"),
    ("participation.clients_per_round=0", "participation.clients_per_round"),
    ("participation.probability=1.5", "participation.probability"),
    ("algorithm.name=fedsgd", "algorithm.name"),
    ("algorithm.global_lr=0", "algorithm.global_lr"),
    ("algorithm.momentum=0.9", "algorithm.momentum"),
    ("eval.every=-1", "eval.every"),
    ("checkpoint.keep=0", "checkpoint.keep"),
    ("nosection.key=1", "nosection"),
])
def test_bad_values_name_the_field(override, field):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    message = str(err.value)
    assert message.startswith(field) and "\n" not in message


def test_overrides_are_typed_and_applied():
    cfg = load_config(None, ["local.lr=1e-2", "data.synthetic.shape=[16]", "participation.probability=null",
                             "algorithm.name=fedavg", "algorithm.weighting=data_size"])
    assert cfg.local.lr == 0.01 and cfg.data.synthetic.shape == [16]
    assert cfg.participation.probability is None
    assert cfg.algorithm.hparams.weighting == "data_size"


def test_yaml_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(bad)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")


def test_cli_prints_one_line_without_traceback():
    proc = run_ranks(0, ["-m", "fedrun", "train", "--config", "configs/quickstart.yaml", "local.lr=abc"], check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "fedrun: error: local.lr: expected a number, got 'abc'"


@pytest.mark.mpi
def test_cli_error_under_mpiexec_is_reported_once():
    proc = run_ranks(2, ["-m", "fedrun", "train", "--config", "configs/quickstart.yaml", "run.unknown=1"], check=False)
    assert proc.returncode != 0
    assert proc.stderr.count("run.unknown: unknown key") == 1 and "Traceback" not in proc.stderr


def test_reading_a_config_imports_neither_torch_nor_the_algorithms():
    """Reading and checking a config is light (``fedrun config``, a sweep's validation on a login node): a
    built-in algorithm's hyperparameters live in fedrun.config.hparams. A fresh interpreter, so that no other
    test has imported them."""
    probe = ("import sys, fedrun.config\n"
             "cfg = fedrun.config.load_config('configs/quickstart.yaml', ['algorithm.name=fedadam', "
             "'algorithm.global_lr=0.5'])\n"
             "print(type(cfg.algorithm.hparams).__qualname__, cfg.algorithm.hparams.global_lr)\n"
             "print(sorted(m for m in ('torch', 'fedrun.algorithms') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=REPO).stdout.split("\n")
    assert out[0] == "FedAdamHparams 0.5", out[0]
    assert out[1] == "[]", f"reading a config imported {out[1]}"


def test_every_built_in_algorithm_takes_the_hyperparameters_the_config_checks():
    from fedrun.algorithms import ALGORITHMS
    from fedrun.config.hparams import HPARAMS

    assert {name: cls.Hparams for name, cls in ALGORITHMS.items()} == HPARAMS
