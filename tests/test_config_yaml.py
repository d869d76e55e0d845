"""Configs read as written (fedrun/config/yaml12.py, fedrun/config/loading.py): YAML 1.2 numbers, merge keys, section
overrides that merge, repeated settings printed, run.dir expanded; and a rendezvous that fails ends in one
line within its timeout (fedrun/runtime/world.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import LEAST_SQUARES, REPO, child_env, run_ranks

from fedrun.config import load_config, repeated_settings
from fedrun.config.yaml12 import parse_yaml
from fedrun.errors import ConfigError


def test_yaml_1_2_numbers_and_strings():
    assert parse_yaml("a: 010\nb: 0o10\nc: 1:30\nd: yes\ne: 1e-2\nf: 0x10\n") == {
        "a": 10, "b": 8, "c": "1:30", "d": "yes", "e": 0.01, "f": 16}
    cfg = load_config(None, ["run.rounds=010"])
    assert cfg.run.rounds == 10  # YAML 1.1 read it as the octal 8
    with pytest.raises(ConfigError, match="run.rounds: expected an integer, got '1:30'"):
        load_config(None, ["run.rounds=1:30"])  # YAML 1.1 read it as 90 (base 60)
    with pytest.raises(ConfigError, match="run.skip_nonfinite_clients: expected true or false, got 'yes'"):
        load_config(None, ["run.skip_nonfinite_clients=yes"])


def test_merge_keys_are_accepted_and_duplicates_still_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("eval: &e\n  every: 5\n  batch_size: 100\ncheckpoint:\n  every: 2\nlocal:\n  steps: 3\n"
                    "run:\n  <<: {rounds: 7, seed: 3}\n  seed: 4\n")
    cfg = load_config(path)
    assert (cfg.run.rounds, cfg.run.seed, cfg.eval.every, cfg.local.steps) == (7, 4, 5, 3)
    path.write_text("run:\n  <<: {rounds: 7}\n  seed: 1\n  seed: 2\n")
    with pytest.raises(ConfigError, match="line 4: duplicate key 'seed'"):
        load_config(path)


def test_a_section_override_merges_and_a_repeated_setting_is_named():
    cfg = load_config(None, ["local.lr=0.2", "local.batch_size=16", "local={steps: 5}"])
    assert (cfg.local.steps, cfg.local.lr, cfg.local.batch_size) == (5, 0.2, 16)  # the rest of local stays
    overrides = ["local.steps=2", "run.seed=1", "local={steps: 5, lr: 0.1}", "run.seed=1"]
    assert repeated_settings(overrides) == [
        "local.steps: 'local.steps=2' then 'local={steps: 5, lr: 0.1}', the last one counts",
        "run.seed: 'run.seed=1' then 'run.seed=1', the last one counts"]
    assert load_config(None, overrides).local.steps == 5


def test_run_dir_home_is_expanded_and_bad_forms_refused():
    assert load_config(None, ["run.dir=~/fedrun-runs/{name}"]).run_dir() == Path.home() / "fedrun-runs" / "run"
    for value, words in (('""', "empty would write into the current directory"), ("runs/{foo}", "KeyError"),
                         ("runs/{", "ValueError")):
        with pytest.raises(ConfigError, match="run.dir") as info:
            load_config(None, [f"run.dir={value}"])
        assert words in str(info.value)


def test_a_failed_rendezvous_is_one_line_within_the_timeout(tmp_path):
    """A rank whose store never answers (rank 1 of 2, MASTER_PORT with nothing behind it): one line naming
    the rendezvous and the timeout, status 1, no traceback, no torch C++ stack, soon after run.timeout_s."""
    env = {**child_env(), "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    env.pop("TORCH_CPP_LOG_LEVEL", None)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "fedrun", "train", "--quiet", "run.timeout_s=1",
                           f"run.dir={tmp_path / 'run'}"], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("fedrun[rank 1]: error: the rendezvous of the ranks failed within run.timeout_s=1 s")
    assert time.monotonic() - started < 60  # the interpreter's start-up and torch's import included


def test_impossible_run_settings_on_two_ranks_are_one_line(tmp_path):
    """run.timeout_s=0.001 printed a DistNetworkError traceback on 2 ranks and hung: now one line from rank
    0, status 2 (run.threads=100000 and run.seed=2^63 are refused alike: tests/test_fuzz_inputs.py)."""
    proc = run_ranks(2, ["-m", "fedrun", "train", "--quiet", *LEAST_SQUARES, f"run.dir={tmp_path}",
                         "run.timeout_s=0.001"], check=False, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("fedrun: error: run.timeout_s: expected a number of seconds in [1, 604800]")
