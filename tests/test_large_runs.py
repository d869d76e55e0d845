"""A large run that a hurried user cannot break (docs/scale.md, docs/reliability.md): the per-client
evaluation walks bounded windows instead of holding every client's test examples, the memory check counts
the model before it is built, a signal during start-up ends it at once, a closed stdout and Ctrl-C stop
after the round in progress with a checkpoint, and a requested stop is not reported as an error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO, child_env, federation

from fedrun.config import Config, DataConfig, EvalConfig, RunConfig, SyntheticFedproxConfig
from fedrun.data.synthetic_fedprox import SyntheticFedprox
from fedrun.federation import client_eval
from fedrun.federation.client_eval import ClientEval
from fedrun.runtime.world import World
from fedrun.state.choice import StorePlan, choose

MNIST = {"data": {"name": "mnist5k", "num_clients": 12, "alpha": 0.5, "client_test_fraction": 0.2},
         "model": {"name": "cnn_mnist"}, "run": {"seed": 3, "rounds": 1, "device": "cpu"},
         "local": {"steps": 2, "batch_size": 16, "strategy": "sequential"},
         "participation": {"pattern": "uniform", "clients_per_round": 4}, "eval": {"batch_size": 64}}


def test_evaluation_in_many_windows_equals_one_window_bit_for_bit(monkeypatch):
    """Windows of one batch (64 examples) cut clients' examples across windows and reload a resident
    dataset per window; every per-client figure must equal the one-window evaluation bit for bit."""
    fed = federation(MNIST)
    setup, state = fed.setup, fed.state
    args = (fed.global_model(), 0, state.strategy)
    one = setup.client_eval
    assert len(one.windows) == 1 and one.kept is not None
    whole = one.evaluate(*args, finetune_steps=1)
    monkeypatch.setattr(client_eval, "WINDOW_EXAMPLES", 64)
    many = ClientEval(setup.cfg, setup.world, one.source, setup.placement.blocks, setup.learner, setup.placement.block)
    assert len(many.windows) > 5 and many.kept is None
    cut = [(lo, hi) for lo, hi in many.windows if hi not in set(many.ends)]
    assert cut, "some client's examples must straddle a window's end"
    windowed = many.evaluate(*args, finetune_steps=1)
    assert set(windowed) == set(whole) == {"loss", "accuracy", "finetuned_loss", "finetuned_accuracy"}
    for name, value in whole.items():
        np.testing.assert_array_equal(windowed[name], value, err_msg=name)


class CountingSource(SyntheticFedprox):
    """Synthetic(1, 1) that records how many clients and test examples each load_test call brought in."""

    def __init__(self, *args) -> None:
        self.calls: list[tuple[int, int]] = []
        super().__init__(*args)
        self.calls.clear()  # the pooled test set and the probe of start-up are not the evaluation's

    def load_test(self, ids):
        x, y = super().load_test(ids)
        self.calls.append((len(ids), len(y)))
        return x, y


def test_on_demand_evaluation_never_holds_every_clients_test_examples(monkeypatch):
    """N = 200,000 on-demand clients with eval.clients unset: building the evaluation reads no client (it
    used to concatenate all 200,000 clients' test examples at start-up, 12 GB at N = 10^6). An evaluation of a
    4,000-client sample loads every sampled client exactly once, in windows of at most WINDOW_BYTES of
    inputs, and its traced memory peak stays at a few windows, not the sample's examples (24 MB)."""
    world = World(rank=0, size=1, local_rank=0, device=torch.device("cpu"), backend="none")
    data = DataConfig(name="synthetic_fedprox", num_clients=200_000,
                      synthetic_fedprox=SyntheticFedproxConfig(test_clients=5, max_examples=500))
    source = CountingSource(data, 0)
    cfg = Config(data=data, run=RunConfig(seed=0), eval=EvalConfig())
    # the model the evaluation runs: a small run's (logistic regression on the same features, float32)
    fed_model = federation({"data": {"name": "synthetic_fedprox", "num_clients": 50,
                                     "synthetic_fedprox": {"test_clients": 5}},
                            "model": {"name": "logistic"}, "run": {"rounds": 1, "device": "cpu"}})
    learner, block = fed_model.setup.learner, fed_model.setup.placement.block
    tracemalloc.start()
    everyone = ClientEval(cfg, world, source, [(0, 200_000)], learner, block)
    built_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert everyone.num_clients == 200_000 and source.calls == []  # nothing read at start-up
    assert built_peak < 40 * 2**20, built_peak  # ids, counts and ends of 200,000 clients: 4.8 MB

    monkeypatch.setattr(client_eval, "WINDOW_BYTES", 2**20)  # windows of 4,352 examples of 60 floats
    cfg = Config(data=data, run=RunConfig(seed=0), eval=EvalConfig(clients=4000))
    sample = ClientEval(cfg, world, source, [(0, 200_000)], learner, block)
    tracemalloc.start()
    out = sample.evaluate(fed_model.global_model(), 0, fed_model.state.strategy)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    window = client_eval.window_examples((60,), cfg.eval.batch_size)
    assert sample.total > 10 * window  # the sample is many windows
    assert sum(clients for clients, _ in source.calls) <= 4000 + len(sample.windows)  # a cut client twice at most
    assert max(examples for _, examples in source.calls) <= window + 2 * int(sample.counts.max())  # cut at both ends
    assert peak < min(8 * 2**20, sample.total * 60 * 4 / 3), (peak, sample.total)  # all at once: 4 bytes a value
    assert np.isfinite(out["loss"]).all() and out["loss"].shape == (4000,)


def fedrun(args: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fedrun", *args], cwd=REPO, env=child_env(), text=True,
                            stdout=kwargs.pop("stdout", subprocess.PIPE), stderr=subprocess.PIPE, **kwargs)


def test_a_model_too_large_for_memory_is_refused_before_it_is_built(tmp_path):
    """A plugin MLP of width 10^8 on MNIST (d = 7.95e10) is counted on the meta device and refused in one line
    naming model.name, status 2, before any of its 300 GB is allocated."""
    env = child_env()
    env["PYTHONPATH"] = f"{REPO / 'examples'}{os.pathsep}{env['PYTHONPATH']}"
    proc = subprocess.run([sys.executable, "-m", "fedrun", "train", "--quiet", f"run.dir={tmp_path / 'r'}",
                           "data.name=mnist5k", "model.name=myfl.model:mlp", "model.width=100000000"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "model.name=myfl.model:mlp" in lines[0] and "79,500,000,010 parameters" in lines[0], lines
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_during_start_up_ends_it_at_once_with_status_75_and_nothing_written(tmp_path, sig):
    """Start-up that takes minutes (a pooled test set of 30,000 generated clients): a stop signal after the
    first line ends it within seconds, status 75, one line that is not an error, and no file of the run
    (the run directory holds at most its lock)."""
    run_dir = tmp_path / "r"
    proc = fedrun(["train", f"run.dir={run_dir}", "data.name=synthetic_fedprox", "data.num_clients=100000",
                   "data.synthetic_fedprox.test_clients=30000", "model.name=logistic"])
    first = proc.stdout.readline()
    assert "fedrun: fedavg on synthetic_fedprox" in first, first
    time.sleep(1.0)  # well inside the pooled test set's generation
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10
    assert proc.returncode == 75, err
    assert err.strip() == (f"fedrun: stopped by {signal.Signals(sig).name} during start-up, before round 1; "
                           "nothing was written (run it again to start)"), err
    assert [p.name for p in run_dir.iterdir() if p.name != ".lock"] == []


QUICK = ["data.name=mnist5k", "data.num_clients=20", "model.name=cnn_mnist", "local.steps=25", "local.batch_size=32",
         "participation.clients_per_round=4", "run.log_every=1", "eval.every=0", "local.strategy=sequential"]


def test_a_closed_stdout_stops_after_the_round_with_a_checkpoint_and_status_75(tmp_path):
    """``fedrun train ... | head -2``: the progress line that meets the closed pipe is a stop request; the run
    finishes the next round, writes its checkpoint, exits 75 and says so on stderr (not as an error)."""
    run_dir = tmp_path / "r"
    head = subprocess.Popen(["head", "-2"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    proc = fedrun(["train", f"run.dir={run_dir}", "run.rounds=30", *QUICK], stdout=head.stdin)
    head.stdin.close()
    _, err = proc.communicate(timeout=300)
    head.wait()
    assert proc.returncode == 75, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedrun: stopped by a closed stdout after round ") and \
        "error" not in lines[0], err
    done = int(lines[0].split("after round ")[1].split(";")[0])
    assert done < 30 and (run_dir / f"ckpt_{done:08d}.h5").is_file() and not (run_dir / "result.json").exists()


def test_ctrl_c_stops_after_the_round_in_progress(tmp_path):
    """SIGINT while round k+1 trains (just after round k's progress line): the flag joins round k+1's reduce,
    so the checkpoint is the one after round k+1, not k+2; the line is not an error; status 75."""
    run_dir = tmp_path / "r"
    proc = fedrun(["train", f"run.dir={run_dir}", "run.rounds=30", *QUICK])
    while "round 2/" not in (line := proc.stdout.readline()):
        assert line, proc.stderr.read()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err
    assert "fedrun: Ctrl-C: finishing this round" in out
    assert err.strip().startswith("fedrun: stopped by a signal after round 3;") and "error" not in err, err
    assert [p.name for p in run_dir.glob("ckpt_*.h5")] == ["ckpt_00000003.h5"]


def test_auto_store_takes_disk_when_dense_checkpoints_would_dwarf_the_rows_a_run_touches(tmp_path):
    """docs/scale.md's example per rank: 500,000 clients of SCAFFOLD's c_i on the logistic model (d = 610),
    100 rounds of 100 clients: 1.14 GiB in memory fits 16 GiB, but each dense checkpoint would write all of it
    where the chain writes at most 10,000 rows; a small run stays in memory."""
    plan = StorePlan(rows=500_000, dim=610, vectors=1, scalars=0, itemsize=4, touched_rows=100 * 100)
    kind, why = choose("auto", plan, tmp_path, available=16 * 2**30)
    assert kind == "disk" and "each checkpoint would write all" in why
    small = StorePlan(rows=1_000, dim=610, vectors=1, scalars=0, itemsize=4, touched_rows=50)
    assert choose("auto", small, tmp_path, available=16 * 2**30)[0] == "memory"
    assert Path(tmp_path).is_dir()


def test_a_slow_checkpoint_write_says_so_and_then_how_long_it_took(capsys, monkeypatch):
    """The notice around a checkpoint write on rank 0: nothing for a quick write; for one past AFTER_S (3 s,
    here 0.05 s) a line while it is written and one with its duration after."""
    from fedrun.federation.cadence import SlowWriteNotice
    from fedrun.runtime.signals import StopSignals

    monkeypatch.setattr(SlowWriteNotice, "AFTER_S", 0.05)
    with SlowWriteNotice(10, True, StopSignals()):
        pass
    assert capsys.readouterr().out == ""
    with SlowWriteNotice(20, True, StopSignals()):
        time.sleep(0.5)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "fedrun: writing the checkpoint after round 20 (started 0.05 s ago) ..."
    assert lines[1].startswith("fedrun: checkpoint after round 20 written in 0.") and lines[1].endswith(" s")
