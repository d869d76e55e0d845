"""Local-training strategies (fedrun.training.strategy, gradients): sequential, channels_last, vmap and batched
compute the same training, `auto` takes the fastest exact one, `fastest` times the
applicable ones, and forcing one that does not apply is a
one-line config error."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import federation, single_world

import fedrun
from fedrun.cli import main
from fedrun.errors import ConfigError
from fedrun.models import build_model
from fedrun.protocol import LocalPlan
from fedrun.training.dropout import DropoutSeeds
from fedrun.training.flat_model import FlatModel
from fedrun.training.local_strategy import local_strategy
from fedrun.training.strategy import check_strategy, reproducible_strategy

CNN = {"run": {"rounds": 2, "dtype": "float64", "seed": 3, "device": "cpu"},
       "data": {"name": "synthetic", "num_clients": 4, "partition": "iid",
                "synthetic": {"shape": [3, 32, 32], "examples_per_client": 12}},
       "model": {"name": "cnn_cifar10"},
       "local": {"steps": 3, "batch_size": 4, "lr": 0.05},
       "participation": {"pattern": "full"}, "eval": {"every": 0}}


MNIST_SHAPE = {**CNN["data"], "synthetic": {"shape": [1, 28, 28], "examples_per_client": 12}}


def with_sections(base: dict, **sections) -> dict:
    cfg = {k: dict(v) for k, v in base.items()}
    for section, values in sections.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    return cfg


def run(base: dict, **sections) -> fedrun.api.RunResult:
    return fedrun.run(with_sections(base, **sections), world=single_world(), write_files=False)


@pytest.mark.parametrize("model", ["cnn_cifar10", "cnn_mnist"])
def test_channels_last_and_vmap_train_like_the_plain_loop(model):
    """float64: the memory order and the batching only change the order of sums, so the models agree to
    ~1e-12; cnn_mnist draws dropout masks (a different mask moves a weight by ~1e-2), which channels_last
    and batched must draw from the same per-client streams as the loop."""
    base = with_sections(CNN, model={"name": model}, data=MNIST_SHAPE if model == "cnn_mnist" else {})
    plain = run(base, local={"strategy": "sequential"})
    init = run(base, local={"strategy": "sequential", "lr": 0.0})
    others = ["channels_last", "batched"] if model == "cnn_mnist" else ["channels_last", "vmap", "batched"]
    for strategy in others:
        x = run(base, local={"strategy": strategy}).x
        np.testing.assert_allclose(x, plain.x, rtol=0, atol=1e-10, err_msg=strategy)
    assert np.abs(plain.x - init.x).max() > 1e-3  # training moved the model


def test_auto_takes_the_fastest_exact_strategy_of_the_model():
    cnn = federation(CNN)
    assert cnn.strategy == "channels_last" and cnn.strategy_timings == {}
    assert cnn.setup.strategy_reason.startswith("auto on cpu: ")  # runtime.json's strategy_reason
    assert federation(with_sections(CNN, model={"name": "logistic"})).strategy == "batched"


def test_fastest_times_the_applicable_strategies_and_keeps_the_fastest():
    cnn = federation(with_sections(CNN, local={"strategy": "fastest"}))
    assert set(cnn.strategy_timings) == {"sequential", "channels_last", "vmap"}  # batched: vmap without padding
    assert cnn.strategy == min(cnn.strategy_timings, key=cnn.strategy_timings.get)
    dropout = federation(with_sections(CNN, model={"name": "cnn_mnist"}, data=MNIST_SHAPE,
                                       local={"strategy": "fastest"}))
    assert set(dropout.strategy_timings) == {"sequential", "channels_last"}  # no vmap with dropout
    flat = federation(with_sections(CNN, model={"name": "logistic"}, local={"strategy": "fastest"}))
    assert set(flat.strategy_timings) == {"sequential", "vmap"}  # no kernels to reorder


@pytest.mark.parametrize("strategy", ["sequential", "channels_last"])
def test_a_client_trains_to_the_same_bits_alone_or_with_others(strategy):
    """What makes auto's strategies reproducible on any number of ranks: float32, client 3 trained alone,
    then in the middle of a group of 4."""
    setup = federation(with_sections(CNN, run={"dtype": "float32"}, model={"name": "cnn_mnist"},
                                     data=MNIST_SHAPE, local={"strategy": strategy})).setup
    x0, block, learner = setup.exchange.global_model(), setup.placement.block, setup.learner

    def trained(rows: list[int]) -> torch.Tensor:
        rows = np.asarray(rows)
        batches = block.batches(rows, 0, 0, 4, 3, None, True)
        plan = LocalPlan(start=x0.expand(len(rows), -1))
        seeds = DropoutSeeds(rows, 0, 0) if learner.random_model else None
        return local_strategy(strategy, learner.model, learner.loss_fn, x0.device).train(
            plan, batches, 0.05, setup.cfg.local, seeds).x_end

    alone, grouped = trained([3])[0], trained([1, 2, 3, 0])[2]
    assert torch.equal(alone, grouped)
    assert not torch.equal(alone, x0)


@pytest.mark.parametrize("name,shape,classes,cpu", [
    ("logistic", (32,), 10, "batched"), ("linear", (32,), 1, "batched"),
    ("lstm_shakespeare_unrolled", (80,), 81, "sequential"), ("cnn_femnist", (1, 28, 28), 62, "channels_last"),
    ("cnn_mnist", (1, 28, 28), 10, "channels_last"), ("resnet18", (3, 32, 32), 10, "channels_last"),
])
def test_auto_batches_on_a_cpu_only_models_whose_step_costs_less_than_a_call(name, shape, classes, cpu):
    """On a CPU the LEAF LSTM and CNN spend most of a step in per-client matrix products, which batching cannot
    merge (bench/batched.py's bound); on CUDA every verified model is batched."""
    model = FlatModel(build_model(name, shape, classes))
    block = SimpleNamespace(input_shape=shape)  # all the rule reads of a block
    assert reproducible_strategy(model, block, name, torch.device("cpu"))[0] == cpu
    strategy, reason = reproducible_strategy(model, block, name, torch.device("cuda"))
    assert strategy == "batched" and "verified exact" in reason


@pytest.mark.parametrize("model,strategy,needle", [
    ("logistic", "channels_last", "local.strategy=channels_last: model logistic has no 2-D convolution"),
    ("cnn_mnist", "vmap", "local.strategy=vmap: model cnn_mnist uses dropout"),
])
def test_a_forced_strategy_that_does_not_apply_is_refused(model, strategy, needle):
    cfg = with_sections(CNN, model={"name": model}, local={"strategy": strategy},
                        data=MNIST_SHAPE if model == "cnn_mnist" else {})
    with pytest.raises(ConfigError, match=needle):
        federation(cfg)


def test_a_batched_block_refuses_a_dropout_layer_it_cannot_feed():
    """AlphaDropout adds an affine shift to its noise: the batched block's `a * noise` cannot reproduce it, so a
    forced batched strategy is one line naming the layer, before any training."""
    model = FlatModel(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.AlphaDropout(0.2)))
    with pytest.raises(ConfigError, match=r"strategy=batched: model plug:mlp has dropout layer 1 \(AlphaDropout\)"):
        check_strategy("batched", model, SimpleNamespace(input_shape=(4,)), True, "plug:mlp")
    check_strategy("sequential", model, SimpleNamespace(input_shape=(4,)), True, "plug:mlp")


def test_runtime_json_says_which_strategy_and_why(tmp_path):
    """A real run's runtime.json: the strategy auto took and the branch of the rule that decided, or the
    config that forced one."""
    base = ["data.name=synthetic", "data.synthetic.shape=[12]", "data.num_clients=4", "model.name=logistic",
            "participation.pattern=full", "run.rounds=1", "eval.every=0", "--quiet"]
    for strategy, reason in (("auto", "auto on cpu: logistic's batched block is verified exact"),
                             ("sequential", "local.strategy=sequential in the config")):
        run_dir = tmp_path / strategy
        assert main(["train", *base, f"local.strategy={strategy}", f"run.dir={run_dir}"]) == 0
        runtime = json.loads((run_dir / "runtime.json").read_text())
        assert runtime["local_strategy"] == ("batched" if strategy == "auto" else strategy)
        assert runtime["strategy_reason"].startswith(reason), runtime["strategy_reason"]
