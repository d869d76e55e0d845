"""Import-path plugins (fedrun/plugins.py, docs/extending.md): every registry field accepts
``package.module:Attribute``; a bad plugin is one line naming the field and the module (exit status 2);
the checkpoint's resolved config records each plugin's source digest, and a resume refuses a missing or
changed plugin (the resume policy: a changed digest is a changed setting) without touching the
checkpoint, unless the change is accepted."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys

import h5py
import numpy as np
import pytest
import yaml
from helpers import LEAST_SQUARES, REPO

from fedrun.algorithms import get_algorithm
from fedrun.config import load_config
from fedrun.data import load_task
from fedrun.errors import ConfigError
from fedrun.federation.participation import make_participation
from fedrun.models import build_model
from fedrun.plugins import digests

EXAMPLE = {
    "data.name": "myfl.data:blobs", "model.name": "myfl.model:mlp",
    "algorithm.name": "myfl.algorithm:ClippedFedAvg", "participation.pattern": "myfl.participation:NoRepeat",
}


def forget_myfl() -> None:
    """Drop the imported myfl modules, as a new process would not have them."""
    for name in [m for m in sys.modules if m == "myfl" or m.startswith("myfl.")]:
        del sys.modules[name]


@pytest.fixture
def myfl(tmp_path, monkeypatch):
    """A private copy of examples/myfl on sys.path (the tests edit and remove it)."""
    root = tmp_path / "plugins"
    shutil.copytree(REPO / "examples" / "myfl", root / "myfl")
    monkeypatch.syspath_prepend(str(root))
    yield root / "myfl"
    forget_myfl()


def cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    from fedrun.cli import main

    code = main(argv)
    return code, capsys.readouterr().err.strip().splitlines()


def test_every_registry_resolves_an_import_path(myfl):
    cfg = load_config(None, [f"{k}={v}" for k, v in EXAMPLE.items()] + ["data.num_clients=8",
                                                                         "data.partition=natural",
                                                                         "participation.clients_per_round=3",
                                                                         "algorithm.clip=0.25"])
    assert get_algorithm(cfg.algorithm.name).__name__ == "ClippedFedAvg" and cfg.algorithm.hparams.clip == 0.25
    task = load_task(cfg.data, 0)
    assert task.x_train.shape == (8 * 40, 8) and set(task.groups) == set(range(8))
    assert sum(p.numel() for p in build_model(cfg.model.name, task.input_shape, task.num_classes).parameters()) \
        == 8 * 32 + 32 + 32 * 4 + 4
    pattern = make_participation(cfg.participation, 8, 0, 10)
    masks = [pattern.active(t) for t in range(10)]
    assert all(m.sum() == 3 for m in masks) and not any((a & b).any() for a, b in zip(masks, masks[1:], strict=False))
    source = hashlib.sha256((myfl / "algorithm.py").read_bytes()).hexdigest()
    assert cfg.plugin_digests()["algorithm.name"] == f"myfl.algorithm:ClippedFedAvg@{source}"
    assert set(cfg.plugin_digests()) == set(EXAMPLE)


@pytest.mark.parametrize("override, words", [
    ("algorithm.name=nosuchpkg.mod:Algo", ["algorithm.name", "cannot import module 'nosuchpkg.mod'"]),
    ("algorithm.name=myfl.algorithm:Nope", ["algorithm.name", "no attribute 'Nope'", "Algorithm"]),
    ("algorithm.name=myfl.model:mlp", ["algorithm.name", "expected a subclass of"]),
    ("algorithm.name=my-fl:X", ["algorithm.name", "package.module:Attribute"]),
    ("model.name=myfl.data:FEATURES", ["model.name", "myfl.data:FEATURES", "factory"]),
    ("model.name=myfl.data:blobs", ["model.name", "myfl.data:blobs raised AttributeError", "torch.nn.Module"]),
    ("data.name=myfl.model:mlp", ["data.name", "raised TypeError", "(cfg: DataConfig, seed: int) -> TaskData"]),
    ("participation.pattern=myfl.algorithm:ClippedFedAvg", ["participation.pattern", "Participation"]),
])
def test_a_bad_plugin_is_one_line_naming_the_field(myfl, tmp_path, capsys, override, words):
    code, err = cli(["train", "--quiet", f"run.dir={tmp_path / 'run'}", *LEAST_SQUARES, "participation.pattern=full",
                     "run.rounds=2", override], capsys)
    assert code == 2 and len(err) == 1 and all(w in err[0] for w in words), err
    assert not list((tmp_path / "run").glob("ckpt_*"))


OLD_HOOKS = """
import numpy as np

from fedrun.federation.participation import Participation, round_rng


class Rotating(Participation):
    stateful = True

    def __init__(self, num_clients, seed):
        super().__init__(num_clients, seed)
        self.offset = 0

    def _draw(self, t):
        self.offset = (self.offset + int(round_rng(self.seed, t).integers(self.num_clients))) % self.num_clients
        return np.arange(self.num_clients) == self.offset

    def _state(self):
        return {"offset": np.asarray(self.offset)}

    def _load_state(self, d):
        self.offset = int(d["offset"])
"""


def test_a_pattern_on_the_old_persistence_hooks_is_refused_before_anything_is_written(myfl, tmp_path, capsys):
    """A plugin still implementing ``_state`` / ``_load_state`` (hooks fedrun no longer calls) would resume with
    its state lost: it is one line naming it and the contract it must implement, exit status 2."""
    (myfl / "old_pattern.py").write_text(OLD_HOOKS)
    code, err = cli(["train", "--quiet", f"run.dir={tmp_path / 'run'}", *LEAST_SQUARES, "run.rounds=2",
                     "participation.pattern=myfl.old_pattern:Rotating"], capsys)
    assert code == 2 and len(err) == 1, err
    assert "participation.pattern: myfl.old_pattern:Rotating implements _state / _load_state," in err[0], err
    assert all(w in err[0] for w in ("state_dict() / load_state_dict(d)", "docs/extending.md")), err
    assert not list((tmp_path / "run").glob("ckpt_*"))


@pytest.mark.parametrize("override, message", [
    ("algorithm.clipp=1", "algorithm.clipp: unknown key (allowed: clip, global_lr)"),
    ("algorithm.clip=abc", "algorithm.clip: expected a number, got 'abc'"),
    ("algorithm.clip=-1", "algorithm.clip: expected a number > 0, got -1.0"),
])
def test_plugin_hyperparameters_are_validated_like_builtin_ones(myfl, override, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        load_config(None, [f"algorithm.name={EXAMPLE['algorithm.name']}", override])


def test_resume_refuses_a_missing_or_changed_plugin_and_leaves_the_checkpoint(myfl, tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", "--quiet", f"run.dir={run}", *[f"{k}={v}" for k, v in EXAMPLE.items()], "data.num_clients=6",
            "data.partition=natural", "participation.clients_per_round=2", "model.name=myfl.model:mlp",
            "eval.every=0", "local.strategy=sequential", "local.steps=2"]
    assert cli([*args, "run.rounds=2"], capsys)[0] == 0
    ckpt = run / "ckpt_00000002.h5"
    before = ckpt.read_bytes()
    resume = [*args, "run.rounds=4", "--resume", "auto"]

    with h5py.File(ckpt, "r") as f:
        recorded = yaml.safe_load(f["meta/config"][()].decode())["plugins"]
    assert recorded == load_config(None, args[2:]).plugin_digests() and len(recorded) == 4

    source = (myfl / "algorithm.py").read_text()
    (myfl / "algorithm.py").write_text(source + "\n# edited after the checkpoint\n")
    forget_myfl()
    code, err = cli(resume, capsys)
    assert code == 2 and len(err) == 1, err
    assert "settings that define the trajectory: plugins.algorithm.name" in err[0]
    assert "--accept-changes plugins.algorithm.name" in err[0]
    assert ckpt.read_bytes() == before and sorted(p.name for p in run.glob("ckpt_*")) == [ckpt.name]

    shutil.move(myfl, myfl.parent.parent / "elsewhere")  # the package is gone from the Python path
    forget_myfl()
    code, err = cli(resume, capsys)
    assert code == 2 and len(err) == 1 and "cannot import module 'myfl" in err[0], err
    assert ckpt.read_bytes() == before

    shutil.move(myfl.parent.parent / "elsewhere", myfl)  # the code as it was: the resume continues
    (myfl / "algorithm.py").write_text(source)
    forget_myfl()
    assert cli(resume, capsys)[0] == 0
    assert (run / "ckpt_00000004.h5").is_file()

    (myfl / "algorithm.py").write_text(source + "\n# a comment only\n")  # accepted and recorded
    forget_myfl()
    assert cli([*args, "run.rounds=5", "--resume", "auto", "--accept-changes", "plugins.algorithm.name"],
               capsys)[0] == 0
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert history[-1]["trajectory"] == ["plugins.algorithm.name"]


def test_digests_change_with_the_source_only(myfl):
    fields = {"model.name": "myfl.model:mlp", "data.name": "mnist5k"}
    first = digests(fields)
    assert list(first) == ["model.name"]
    assert digests(fields) == first
    (myfl / "model.py").write_text((myfl / "model.py").read_text() + "\n")
    assert digests(fields) == first  # the code this process imported
    forget_myfl()
    assert digests(fields) != first  # a new import digests the edited file
    assert np.all([v.startswith("myfl.model:mlp@") for v in digests(fields).values()])


def test_a_metrics_sink_plugin_writes_each_round_once_across_a_resume(myfl, tmp_path):
    """examples/myfl/csv_sink.py, named by metrics.observers: one row per round, the records' values, and a
    resumed run replaces the rows of the rounds it repeats."""
    import csv

    import fedrun

    run_dir = tmp_path / "run"
    base = [*LEAST_SQUARES, "participation.pattern=full", f"run.dir={run_dir}", "eval.every=2",
            "metrics.observers=[myfl.csv_sink:CsvSink]", "checkpoint.every=2"]
    fedrun.run({}, [*base, "run.rounds=3"])
    with (run_dir / "rounds.csv").open() as fh:  # round 3 is past the checkpoint of round 2: a resume repeats it
        assert [int(r["round"]) for r in csv.DictReader(fh)] == [1, 2, 3]
    (run_dir / "ckpt_00000003.h5").unlink()
    result = fedrun.run({}, [*base, "run.rounds=5"], resume="auto")
    with (run_dir / "rounds.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [int(r["round"]) for r in rows] == [1, 2, 3, 4, 5] == [r["round"] for r in records]
    assert [float(r["train_loss"]) for r in rows] == [r["train_loss"] for r in records]
    assert [r["test_accuracy"] for r in rows] == [str(r.get("test_accuracy", "")) for r in records]
    assert result.rounds_run == 3


def test_fedrun_run_takes_observer_instances(tmp_path):
    import fedrun
    from fedrun.metrics.observer import Observer

    class Recorder(Observer):
        def __init__(self) -> None:
            self.calls: list = []

        def on_start(self, provenance):
            self.calls.append(("start",))

        def on_round_end(self, record, arrays):
            self.calls.append(("round", record["round"]))
            return record["round"] == 3  # a sink may stop the run, like the callback

        def on_stop(self, finished):
            self.calls.append(("stop", finished))

    recorder = Recorder()
    result = fedrun.run({}, [*LEAST_SQUARES, "participation.pattern=full", "run.rounds=6"], write_files=False,
                        observers=[recorder])
    assert recorder.calls == [("start",), ("round", 1), ("round", 2), ("round", 3), ("stop", False)]
    assert result.stopped and result.rounds_run == 3


@pytest.mark.parametrize("value, words", [
    ("[myfl.model:mlp]", ["metrics.observers", "myfl.model:mlp", "subclass of fedrun.metrics.observer.Observer"]),
    ("[nosuchpkg.sinks:Sink]", ["metrics.observers", "cannot import module 'nosuchpkg.sinks'"]),
    ("[csv]", ["metrics.observers: expected a list of package.module:Class entries, got 'csv'"]),
])
def test_a_bad_metrics_sink_refuses_the_run_before_anything_is_written(myfl, tmp_path, capsys, value, words):
    code, err = cli(["train", "--quiet", f"run.dir={tmp_path / 'run'}", *LEAST_SQUARES, "participation.pattern=full",
                     "run.rounds=2", f"metrics.observers={value}"], capsys)
    assert code == 2 and len(err) == 1 and all(w in err[0] for w in words), err
    assert not (tmp_path / "run").exists()


def write_npz_clients(root, task):
    """examples/myfl/npz_clients.py's format, from an in-memory task with natural groups 0..N-1."""
    (root / "clients").mkdir(parents=True)
    sizes = np.bincount(task.groups)
    np.save(root / "sizes.npy", sizes)
    for i in range(len(sizes)):
        np.savez(root / "clients" / f"{i}.npz", x=task.x_train[task.groups == i], y=task.y_train[task.groups == i])
    np.savez(root / "test.npz", x=task.x_test, y=task.y_test, num_classes=task.num_classes)


def test_an_on_demand_dataset_plugin_trains_the_same_bits_as_the_same_arrays_held_in_memory(myfl, tmp_path,
                                                                                            monkeypatch):
    """examples/myfl/npz_clients.py (a ClientSource plugin, read per client each round) against the built-in
    ``arrays`` dataset of the same examples (resident, natural partition): the same final model, bit for bit,
    on 1 process and on 2 real ranks."""
    from helpers import final_models

    blobs = load_task(load_config(None, ["data.name=myfl.data:blobs", "data.num_clients=12"]).data, 0)
    order = np.argsort(blobs.groups, kind="stable")  # the arrays in client order: natural clients = groups
    arrays = tmp_path / "arrays"
    arrays.mkdir()
    for name, value in {"x_train": blobs.x_train[order], "y_train": blobs.y_train[order], "x_test": blobs.x_test,
                        "y_test": blobs.y_test, "groups": blobs.groups[order]}.items():
        np.save(arrays / f"{name}.npy", value)
    write_npz_clients(tmp_path / "npz", blobs)
    base = ["data.num_clients=12", "data.partition=natural", "participation.clients_per_round=5", "run.rounds=4",
            "local.steps=3", "local.batch_size=8", "local.strategy=sequential", "eval.every=2", "model.name=logistic"]
    monkeypatch.setenv("PYTHONPATH", str(myfl.parent))  # the ranks import the plugin too
    configs = {"resident": [*base, "data.name=arrays", f"data.root={arrays}"],
               "on_demand": [*base, "data.name=myfl.npz_clients:NpzClients", f"data.root={tmp_path / 'npz'}"]}
    one, two = final_models(0, tmp_path, configs), final_models(2, tmp_path, configs)
    assert np.array_equal(one["on_demand"], one["resident"]) and np.array_equal(two["on_demand"], one["resident"])
    assert np.abs(one["resident"]).max() > 0


@pytest.mark.parametrize("edit, words", [
    (lambda root: np.save(root / "sizes.npy", np.full(12, -1)), ["data.name=myfl.npz_clients:NpzClients",
                                                                      "num_examples", "non-negative integer"]),
    (lambda root: np.save(root / "sizes.npy", np.arange(5)), ["data.num_clients: expected 5", "got 12"]),
])
def test_a_bad_on_demand_source_is_one_line(myfl, tmp_path, capsys, edit, words):
    blobs = load_task(load_config(None, ["data.name=myfl.data:blobs", "data.num_clients=12"]).data, 0)
    write_npz_clients(tmp_path / "npz", blobs)
    edit(tmp_path / "npz")
    code, err = cli(["train", "--quiet", f"run.dir={tmp_path / 'run'}", "data.name=myfl.npz_clients:NpzClients",
                     f"data.root={tmp_path / 'npz'}", "data.num_clients=12", "model.name=logistic", "run.rounds=1"],
                    capsys)
    assert code == 2 and len(err) == 1 and all(w in err[0] for w in words), err
    assert not (tmp_path / "run").exists()
