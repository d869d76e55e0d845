"""Per-client data read on demand (docs/scale.md): synthetic_fedprox, federated_h5 and eval.clients."""

from __future__ import annotations

import contextlib
import io

import h5py
import numpy as np
from helpers import final_models, run_ranks
from scipy import stats

from fedrun.cli import main
from fedrun.config import DataConfig
from fedrun.data.client_source import sample_clients
from fedrun.data.synthetic_fedprox import SyntheticFedprox
from fedrun.federation.client_eval import EVAL_STREAM


def fedprox(num_clients: int, seed: int = 0, **section) -> SyntheticFedprox:
    cfg = DataConfig(name="synthetic_fedprox", num_clients=num_clients)
    for key, value in section.items():
        setattr(cfg.synthetic_fedprox, key, value)
    return SyntheticFedprox(cfg, seed)


def test_a_synthetic_client_is_the_same_alone_in_a_cohort_and_for_any_n():
    small, big = fedprox(40, test_clients=2), fedprox(100_000, test_clients=2)
    x_alone, y_alone = small.load(np.array([7]))
    x_cohort, y_cohort = big.load(np.array([3, 7, 31]))
    start = int(big.num_examples[3])
    n = int(big.num_examples[7])
    assert small.num_examples[7] == n and len(x_alone) == n
    np.testing.assert_array_equal(x_cohort[start:start + n], x_alone)
    np.testing.assert_array_equal(y_cohort[start:start + n], y_alone)
    x_test, _ = small.load_test(np.array([7]))
    assert len(x_test) == small.test_examples[7] == max(1, round(0.2 * n))
    assert not np.isin(x_test[:, 0], x_alone[:, 0]).any()  # held-out draws, not training ones
    other = fedprox(40, seed=1, test_clients=2).load(np.array([7]))[0]
    assert len(other) != n or not np.array_equal(other, x_alone)


def test_synthetic_client_sizes_follow_the_documented_lognormal_law():
    """n_k = min(50 + floor(LogNormal(4, 2)), max_examples): quantiles and the clipped share against scipy."""
    sizes = fedprox(200_000, test_clients=1, max_examples=5000).num_examples
    law = stats.lognorm(s=2.0, scale=np.exp(4.0))
    for q in (0.1, 0.5, 0.9):
        want = 50 + np.floor(law.ppf(q))
        assert abs(np.quantile(sizes, q) - want) <= 0.03 * want + 1, q
    clipped = (sizes == 5000).mean()
    assert abs(clipped - law.sf(4950)) < 4 * np.sqrt(law.sf(4950) / len(sizes))
    assert sizes.min() >= 50 and sizes.max() == 5000


def test_synthetic_features_and_labels_follow_the_model():
    """Within a client, x_j has variance j^-1.2 about v_k; over clients every class occurs (one client's
    labels may be a single class: its W_k x + b_k is dominated by one row)."""
    src = fedprox(2000, test_clients=300, max_examples=5000)
    k = int(np.argmax(src.num_examples))
    x, y = src.load(np.array([k]))
    var = x.astype(np.float64).var(axis=0)
    want = np.arange(1, 61) ** -1.2
    assert np.all(np.abs(var / want - 1) < 0.15)
    assert y.min() >= 0 and y.max() < 10
    assert np.unique(src.task.y_test).tolist() == list(range(10))


def read_clients(run_dir) -> dict[str, np.ndarray]:
    with h5py.File(run_dir / "clients.h5", "r") as f:
        return {name: f[name][()] for name in f}


def test_synthetic_fedprox_on_1_and_2_ranks_with_a_seeded_eval_clients_sample(tmp_path):
    """One client per round (cyclic): the global models agree on 1 and 2 ranks, so the per-client figures
    of the eval.clients sample must agree bit for bit, and the sample is the seeded one."""
    runs = {}
    for ranks in (1, 2):
        run_dir = tmp_path / f"r{ranks}"
        run_ranks(ranks, ["-m", "fedrun", "train", "--quiet", f"run.dir={run_dir}", "run.rounds=2", "run.seed=4",
                          "data.name=synthetic_fedprox", "data.num_clients=300",
                          "data.synthetic_fedprox.test_clients=5",
                          "model.name=logistic", "local.steps=2", "participation.pattern=cyclic",
                          "participation.clients_per_round=1", "eval.every=1", "eval.clients=7",
                          "algorithm.name=scaffold"])
        runs[ranks] = read_clients(run_dir)
    one = runs[1]
    np.testing.assert_array_equal(one["client"], sample_clients(300, 7, 4, EVAL_STREAM))
    assert one["loss"].shape == (2, 7) and np.isfinite(one["loss"]).all()
    assert not np.array_equal(one["client"], sample_clients(300, 7, 5, EVAL_STREAM))
    for name, value in one.items():
        np.testing.assert_array_equal(runs[2][name], value, err_msg=name)


# ------------------------------------------------------------------------------------------- federated_h5

def write_tff(path, clients: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """A file in TensorFlow Federated's layout: examples/<client_id>/{pixels,label}."""
    with h5py.File(path, "w") as f:
        for cid, (x, y) in clients.items():
            group = f.create_group(f"examples/{cid}")
            group["pixels"], group["label"] = x, y


def tff_pair(tmp_path, num_clients: int = 5):
    """Train and test files of ``num_clients`` clients with 6 features and 3 classes; ids that sort as strings
    differently from as numbers ("10" < "9"), and clients of different sizes."""
    rng = np.random.default_rng(0)
    ids = [str(i) for i in (3, 10, 9, 27, 4, 100, 8)[:num_clients]]
    data = {}
    for split, low in (("train", 4), ("test", 2)):
        data[split] = {cid: (rng.normal(size=(n, 6)).astype(np.float32), rng.integers(0, 3, n))
                       for cid, n in zip(ids, rng.integers(low, 3 * low, len(ids)), strict=True)}
        write_tff(tmp_path / f"{split}.h5", data[split])
    return data, sorted(ids)


def test_federated_h5_equals_the_same_data_in_memory_on_1_and_2_ranks(tmp_path):
    """The same clients as data.name=arrays (groups = client index in sorted id order, the pooled test set
    all clients' test examples in that order): the final models are bit-identical, resident or on demand."""
    data, ids = tff_pair(tmp_path)
    train, test = data["train"], data["test"]
    np.savez(tmp_path / "same.npz", x_train=np.concatenate([train[c][0] for c in ids]),
             y_train=np.concatenate([train[c][1] for c in ids]),
             groups=np.concatenate([np.full(len(train[c][1]), i) for i, c in enumerate(ids)]),
             x_test=np.concatenate([test[c][0] for c in ids]), y_test=np.concatenate([test[c][1] for c in ids]))
    common = ["data.num_clients=5", "model.name=logistic", "run.dtype=float64", "run.rounds=3", "local.steps=3",
              "local.batch_size=4", "participation.clients_per_round=3", "eval.every=1", "algorithm.name=scaffold",
              "local.strategy=sequential", "run.device=cpu"]
    configs = {"h5": [*common, "data.name=federated_h5", f"data.federated_h5.train={tmp_path / 'train.h5'}",
                      f"data.federated_h5.test={tmp_path / 'test.h5'}"],
               "arrays": [*common, "data.name=arrays", f"data.root={tmp_path / 'same.npz'}",
                          "data.partition=natural"]}
    for ranks in (0, 2):
        models = final_models(ranks, tmp_path, configs)
        assert np.abs(models["arrays"]).sum() > 0
        np.testing.assert_array_equal(models["h5"], models["arrays"], err_msg=f"{ranks} ranks")


def bad_file(tmp_path, case: str):
    """A valid pair with one defect; returns (the file that is bad, the client it names, the field)."""
    data, ids = tff_pair(tmp_path)
    train, test = data["train"], data["test"]
    if case == "missing feature":
        with h5py.File(tmp_path / "train.h5", "a") as f:
            del f[f"examples/{ids[2]}/pixels"]
        return "train.h5", ids[2], "pixels"
    if case == "empty client":
        test[ids[1]] = (np.zeros((0, 6), np.float32), np.zeros(0, np.int64))
        write_tff(tmp_path / "test.h5", test)
        return "test.h5", ids[1], "pixels"
    if case == "mismatched lengths":
        x, y = train[ids[0]]
        train[ids[0]] = (x, y[:-1])
        write_tff(tmp_path / "train.h5", train)
        return "train.h5", ids[0], "label"
    del test[ids[3]]  # a client id not in the test file
    write_tff(tmp_path / "test.h5", test)
    return "test.h5", ids[3], f"examples/{ids[3]}"


def test_bad_federated_h5_files_get_one_line_naming_file_client_and_field(tmp_path):
    """Through the CLI (in this process: the CLI's own error path): status 2, one line, no file written."""
    for case in ("missing feature", "empty client", "mismatched lengths", "missing test client"):
        case_dir = tmp_path / case.replace(" ", "_")
        case_dir.mkdir()
        name, client, field = bad_file(case_dir, case)
        run_dir = case_dir / "run"
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["train", "--quiet", f"run.dir={run_dir}", "data.name=federated_h5", "data.num_clients=5",
                         "model.name=logistic", f"data.federated_h5.train={case_dir / 'train.h5'}",
                         f"data.federated_h5.test={case_dir / 'test.h5'}"])
        lines = err.getvalue().strip().splitlines()
        assert code == 2 and len(lines) == 1, (case, err.getvalue())
        assert str(case_dir / name) in lines[0] and f"client {client!r}" in lines[0] and field in lines[0], lines
        written = [p.name for p in run_dir.iterdir() if p.name != ".lock"] if run_dir.exists() else []
        assert not written, (case, written)
