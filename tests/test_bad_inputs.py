"""Bad-input fuzz through the real CLI: every malformed input gives ONE line on stderr naming the file or
field, exit status 2, no traceback, and leaves an existing run's checkpoints (and files) untouched.

Most cases call ``fedrun.cli.main(argv)`` in this process (fast); every SUBPROCESS_EVERY-th case also
runs as ``python -m fedrun ...`` in a fresh process. Categories: config (YAML files, overrides, command
line), least-squares .npz, participation traces, IDX, CIFAR pickles, LEAF JSON, checkpoints.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import pickle
import shutil
import struct
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import LEAST_SQUARES, REPO, child_env, file_digests, one_line_problems, run_ranks

from fedrun.cli import main

SUBPROCESS_EVERY = 12
N, D = 6, 5
LS = [
    *LEAST_SQUARES,
    f"data.num_clients={N}",
    f"data.least_squares.dim={D}",
    "participation.clients_per_round=3",
    "run.rounds=2",
    "local.steps=2",
]


# ------------------------------------------------------------------------------------------ inputs


def _idx(path: Path, code: int, arr: np.ndarray, gz: bool = False) -> None:
    dtype = {0x08: ">u1", 0x0D: ">f4"}[code]
    data = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.astype(dtype).tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)


def _mnist_dir(base: Path) -> Path:
    d = base / "mnist"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("t10k", 6)):
        _idx(d / f"{split}-images-idx3-ubyte", 0x08, rng.integers(0, 255, (n, 28, 28)))
        _idx(d / f"{split}-labels-idx1-ubyte", 0x08, np.arange(n) % 10)
    return d


def _cifar_batch(n: int = 4, override: dict | None = None) -> dict:
    batch = {b"data": np.zeros((n, 3072), np.uint8), b"labels": [i % 10 for i in range(n)]}
    batch.update(override or {})
    return batch


def _cifar_dir(base: Path) -> Path:
    d = base / "cifar-10-batches-py"
    d.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (d / name).write_bytes(pickle.dumps(_cifar_batch(), protocol=2))
    return d


def _leaf_doc(users: int = 2, n: int = 3) -> dict:
    names = [f"u{i}" for i in range(users)]
    return {
        "users": names,
        "num_samples": [n] * users,
        "user_data": {u: {"x": [[0.5] * 784] * n, "y": [1] * n} for u in names},
    }


def _leaf_dir(base: Path) -> Path:
    d = base / "femnist" / "data"
    for split in ("train", "test"):
        (d / split).mkdir(parents=True)
        (d / split / "part.json").write_text(json.dumps(_leaf_doc()))
    return d


class _Evil:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def _build_cases(tmp: Path, fresh: Path, ckpt: Path) -> list[tuple[str, list[str], str]]:
    """(category, argv, a string the error line must contain: the file or field it names).

    Training cases run in the empty directory ``fresh`` (with ``--resume auto`` they start afresh, so the
    input's own check is reached, not the resume policy); ``--resume PATH`` cases resume ``ckpt``."""
    cases: list[tuple[str, list[str], str]] = []
    train = ["train", "--quiet", f"run.dir={fresh}"]

    # -- config: overrides with wrong types, ranges and unknown keys
    for override, field in [
        ("run.rounds=abc", "run.rounds"),
        ("run.rounds=1.5", "run.rounds"),
        ("run.rounds=0", "run.rounds"),
        ("run.seed=-3", "run.seed"),
        ("run.dtype=float16", "run.dtype"),
        ("run.device=tpu", "run.device"),
        ("run.threads=0", "run.threads"),
        ("run.timeout_s=0", "run.timeout_s"),
        ("run.timeout_s=soon", "run.timeout_s"),
        ("run.log_every=0", "run.log_every"),
        ("run.skip_nonfinite_clients=maybe", "run.skip_nonfinite_clients"),
        ("run.name=[1, 2]", "run.name"),
        ("run.nosuch=1", "run.nosuch"),
        ("nosuch.key=1", "nosuch"),
        ("run=5", "run"),
        ("data.num_clients=0", "data.num_clients"),
        ("data.num_clients=six", "data.num_clients"),
        ("data.alpha=0", "data.alpha"),
        ("data.test_fraction=1.5", "data.test_fraction"),
        ("data.name=nosuch", "data.name"),
        ("data.synthetic.shape=[0]", "data.synthetic.shape"),
        ("data.synthetic.shape=abc", "data.synthetic.shape"),
        ("data.least_squares.dim=0", "data.least_squares.dim"),
        ("data.least_squares.noise=-1", "data.least_squares.noise"),
        ("data.partition=nosuch", "data.partition"),
        ("model.name=nosuch", "model.name"),
        ("local.steps=0", "local.steps"),
        ("local.batch_size=0", "local.batch_size"),
        ("local.lr=-1", "local.lr"),
        ("local.lr=abc", "local.lr"),
        ("local.lr_schedule=cosine", "local.lr_schedule"),
        ("local.lr_decay=0", "local.lr_decay"),
        ("local.momentum=1", "local.momentum"),
        ("local.grad_clip=-1", "local.grad_clip"),
        ("local.strategy=gpu", "local.strategy"),
        ("local.epochs=0", "local.epochs"),
        ("participation.pattern=nosuch", "participation.pattern"),
        ("participation.clients_per_round=0", "participation.clients_per_round"),
        ("participation.clients_per_round=100", "participation.clients_per_round"),
        ("participation.probability=2", "participation.probability"),
        ("participation.sine_period=0", "participation.sine_period"),
        ("participation.markov_p_off=0", "participation.markov_p_off"),
        ("eval.every=-1", "eval.every"),
        ("eval.batch_size=0", "eval.batch_size"),
        ("checkpoint.every=-1", "checkpoint.every"),
        ("checkpoint.keep=0", "checkpoint.keep"),
        ("algorithm.name=nosuch", "algorithm.name"),
        ("algorithm.nosuch=1", "algorithm.nosuch"),
        ("algorithm.name=[1]", "algorithm.name"),
        ("noequals", "noequals"),
        ("=5", "=5"),
        ("run..x=1", "run..x"),
        # non-finite numbers pass every range check unless refused as such
        ("local.lr=.inf", "local.lr"),
        ("local.lr=1e999", "local.lr"),
        ("local.lr=.nan", "local.lr"),
        ("run.timeout_s=.inf", "run.timeout_s"),
        ("data.least_squares.noise=.inf", "data.least_squares.noise"),
        ("data.alpha=-.inf", "data.alpha"),
        ("algorithm.global_lr=.inf", "algorithm.global_lr"),
        ("participation.sine_period=.inf", "participation.sine_period"),
        # a section given a value, before or after one of its keys: named against its own override
        ("run=5", "'run=5'"),
        ("local=[1]", "'local=[1]'"),
        ("data=abc", "'data=abc'"),
        # sizes far beyond any node's memory: refused before anything is allocated
        ("data.num_clients=1000000000000", "data.num_clients"),
        ("data.least_squares.dim=1000000000000", "data.least_squares.dim"),
    ]:
        # --resume auto: the field's own check is reached, not the refusal to reuse the run's directory
        cases.append(("config", [*train, *LS, override, "--resume", "auto"], field))
    cases.append(("config", [*train, "run=5", *LS, "--resume", "auto"], "'run=5'"))  # before run.* overrides
    synthetic = ["data.name=synthetic", "model.name=linear"]
    for shape in ("[100000,100000,100]", "[1000000000000]"):
        cases.append(("config", [*train, *LS, *synthetic, f"data.synthetic.shape={shape}"], "data.synthetic.shape"))
    cases.append(("config", [*train, *LS, *synthetic, "data.synthetic.examples_per_client=100000000000"],
                  "data.synthetic.examples_per_client"))
    # overrides may follow options (--quiet, --resume): a bad one there is still named as a field
    cases.append(("config", ["train", f"run.dir={fresh}", "--quiet", *LS, "--resume", "auto", "local.lr=abc"],
                  "local.lr"))
    cases.append(("config", ["train", "--quiet", f"run.dir={fresh}", *LS, "--accept-changes", "local.lr"],
                  "--accept-changes"))
    for name, text, needle in [
        ("bad_yaml", "run: [1, 2\n", "bad_yaml.yaml"),
        ("list_top", "- 1\n- 2\n", "list_top.yaml"),
        ("scalar_section", "run: 5\n", "run"),
        ("unknown_section", "runn:\n  rounds: 3\n", "runn"),
        ("wrong_type", "local:\n  lr: [1, 2]\n", "local.lr"),
        ("algo_list", "algorithm: [1]\n", "algorithm"),
        ("binary", "\x00\x01\x02garbage: [", "binary.yaml"),
        ("nested_unknown", "data:\n  synthetic:\n    nope: 1\n", "data.synthetic.nope"),
        # a key twice in one mapping: YAML keeps the last one silently
        ("dup_key", "run:\n  rounds: 3\n  rounds: 4\n", "duplicate key 'rounds'"),
        ("dup_section", "run:\n  rounds: 3\nlocal:\n  lr: 0.1\nrun:\n  seed: 2\n", "duplicate key 'run'"),
        ("dup_nested", "data:\n  synthetic:\n    noise: 1\n    noise: 2\n", "line 4"),
        ("dup_algorithm", "algorithm:\n  name: fedavg\n  name: scaffold\n", "duplicate key 'name'"),
        ("inf_value", "local:\n  lr: .inf\n", "local.lr"),
        ("not_utf8", "\udcff", "not_utf8.yaml"),
    ]:
        path = tmp / f"{name}.yaml"
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
        cases.append(("config", ["train", "--quiet", "--config", str(path), f"run.dir={fresh}", *LS], needle))
    cases.append(("config", [*train, "--config", str(tmp / "missing.yaml")], "missing.yaml"))
    (tmp / "config_dir.yaml").mkdir()
    cases.append(("config", [*train, "--config", str(tmp / "config_dir.yaml")], "is a directory"))
    cases.append(("config", [*train, *LS, "data.least_squares.file={x: 1, x: 2}"], "duplicate key 'x'"))
    # the command line itself
    for argv, needle in [
        (["bogus"], "bogus"),
        (["train", "--resume"], "--resume"),
        (["inspect"], "checkpoint"),
        (["participation", "--rounds", "abc"], "--rounds"),
        (["train", "--bogus"], "--bogus"),
    ]:
        cases.append(("config", argv, needle))

    # -- least-squares .npz problems
    good_a, good_b = np.ones((N, 4, D)), np.ones((N, 4))
    ls_cases = {
        "a_2d": {"A": np.ones((N, D)), "b": good_b},
        "a_wrong_n": {"A": np.ones((N - 1, 4, D)), "b": np.ones((N - 1, 4))},
        "b_shape": {"A": good_a, "b": np.ones((N, 3))},
        "a_bool": {"A": good_a > 0, "b": good_b},
        "a_str": {"A": np.full((N, 4, D), "x"), "b": good_b},
        "a_object": {"A": good_a.astype(object), "b": good_b},
        "b_object": {"A": good_a, "b": good_b.astype(object)},
        "x0_shape": {"A": good_a, "b": good_b, "x0": np.ones(D + 1)},
        "x0_object": {"A": good_a, "b": good_b, "x0": np.ones(D).astype(object)},
        "no_a": {"b": good_b},
        "no_b": {"A": good_a},
        "a_nan": {"A": np.full((N, 4, D), np.nan), "b": good_b},
        "a_complex": {"A": good_a.astype(complex), "b": good_b},
        "zero_rows": {"A": np.ones((N, 0, D)), "b": np.ones((N, 0))},
        "a_scalar": {"A": np.float64(1.0), "b": good_b},
        "x0_str": {"A": good_a, "b": good_b, "x0": np.array(["a"] * D)},
    }
    for name, arrays in ls_cases.items():
        path = tmp / f"ls_{name}.npz"
        np.savez(path, **arrays)
        cases.append(("npz", [*train, *LS, f"data.least_squares.file={path}", "--resume", "auto"], path.name))
    (tmp / "ls_text.npz").write_text("not a zip file\n")
    np.savez(tmp / "ls_trunc.npz", A=good_a, b=good_b)
    (tmp / "ls_trunc.npz").write_bytes((tmp / "ls_trunc.npz").read_bytes()[:200])
    (tmp / "ls_dir.npz").mkdir()
    np.save(tmp / "ls_single.npy", good_a)
    (tmp / "ls_single.npy").rename(tmp / "ls_single.npz")
    (tmp / "ls_empty.npz").write_bytes(b"")
    (tmp / "ls_pickle.npz").write_bytes(pickle.dumps({"A": good_a, "b": good_b}))
    for name in ("ls_text.npz", "ls_trunc.npz", "ls_dir.npz", "ls_missing.npz", "ls_single.npz", "ls_empty.npz",
                 "ls_pickle.npz"):
        cases.append(("npz", [*train, *LS, f"data.least_squares.file={tmp / name}", "--resume", "auto"], name))
    for name, needle in (("ls_dir.npz", "is a directory"), ("ls_text.npz", "not a .npz archive"),
                         ("ls_pickle.npz", "not a .npz archive"), ("ls_single.npz", "single .npy array")):
        cases.append(("npz", [*train, *LS, f"data.least_squares.file={tmp / name}"], needle))

    # -- participation traces (through train and through the participation command)
    traces = {
        "wrong_n.npy": np.ones((10, N + 1), bool),
        "short.npy": np.ones((1, N), bool),
        "flat.npy": np.ones(N, bool),
        "twos.npy": np.full((10, N), 2),
        "half.npy": np.full((10, N), 0.5),
        "object.npy": np.ones((10, N)).astype(object),
        "text.npy": np.full((10, N), "x"),
    }
    for name, arr in traces.items():
        np.save(tmp / f"trace_{name}", arr, allow_pickle=True)
    (tmp / "trace_ragged.csv").write_text("1,0,1,0,1,0\n1,0\n")
    (tmp / "trace_words.csv").write_text("1,0,1,0,1,yes\n" * 10)
    (tmp / "trace_empty.csv").write_text("")
    (tmp / "trace_bad.npy").write_bytes(b"\x93NUMPY garbage")
    (tmp / "trace_plain.txt").write_text("1 0 1\n")
    (tmp / "trace_dir.npy").mkdir()
    (tmp / "trace_text.npy").write_text("1,0,1,0,1,0\n")
    names = [f"trace_{n}" for n in traces] + [
        "trace_dir.npy",
        "trace_text.npy",
        "trace_ragged.csv",
        "trace_words.csv",
        "trace_empty.csv",
        "trace_bad.npy",
        "trace_plain.txt",
        "trace_missing.npy",
    ]
    for name in names:
        over = ["participation.pattern=trace", f"participation.trace={tmp / name}"]
        cases.append(("trace", [*train, *LS, *over, "--resume", "auto"], name))
        cases.append(("trace", ["participation", *LS, *over, "--rounds", "2"], name))

    # -- IDX (MNIST)
    def idx_case(name: str, corrupt) -> None:
        root = tmp / f"idx_{name}"
        d = _mnist_dir(root)
        needle = corrupt(d)
        cases.append(
            (
                "idx",
                [*train, *LS, "data.name=mnist", f"data.root={root}", "model.name=linear", "--resume", "auto"],
                needle,
            )
        )

    def put(name: str, data: bytes):
        def f(d: Path) -> str:
            (d / name).write_bytes(data)
            return name

        return f

    def edit(name: str, fn):
        def f(d: Path) -> str:
            (d / name).write_bytes(fn((d / name).read_bytes()))
            return name

        return f

    idx_case("magic", edit("train-images-idx3-ubyte", lambda b: b"\x12\x34" + b[2:]))
    idx_case("truncated", edit("train-images-idx3-ubyte", lambda b: b[:-100]))
    idx_case("header", edit("train-labels-idx1-ubyte", lambda b: b[:6]))
    idx_case("tiny", put("t10k-labels-idx1-ubyte", b"\x00\x00"))
    idx_case("empty", put("t10k-images-idx3-ubyte", b""))
    idx_case("trailing", edit("t10k-labels-idx1-ubyte", lambda b: b + b"\x00\x00"))
    idx_case(
        "ndim", lambda d: (_idx(d / "train-labels-idx1-ubyte", 0x08, np.zeros((12, 2))), "train-labels-idx1-ubyte")[1]
    )
    idx_case("count", lambda d: (_idx(d / "train-labels-idx1-ubyte", 0x08, np.zeros(11)), "train-labels-idx1-ubyte")[1])
    idx_case(
        "dtype",
        lambda d: (_idx(d / "train-images-idx3-ubyte", 0x0D, np.zeros((12, 28, 28))), "train-images-idx3-ubyte")[1],
    )

    def bad_gzip(d: Path) -> str:
        (d / "t10k-images-idx3-ubyte").unlink()
        (d / "t10k-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b\x08\x00garbage-not-deflate")
        return "t10k-images-idx3-ubyte.gz"

    def truncated_gzip(d: Path) -> str:
        data = gzip.compress((d / "train-labels-idx1-ubyte").read_bytes())
        (d / "train-labels-idx1-ubyte").unlink()
        (d / "train-labels-idx1-ubyte.gz").write_bytes(data[: len(data) // 2])
        return "train-labels-idx1-ubyte.gz"

    def missing(d: Path) -> str:
        (d / "t10k-labels-idx1-ubyte").unlink()
        return "t10k-labels-idx1-ubyte"

    idx_case("gzip", bad_gzip)
    idx_case("gzip_trunc", truncated_gzip)
    idx_case("missing", missing)
    cases.append(
        ("idx", [*train, *LS, "data.name=mnist", f"data.root={tmp / 'idx_none'}", "--resume", "auto"], "idx_none")
    )

    # -- CIFAR-10 pickles
    def cifar_case(name: str, payload: bytes, file: str = "data_batch_3") -> None:
        root = tmp / f"cifar_{name}"
        d = _cifar_dir(root)
        if payload == b"<missing>":
            (d / file).unlink()
        else:
            (d / file).write_bytes(payload)
        cases.append(
            (
                "cifar",
                [*train, *LS, "data.name=cifar10", f"data.root={root}", "model.name=linear", "--resume", "auto"],
                file,
            )
        )

    good = pickle.dumps(_cifar_batch(), protocol=2)
    cifar_case("garbage", b"this is not a pickle")
    cifar_case("truncated", good[: len(good) // 2])
    cifar_case("empty", b"")
    cifar_case("evil", pickle.dumps({b"data": _Evil()}))
    cifar_case("no_labels", pickle.dumps({b"data": np.zeros((4, 3072), np.uint8)}))
    cifar_case("shape", pickle.dumps(_cifar_batch(override={b"data": np.zeros((4, 100), np.uint8)})))
    cifar_case("float", pickle.dumps(_cifar_batch(override={b"data": np.zeros((4, 3072), np.float32)})))
    cifar_case("label_range", pickle.dumps(_cifar_batch(override={b"labels": [0, 1, 2, 10]})))
    cifar_case("label_count", pickle.dumps(_cifar_batch(override={b"labels": [0, 1]})))
    cifar_case("label_text", pickle.dumps(_cifar_batch(override={b"labels": ["a", "b", "c", "d"]})))
    cifar_case("list", pickle.dumps([1, 2, 3]))
    cifar_case("object", pickle.dumps(_cifar_batch(override={b"data": np.zeros((4, 3072)).astype(object)})))
    cifar_case("missing", b"<missing>", "test_batch")

    # -- LEAF JSON (FEMNIST)
    def leaf_case(name: str, text: str | bytes, split: str = "train") -> None:
        root = tmp / f"leaf_{name}"
        d = _leaf_dir(root)
        path = d / split / "part.json"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        cases.append(
            (
                "leaf",
                [*train, *LS, "data.name=femnist", f"data.root={root}", "model.name=linear", "--resume", "auto"],
                "part.json",
            )
        )

    doc = _leaf_doc()
    leaf_case("bad_json", '{"users": [')
    leaf_case("array", "[]")
    leaf_case("binary", b"\xff\xfe\x00garbage")
    leaf_case("no_users", json.dumps({"user_data": {}}))
    leaf_case("missing_user", json.dumps({**doc, "user_data": {"u0": doc["user_data"]["u0"]}}))
    leaf_case(
        "x_len", json.dumps({**doc, "user_data": {u: {"x": [[0.5] * 783] * 3, "y": [1] * 3} for u in doc["users"]}})
    )
    leaf_case(
        "y_range",
        json.dumps({**doc, "user_data": {u: {"x": [[0.5] * 784] * 3, "y": [62] * 3} for u in doc["users"]}}),
        "test",
    )
    leaf_case(
        "xy_count", json.dumps({**doc, "user_data": {u: {"x": [[0.5] * 784] * 3, "y": [1] * 2} for u in doc["users"]}})
    )
    leaf_case("num_samples", json.dumps({**doc, "num_samples": [3, 4]}))
    leaf_case(
        "y_text", json.dumps({**doc, "user_data": {u: {"x": [[0.5] * 784] * 3, "y": ["a"] * 3} for u in doc["users"]}})
    )
    leaf_case("x_text", json.dumps({**doc, "user_data": {u: {"x": ["abc"] * 3, "y": [1] * 3} for u in doc["users"]}}))
    root = tmp / "leaf_nofiles"
    (root / "femnist" / "data" / "train").mkdir(parents=True)
    (root / "femnist" / "data" / "test").mkdir(parents=True)
    cases.append(("leaf", [*train, *LS, "data.name=femnist", f"data.root={root}", "--resume", "auto"], "json"))

    # -- checkpoints (--resume PATH into the existing run, and inspect)
    def ckpt_variant(name: str, fn) -> Path:
        path = tmp / f"ckpt_{name}.h5"
        shutil.copy(ckpt, path)
        fn(path)
        return path

    def h5_edit(fn):
        def f(path: Path) -> None:
            with h5py.File(path, "r+") as h:
                fn(h)

        return f

    def flip_byte(path: Path) -> None:
        with h5py.File(path, "r") as h:
            offset = h["server/x"].id.get_offset()
        data = bytearray(path.read_bytes())
        data[offset] ^= 0xFF
        path.write_bytes(bytes(data))

    def set_meta(key: str, value):
        def fn(h):
            del h[f"meta/{key}"]
            h[f"meta/{key}"] = value

        return h5_edit(fn)

    variants = {
        "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
        "header_only": lambda p: p.write_bytes(p.read_bytes()[:64]),
        "empty": lambda p: p.write_bytes(b""),
        "text": lambda p: p.write_text("not hdf5\n"),
        "version2": set_meta("format_version", np.int64(2)),
        "no_version": h5_edit(lambda h: h.__delitem__("meta/format_version")),
        "no_config": h5_edit(lambda h: h.__delitem__("meta/config")),
        "checksum": flip_byte,
        "plain_h5": lambda p: (p.unlink(), h5py.File(p, "w").create_dataset("x", data=np.ones(3)).file.close()),
        # incomplete or misshapen: every remaining checksum verifies, the layout does not
        "no_server_x": h5_edit(lambda h: h.__delitem__("server/x")),
        "no_schedule": h5_edit(lambda h: h.__delitem__("schedule/next_round")),
        "no_history": h5_edit(lambda h: h.__delitem__("history/participations")),
        "no_metrics": h5_edit(lambda h: h.__delitem__("metrics/jsonl")),
        "short_x": h5_edit(_replace_checksummed("server/x", np.zeros(D - 1))),
        "history_rows": h5_edit(_replace_checksummed("history/last_active", np.zeros(N + 2, np.int64))),
        "bad_config": h5_edit(_replace_checksummed("meta/config", "local: [1, 2]\n")),
    }
    paths = {name: ckpt_variant(name, fn) for name, fn in variants.items()}
    for path in paths.values():
        cases.append(("checkpoint", ["inspect", str(path)], path.name))
        cases.append(("checkpoint", [*train, *LS, "--resume", str(path)], path.name))
    for over in (f"data.num_clients={N + 1}", f"data.least_squares.dim={D + 1}", "algorithm.name=scaffold"):
        key = over.split("=")[0].split(".")[-1].replace("name", "algorithm")
        cases.append(
            (
                "checkpoint",
                [*train, *LS, over, "--resume", str(ckpt)],
                {"num_clients": "num_clients", "dim": "dim", "algorithm": "algorithm"}[key],
            )
        )
    needles = {"no_server_x": "server/x is missing", "short_x": "server/x has shape", "bad_config": "meta/config",
               "history_rows": "history/last_active"}
    for name, needle in needles.items():
        cases.append(("checkpoint", ["inspect", str(paths[name])], needle))
        cases.append(("checkpoint", [*train, *LS, "--resume", str(paths[name])], needle))
    for missing_path in (tmp / "nope.h5", tmp):
        cases.append(("checkpoint", ["inspect", str(missing_path)], str(missing_path)))
        cases.append(("checkpoint", [*train, *LS, "--resume", str(missing_path)], str(missing_path)))
    return cases


def _replace_checksummed(path: str, value):
    """An h5 edit: ``path`` replaced by ``value`` with a matching crc32, so only the layout check can object."""
    def fn(h) -> None:
        del h[path]
        if isinstance(value, str):
            h.create_dataset(path, data=value, dtype=h5py.string_dtype("utf-8"))
            crc = zlib.crc32(value.encode())
        else:
            h[path] = value
            crc = zlib.crc32(np.ascontiguousarray(value).tobytes())
        h[path].attrs["crc32"] = np.uint32(crc)

    return fn


# ------------------------------------------------------------------------------------------- driver


def _in_process(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue()


def _subprocess(argv: list[str]) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "fedrun", *argv], capture_output=True, text=True, timeout=120, env=child_env(), cwd=REPO
    )
    return proc.returncode, proc.stderr


def test_malformed_inputs_give_one_line_and_status_2(tmp_path):
    run = tmp_path / "run"
    run_ranks(0, ["-m", "fedrun", "train", "--quiet", f"run.dir={run}", *LS])
    ckpt = sorted(run.glob("ckpt_*.h5"))[-1]
    before = file_digests(run)
    assert any(name.startswith("ckpt_") for name in before) and "metrics.jsonl" in before
    inputs, fresh = tmp_path / "inputs", tmp_path / "fresh"
    inputs.mkdir()
    cases = _build_cases(inputs, fresh, ckpt)
    failures, counts = [], Counter()
    for i, (category, argv, needle) in enumerate(cases):
        runners = [("in-process", _in_process)] + ([("subprocess", _subprocess)] if i % SUBPROCESS_EVERY == 0 else [])
        for how, runner in runners:
            code, err = runner(argv)
            problems = one_line_problems(code, err, needle)
            if "pickled code ran" in err:
                problems.append("a pickle ran code")
            if problems:
                failures.append(f"[{category}/{how}] {' '.join(argv[-3:])}: {', '.join(problems)}: {err[-600:]!r}")
            counts[f"{category}/{how}"] += 1
        after = file_digests(run)
        if after != before:
            failures.append(f"[{category}] {' '.join(argv[-3:])}: changed the run directory")
            before = after
        if fresh.exists() and file_digests(fresh):
            wrote = sorted(file_digests(fresh))
            failures.append(f"[{category}] {' '.join(argv[-3:])}: wrote {wrote} into a new run dir")
            shutil.rmtree(fresh)
    by_category = Counter(c for c, _, _ in cases)
    print(f"\nbad-input cases: {len(cases)} ({dict(by_category)}); runs: {dict(counts)}")
    assert len(cases) >= 230
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-s"]))


def test_unwritable_sinks_and_unexpandable_paths_are_refused_before_anything_is_written(tmp_path, monkeypatch):
    """Sinks and paths (docs/reliability.md): TensorBoard's folder a file, an MLflow setting that is neither a
    tracking URI of a known scheme nor an existing directory (``htp:::bad`` was a folder made in the working
    directory), a SQLite store where no file can be made (sysfs, as a read-only mount: MLflow retried for
    105 s), a ``~user`` of no user (was a folder ``~nosuchuser`` in the working directory): one line, status
    2, at start-up; the working directory stays empty and an existing run's files are unchanged."""
    run = tmp_path / "run"
    run_ranks(0, ["-m", "fedrun", "train", "--quiet", f"run.dir={run}", *LS])
    before = file_digests(run)
    board = tmp_path / "board"
    board.mkdir()
    (board / "tensorboard").write_text("not a folder")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cases = [([f"run.dir={board}", "metrics.tensorboard=true"], "tensorboard is a file"),
             ([f"run.dir={run}", "metrics.mlflow=htp:::bad"], "metrics.mlflow=htp:::bad"),
             ([f"run.dir={run}", "metrics.mlflow=htp://bad"], "unknown scheme 'htp'"),
             ([f"run.dir={run}", f"metrics.mlflow={tmp_path / 'nosuch'}"], "nor an existing directory"),
             ([f"run.dir={run}", "metrics.mlflow=~nosuchuser/m"], "~nosuchuser"),
             ([f"run.dir={run}", "state.dir=~nosuchuser/x", "state.store=disk"], "state.dir"),
             (["run.dir=~nosuchuser/x"], "run.dir")]
    if Path("/sys/kernel").is_dir():
        cases.append(([f"run.dir={run}", "metrics.mlflow=sqlite:////sys/fedrun.db"], "/sys/fedrun.db"))
    failures = []
    for overrides, needle in cases:
        code, err = _in_process(["train", "--quiet", *LS, *overrides])
        failures += [f"{overrides}: {p}: {err!r}" for p in one_line_problems(code, err, needle)]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "htp:::bad")
    code, err = _in_process(["train", "--quiet", *LS, f"run.dir={run}", "metrics.mlflow=true"])
    failures += [f"MLFLOW_TRACKING_URI: {p}: {err!r}" for p in one_line_problems(code, err, "MLFLOW_TRACKING_URI")]
    import torch

    if not torch.cuda.is_available():  # was a LaunchError traceback, status 1
        code, err = _subprocess(["train", "--quiet", *LS, f"run.dir={tmp_path / 'cuda'}", "run.device=cuda"])
        failures += [f"run.device=cuda: {p}: {err!r}" for p in one_line_problems(code, err, "run.device=cuda")]
        assert not (tmp_path / "cuda").exists()
    assert not failures, "\n".join(failures)
    assert list(cwd.iterdir()) == [] and file_digests(run) == before
    assert sorted(p.name for p in board.iterdir()) == ["tensorboard"]
