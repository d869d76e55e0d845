"""The shards and size_skew partitioners, their config checks, and `python -m fedrun data`."""

from __future__ import annotations

import numpy as np
import pytest

from fedrun.cli import main
from fedrun.config import DataConfig, load_config
from fedrun.data import load_task
from fedrun.data.dataset import TaskData
from fedrun.data.partition import lognormal_sizes, partition
from fedrun.data.stats import describe_partition, label_counts, label_entropy, save_partition_png
from fedrun.errors import ConfigError, DataError


def toy_task(n_per_class: int = 30, classes: int = 10, seed: int = 0) -> TaskData:
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(classes), n_per_class)
    y = y[rng.permutation(len(y))]
    x = rng.standard_normal((len(y), 4)).astype(np.float32)
    return TaskData("toy", x, y.astype(np.int64), x[:10], y[:10].astype(np.int64), classes)


def data_cfg(**kw) -> DataConfig:
    cfg = DataConfig(name="synthetic", **kw)
    cfg.check()
    return cfg


def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(parts)
    assert len(joined) == n and np.array_equal(np.sort(joined), np.arange(n))


# -------------------------------------------------------------------------------------------- shards


def test_shards_cover_every_example_once_with_equal_sizes():
    task = toy_task()
    parts = partition(task, data_cfg(num_clients=15, partition="shards", shards_per_client=2), seed=3)
    assert len(parts) == 15
    assert_exact_cover(parts, 300)
    assert {len(p) for p in parts} == {20}  # 300 examples / 30 shards = 10 per shard, 2 shards each


def test_shards_are_label_pure_so_clients_see_few_classes():
    task = toy_task()  # 30 examples per class; 30 shards of 10 -> each shard holds one label
    for s in (1, 2, 3):
        parts = partition(task, data_cfg(num_clients=10, partition="shards", shards_per_client=s), seed=0)
        counts = label_counts(task, parts)
        assert (counts > 0).sum(axis=1).max() <= s
        assert np.array_equal(counts.sum(axis=0), np.full(10, 30))


def test_shards_are_seeded():
    task = toy_task()
    cfg = data_cfg(num_clients=10, partition="shards")
    a, b, c = (partition(task, cfg, seed) for seed in (1, 1, 2))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_shards_refuse_more_shards_than_examples_and_regression():
    task = toy_task(n_per_class=2)  # 20 examples
    with pytest.raises(DataError, match="data.shards_per_client=3"):
        partition(task, data_cfg(num_clients=10, partition="shards", shards_per_client=3), seed=0)
    reg = TaskData("r", task.x_train, task.y_train.astype(np.float32), task.x_test, task.y_test, 0,
                   task="regression")
    with pytest.raises(DataError, match="needs class labels"):
        partition(reg, data_cfg(num_clients=4, partition="shards"), seed=0)


# ----------------------------------------------------------------------------------------- size skew


def test_size_skew_sizes_sum_and_are_skewed():
    task = toy_task(n_per_class=100)  # 1000 examples
    parts = partition(task, data_cfg(num_clients=50, partition="size_skew", size_sigma=1.5), seed=0)
    assert_exact_cover(parts, 1000)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 1
    assert sizes.max() >= 5 * np.median(sizes)  # lognormal(1.5): a heavy right tail


def test_size_skew_sigma_zero_gives_equal_sizes():
    parts = partition(toy_task(), data_cfg(num_clients=30, partition="size_skew", size_sigma=0.0), seed=4)
    assert {len(p) for p in parts} == {10}


def test_lognormal_sizes_keep_every_client_and_the_total():
    rng = np.random.default_rng(0)
    for total, n, sigma in ((100, 100, 3.0), (1000, 7, 0.5), (12345, 100, 2.0)):
        sizes = lognormal_sizes(total, n, sigma, rng)
        assert sizes.sum() == total and sizes.min() >= 1 and len(sizes) == n


def test_size_skew_log_sizes_have_roughly_sigma_spread():
    sizes = lognormal_sizes(10**7, 2000, 0.8, np.random.default_rng(1))
    assert abs(np.log(sizes).std() - 0.8) < 0.05


# ----------------------------------------------------------------------------------------- config


def test_the_partition_registry_checks_its_names():
    cfg = load_config(None, ["data.partition=bogus"])  # the config section checks types and ranges only
    with pytest.raises(ConfigError) as err:
        partition(load_task(cfg.data, 0), cfg.data, 0)
    assert str(err.value) == "data.partition: expected one of iid, dirichlet, natural, shards, size_skew, got 'bogus'"


@pytest.mark.parametrize("override, message", [
    ("data.shards_per_client=0", "data.shards_per_client: expected an integer >= 1, got 0"),
    ("data.size_sigma=-1", "data.size_sigma: expected a number >= 0, got -1.0"),
    ("data.shards_per_client=1.5", "data.shards_per_client: expected an integer, got 1.5"),
])
def test_config_checks_name_the_field(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert str(err.value) == message


def test_config_accepts_the_new_partitions():
    cfg = load_config(None, ["data.partition=shards", "data.shards_per_client=3"])
    assert cfg.data.shards_per_client == 3
    cfg = load_config(None, ["data.partition=size_skew", "data.size_sigma=0.5"])
    assert cfg.data.size_sigma == 0.5


# ----------------------------------------------------------------------------------------- statistics


def test_label_entropy_values():
    counts = np.array([[5, 0, 0, 0], [1, 1, 1, 1], [2, 2, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_allclose(label_entropy(counts), [0.0, 2.0, 1.0, 0.0])


def test_describe_partition_numbers():
    counts = np.array([[5, 0, 0, 0], [1, 1, 1, 1], [2, 2, 0, 0]])
    s = describe_partition(counts.sum(axis=1), counts)
    assert (s["clients"], s["examples"], s["size_min"], s["size_max"]) == (3, 13, 4, 5)
    assert s["size_mean"] == pytest.approx(13 / 3)
    assert (s["classes_min"], s["classes_max"]) == (1, 4)
    assert s["classes_mean"] == pytest.approx(7 / 3)
    assert s["entropy_mean"] == pytest.approx(1.0)
    assert s["entropy_all"] == pytest.approx(label_entropy(np.array([8, 3, 1, 1]))[0])


def test_partition_png_is_written(tmp_path):
    task = toy_task()
    parts = partition(task, data_cfg(num_clients=12, partition="dirichlet", alpha=0.1), seed=0)
    out = save_partition_png(label_counts(task, parts), tmp_path / "sub" / "p.png", "toy")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_data_command_prints_statistics_and_saves_png(tmp_path, capsys):
    png = tmp_path / "dist.png"
    overrides = ["data.name=synthetic", "data.synthetic.shape=[4]", "data.num_clients=20",
                 "data.synthetic.examples_per_client=30", "data.partition=shards", "data.shards_per_client=2"]
    assert main(["data", "--png", str(png), *overrides]) == 0
    out = capsys.readouterr().out
    assert "20 clients, 600 training examples" in out
    assert "examples per client" in out and "classes per client" in out and "label entropy" in out
    assert png.is_file() and png.stat().st_size > 1000
    # 2 shards per client; a shard may straddle one label boundary, so at most 4 classes per client
    line = next(ln for ln in out.splitlines() if ln.startswith("classes per client"))
    assert int(line.split()[-1]) <= 4 and float(line.split()[-2]) < 3


def test_data_command_bad_input_exit_status(capsys):
    assert main(["data", "data.partition=bogus"]) == 2
    assert "data.partition" in capsys.readouterr().err
