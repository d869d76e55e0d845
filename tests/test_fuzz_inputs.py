"""Fuzz of the inputs a user writes: config files, overrides and data files, generated from the config's own
fields and the data arrays' shapes as well as written by hand. Every case must end in ONE line on stderr
naming the field or file, exit status 2, no traceback, within its time (no hang), without a file changed
in the existing run it points at and no run directory (or lock) left where a refused new run would have
gone, and the whole suite within a bounded memory (the YAML alias bombs below expand to 10^9 and more
values; the malformed federated_h5 files declare up to 24 GB).

In-process (``fedrun.cli.main``), one real run made first; tests/test_bad_inputs.py covers the on-disk
formats (IDX, CIFAR, LEAF, checkpoints) the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import shutil
import signal
import types
import typing
from pathlib import Path
from typing import Literal

import numpy as np
from helpers import LEAST_SQUARES, file_digests, one_line_problems, peak_rss_gib, reset_peak_rss
from test_federated_h5_checks import CASES, FOUND_IN_TRAINING, h5_settings, malformed_pair

from fedrun.cli import main
from fedrun.config import Config
from fedrun.config.yaml12 import MAX_BYTES, MAX_DEPTH, parse_yaml
from fedrun.data.sizes import PER_CLIENT_BYTES, available_bytes

N, D = 6, 5
LS = [*LEAST_SQUARES, f"data.num_clients={N}", f"data.least_squares.dim={D}", "participation.clients_per_round=3",
      "run.rounds=2", "local.steps=2"]
CASE_SECONDS = 20  # a case that takes longer hangs
MAX_RSS_GIB = 3.0  # the peak memory while the fuzzed cases run in-process (torch and numpy take about 0.5 GiB)

# an alias bomb: 9 levels of 9 aliases each = 9^9 = 387 million values from about 300 bytes of text
BOMB = "&a [x,x,x,x,x,x,x,x,x]" + "".join(
    f", &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8))
BOMB_VALUE = f"[{BOMB}]"


# ------------------------------------------------------------------------------------------- generated


def _fields(cls: type, prefix: str = "") -> list[tuple[str, typing.Any]]:
    """(dotted name, type) of every leaf setting of the config."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        name = f"{prefix}{f.name}"
        if name == "algorithm":  # open-ended: the algorithm's own Hparams (hand-written cases below)
            continue
        if not f.init:  # not a key: derived when the config is built (a plugin's settings object)
            continue
        if dataclasses.is_dataclass(tp):
            out += _fields(tp, name + ".")
        else:
            out.append((name, tp))
    return out


def _bad_values(tp: typing.Any) -> list[str]:
    """Override values (YAML 1.2) that no setting of type ``tp`` accepts."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in args if a is not type(None)]
        return ["{a: [1]}"] if any(typing.get_origin(k) is list for k in kinds) else ["{a: 1}", "[[1]]"]
    if origin is Literal:
        return ["nosuch", BOMB_VALUE]
    if origin is list:
        return ["[1.5]" if args[0] is int else "[abc]", "{a: 1}", BOMB_VALUE]
    return {
        int: ["9223372036854775808", "1e20", "1:30", "[1]", BOMB_VALUE],
        float: [".nan", "1:30", "[1]", "-.inf"],
        str: ["[1, 2]", "{a: 1}", "a\x00b", BOMB_VALUE],
        bool: ["yes", "1", "null"],
    }[tp]


def _generated_overrides() -> list[tuple[str, str]]:
    """(override, the field its line must name) for every setting of the config."""
    cases = []
    for name, tp in _fields(Config):
        for value in _bad_values(tp):
            if name in ("run.dir",) and value == "a\x00b":
                continue  # run.dir is set by every case; its own cases are below
            cases.append((f"{name}={value}", name))
    return cases


def _generated_data(tmp: Path) -> list[tuple[Path, str]]:
    """(arrays file, the array its line must name): one fault per array, at a seeded random place."""
    rng = np.random.default_rng(26)
    good = {"x_train": rng.normal(size=(24, D)).astype(np.float32), "y_train": np.arange(24) % 3,
            "x_test": rng.normal(size=(6, D)).astype(np.float32), "y_test": np.arange(6) % 3,
            "groups": np.arange(24) % N}
    faults = {
        "x_train": [("nan", np.nan), ("inf", np.inf), ("-inf", -np.inf), ("complex", "complex"), ("text", "text")],
        "x_test": [("nan", np.nan), ("inf", np.inf), ("complex", "complex"), ("width", "width"), ("empty", "empty")],
        "y_train": [("neg", -1), ("huge", 10**9), ("half", 0.5), ("nan", np.nan), ("text", "text"), ("2d", "2d"),
                    ("short", "short")],
        "y_test": [("neg", -7), ("huge", 2**40), ("half", 2.5), ("nan", np.nan), ("text", "text"), ("short", "short")],
        "groups": [("half", 0.5), ("nan", np.nan), ("text", "text"), ("2d", "2d"), ("short", "short")],
    }
    out = []
    for name, kinds in faults.items():
        for kind, fault in kinds:
            arrays = {k: v.copy() for k, v in good.items()}
            a = arrays[name]
            if fault == "complex":
                a = a.astype(np.complex64) + 1j
            elif fault == "text":
                a = a.astype(str)
            elif fault == "width":
                a = rng.normal(size=(6, D + 1))
            elif fault == "empty":
                a, arrays["y_test"] = a[:0], arrays["y_test"][:0]
            elif fault == "2d":
                a = np.stack([a, a], axis=1)
            elif fault == "short":
                a = a[:-1]
            else:
                a = a.astype(np.float64)
                a.reshape(-1)[rng.integers(a.size)] = fault
            arrays[name] = a
            path = tmp / f"{name}_{kind}.npz"
            np.savez(path, **arrays)
            out.append((path, name))
    for kind in ("nan", "label"):  # the directory form (.npy files, memory-mapped)
        d = tmp / f"npy_{kind}"
        d.mkdir()
        arrays = {k: v.copy() for k, v in good.items()}
        if kind == "nan":
            arrays["x_train"][17, 2] = np.nan
        else:
            arrays["y_test"][4] = 3000000
        for k, v in arrays.items():
            np.save(d / f"{k}.npy", v)
        out.append((d, "x_train.npy" if kind == "nan" else "y_test.npy"))
    return out


# ----------------------------------------------------------------------------------------- hand-written


def _yaml_files(tmp: Path) -> list[tuple[Path, str]]:
    deep = "run:\n  name: " + "[" * 200 + "]" * 200 + "\n"
    files = {
        "bomb_name": (f"run:\n  name: {BOMB_VALUE}\n", "more than"),
        "bomb_algorithm": (f"algorithm:\n  name: {BOMB_VALUE}\n", "more than"),
        "bomb_corruption": (f"corruption:\n  kind: {BOMB_VALUE}\n", "more than"),
        "bomb_section": (f"run:\n  name: x\nlocal: {BOMB_VALUE}\n", "more than"),
        "deep": (deep, f"nested more than {MAX_DEPTH}"),
        "deep_flow": ("a: " + "{b: " * 60 + "1" + "}" * 60 + "\n", "nested more than"),
        "recursive_alias": ("a: &a [*a]\n", "recursive_alias.yaml"),
        "huge": ("run:\n  name: " + "x" * (MAX_BYTES + 10) + "\n", "more than"),
        "nul": ("run:\n  name: a\x00b\n", "NUL"),
        "mixed_keys": ("run:\n  1: 2\n  rounds: 3\n", "key 1 is not a name"),
        "bool_key": ("true: 1\n", "key True is not a name"),
        "base60": ("run:\n  rounds: 1:30\n", "run.rounds"),
        "seed_2_63": ("run:\n  seed: 9223372036854775808\n", "run.seed"),
        "seed_neg_huge": ("run:\n  seed: -99999999999999999999\n", "run.seed"),
        "steps_float": ("local:\n  steps: 1e20\n", "local.steps"),
        "steps_big": ("local:\n  steps: 100000000\n", "local.steps"),
        "batch_big": ("local:\n  batch_size: 4294967296\n", "local.batch_size"),
        "threads": ("run:\n  threads: 100000\n", "run.threads"),
        "threads_cpus": ("run:\n  threads: 4000\n", "run.threads"),
        "timeout_tiny": ("run:\n  timeout_s: 0.001\n", "run.timeout_s"),
        "timeout_huge": ("run:\n  timeout_s: 1e300\n", "run.timeout_s"),
        "dir_empty": ("run:\n  dir: ''\n", "run.dir"),
        "mlflow_empty": ("metrics:\n  mlflow: ''\n", "metrics.mlflow"),  # a value left out, not null
        "state_dir_blank": ("state:\n  dir: ' '\n", "state.dir"),
        "dir_format": ("run:\n  dir: runs/{foo}\n", "run.dir"),
        "dir_format_index": ("run:\n  dir: runs/{0}\n", "run.dir"),
        "dir_format_bad": ("run:\n  dir: 'runs/{'\n", "run.dir"),
        "dup_after_merge": ("run:\n  <<: {rounds: 2}\n  seed: 1\n  seed: 2\n", "duplicate key 'seed'"),
        "merge_bad_value": ("eval: &e {every: 0}\nrun:\n  <<: {rounds: abc}\n", "run.rounds"),
        "merge_unknown": ("eval: &e {every: 0}\nrun:\n  <<: *e\n", "run.every"),
        "date": ("run:\n  name: 2020-01-01\n", "run.name"),
        "yes_bool": ("run:\n  skip_nonfinite_clients: yes\n", "run.skip_nonfinite_clients"),
        "tab_indent": ("run:\n\trounds: 3\n", "tab_indent.yaml"),
        "num_clients_1e8": ("data:\n  num_clients: 100000000\n", "data.num_clients"),
        "list_top": ("- run\n", "top level"),
        "string_top": ("just text\n", "top level"),
    }
    out = []
    for name, (text, needle) in files.items():
        path = tmp / f"{name}.yaml"
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        out.append((path, needle))
    return out


HAND_OVERRIDES = [
    ("run.seed=9223372036854775808", "run.seed"),
    ("run.dir=runs/{foo}", "run.dir"),
    ("local.steps=1e20", "local.steps"),
    ("run.timeout_s=1e300", "run.timeout_s"),
    ("run.timeout_s=0.001", "run.timeout_s"),
    ("run.threads=100000", "run.threads"),
    ("checkpoint.full_every=-1", "checkpoint.full_every"),
    ("run.name=a\x00b", "run.name"),
    # more clients than this node's memory holds at the measured cost per client (1e8 here: 32 GB)
    (f"data.num_clients={max(10**8, 2 * (available_bytes() or 0) // PER_CLIENT_BYTES)}", "data.num_clients"),
    ("local={steps: 0}", "local.steps"),
    ("algorithm.global_lr=1:30", "algorithm.global_lr"),
    ("algorithm={name: scaffold, global_lr: .nan}", "algorithm.global_lr"),
    ("algorithm.name=" + BOMB_VALUE, "more than"),
    ("algorithm.name=fed\x00avg", "algorithm.name"),
    ("local={nosuch: 1}", "local.nosuch"),
    ("run={1: 2}", "key 1 is not a name"),
    ("run.rounds=" + "[" * 100 + "]" * 100, "nested more than"),
    ("run.name=" + BOMB_VALUE, "more than"),
    ("data.synthetic.shape=" + BOMB_VALUE, "more than"),
    ("local.lr=" + "9" * 5000, "local.lr"),
    ("run.name=" + "x" * (MAX_BYTES + 1), "more than"),
    # a path left empty is not the default; out-of-range counts are refused, not clamped; paths the OS refuses
    ("state.dir=", "state.dir"),
    ("metrics.mlflow=", "metrics.mlflow"),
    ("state.dir=''", "state.dir"),
    ("eval.clients=1e12", "eval.clients"),
    ("eval.clients=1000000000000", "eval.clients"),
    ("state.dir=/tmp/" + "a" * 5300, "state.dir"),
    ("run.dir=/tmp/" + "/".join(["b" * 200] * 30), "run.dir"),
]


# ------------------------------------------------------------------------------------------- driver


def _unless_set(path: Path, overrides: list[str]) -> list[str]:
    """``overrides`` less those of settings config file ``path`` gives (an override would win over it)."""
    try:
        data = parse_yaml(path.read_text())
    except Exception:  # noqa: BLE001 - a file that does not parse keeps every override
        return overrides
    given, stack = set(), [("", data)] if isinstance(data, dict) else []
    while stack:
        prefix, node = stack.pop()
        for k, v in node.items():
            (stack.append((f"{prefix}{k}.", v)) if isinstance(v, dict) else given.add(f"{prefix}{k}"))
    return [item for item in overrides if item.split("=", 1)[0] not in given]


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang


def _in_process(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
    except _Hang:
        code, err = "hang", io.StringIO(f"no answer within {CASE_SECONDS} s")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, err.getvalue()


def test_fuzzed_configs_overrides_and_data_give_one_line_and_status_2(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # federated_h5 indexes
    run = tmp_path / "run"
    assert _in_process(["train", "--quiet", f"run.dir={run}", *LS]) == (0, "")
    before = file_digests(run)
    inputs, fresh = tmp_path / "inputs", tmp_path / "fresh"
    inputs.mkdir()
    existing = ["train", "--quiet", *LS, f"run.dir={run}", "--resume", "auto"]  # refused before the resume
    cases: list[tuple[str, list[str], str]] = []
    cases += [("override", [*existing, item], field) for item, field in _generated_overrides()]
    # valid configs refused later (memory, CPUs, a rule), and files: in a new run directory
    new = ["train", "--quiet", *LS, f"run.dir={fresh}"]
    cases += [("override", [*new, item], field) for item, field in HAND_OVERRIDES]
    cases += [("yaml", ["train", "--quiet", "--config", str(path), *_unless_set(path, [*LS, f"run.dir={fresh}"])],
               needle) for path, needle in _yaml_files(inputs)]
    cases.append(("override", [*new, "local.steps=1000000", "local.batch_size=1000000",
                               "data.least_squares.rows_per_client=1000000"], "local.steps"))
    cases += [("data", ["train", "--quiet", *LS, "data.name=arrays", f"data.root={path}", "model.name=logistic",
                        "run.dtype=float32", "data.partition=iid", f"run.dir={fresh}"], needle)
              for path, needle in _generated_data(inputs)]
    (inputs / "a_file").write_text("not a directory")
    cases += [("state", [*new, "state.store=disk", f"state.dir={inputs / 'a_file'}"], "state.dir")]
    for case in CASES:  # malformed TensorFlow-Federated files, refused at start-up (tests/test_federated_h5_checks.py)
        if case not in FOUND_IN_TRAINING:
            pair = inputs / f"h5_{len(cases)}"
            pair.mkdir()
            name, client, _ = malformed_pair(pair, case)
            cases.append(("federated_h5", [*new, *h5_settings(pair)], f"{pair / name}: client {client!r}"))
    cases += [("command", ["train", "--config", "a.yaml", "--config", "b.yaml"], "--config given twice"),
              ("command", ["train", "--resume", "auto", "--resume", "auto"], "--resume given twice")]
    failures = []
    reset_peak_rss()  # the peak of the fuzzed cases, not of the tests that ran before in this process
    for category, argv, needle in cases:
        code, err = _in_process(argv)
        problems = one_line_problems(code, err, needle)
        if len(err.strip()) > 1000:
            problems.append(f"a line of {len(err.strip())} characters")
        after = file_digests(run)
        if after != before:
            problems.append("changed the existing run")
            before = after
        if fresh.exists():  # a refused run writes nothing: no run directory, no .lock
            problems.append(f"left {sorted(p.name for p in fresh.iterdir()) or 'the run directory'}")
            shutil.rmtree(fresh)
        if problems:
            failures.append(f"[{category}] {argv[-1][:80]!r}: {', '.join(problems)}: {err[-500:]!r}")
    peak = peak_rss_gib()
    print(f"\nfuzzed inputs: {len(cases)}; peak memory while they ran {peak:.2f} GiB")
    assert len(cases) >= 150
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures)
    assert peak < MAX_RSS_GIB, f"peak memory {peak:.2f} GiB"


def test_a_zero_local_lr_that_an_algorithm_divides_by_is_bad_input_not_divergence(tmp_path):
    """SCAFFOLD's Option II control variates and the memory algorithms' paper form divide by eta_l: with
    local.lr=0 they were NaN, reported as divergence (status 3, "lower the learning rates")."""
    for algorithm in (["algorithm.name=scaffold"], ["algorithm.name=mifa", "algorithm.form=paper"]):
        code, err = _in_process(["train", "--quiet", *LS, f"run.dir={tmp_path / algorithm[0]}", "local.lr=0",
                                 *algorithm])
        assert code == 2 and len(err.strip().splitlines()) == 1 and "local lr" in err, err
        assert not list((tmp_path / algorithm[0]).glob("ckpt_*"))
