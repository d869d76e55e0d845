"""``fedrun flatness``: the Lanczos top eigenvalue against ``numpy.linalg.eigvalsh`` with its residual check,
and the filter-normalized antithetic loss increase against its equation, on float64 least-squares problems
(H = (1/n) A^T A for the loss 1/2 (a^T x - b)^2); the loss increase's invariance to a ReLU network's
rescaling symmetry; then the command on a real two-round CNN run's checkpoint (JSON fields, finite, the
same for the same seed) and its bad inputs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO, child_env, run_ranks
from torch import nn

from fedrun.cli import main
from fedrun.flatness import (
    RESIDUAL_TOL,
    SampleLoss,
    filter_normalize,
    loss_increase,
    measure_flatness,
    random_directions,
    sample_losses,
    top_eigenvalue,
)
from fedrun.training.flat_model import FlatModel
from fedrun.training.losses import cross_entropy, half_squared_error


class Row(nn.Module):
    """a -> a^T w with w one filter of shape (1, d): the least-squares model with a filter to normalize."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, d, dtype=torch.float64))

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return (a @ self.weight.T).squeeze(-1)


def least_squares(n: int = 40, d: int = 6, seed: int = 3) -> tuple[SampleLoss, np.ndarray, np.ndarray]:
    """L(x) = (1/n) sum_j 1/2 (a_j^T x - b_j)^2 as a SampleLoss (chunks of 7: several chunks summed), its
    Hessian (1/n) A^T A and its minimiser."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, d)) * np.linspace(0.5, 3.0, d)
    b = rng.standard_normal(n)
    loss = SampleLoss(FlatModel(Row(d)), half_squared_error, torch.from_numpy(a), torch.from_numpy(b), batch_size=7)
    return loss, a.T @ a / n, np.linalg.lstsq(a, b, rcond=None)[0]


@pytest.mark.parametrize(("n", "d"), [(40, 6), (300, 120)])
def test_lanczos_top_eigenvalue_is_the_largest_of_numpy_eigvalsh_with_a_small_residual(n, d):
    loss, hessian, x_star = least_squares(n, d)
    x = torch.from_numpy(x_star + 1.0)  # H does not depend on x for a quadratic
    np.testing.assert_allclose(loss.hvp(x, torch.ones(d, dtype=torch.float64)).numpy(), hessian @ np.ones(d),
                               rtol=1e-12)
    eig = top_eigenvalue(lambda v: loss.hvp(x, v), d, max_hvps=200, seed=0)
    values, vectors = np.linalg.eigh(hessian)
    assert abs(eig.value - values[-1]) <= 1e-6 * values[-1]
    assert eig.converged and eig.residual <= RESIDUAL_TOL
    # the residual bounds the distance to H's spectrum, and the vector is the top one's (up to sign)
    assert np.min(np.abs(values - eig.value)) <= eig.residual * abs(eig.value) + 1e-12
    assert abs(abs(eig.vector @ vectors[:, -1]) - 1) < 1e-6
    assert 1 <= eig.hvps <= 200
    again = top_eigenvalue(lambda v: loss.hvp(x, v), d, max_hvps=200, seed=0)
    assert (again.value, again.hvps, again.residual) == (eig.value, eig.hvps, eig.residual)


def test_lanczos_short_of_products_is_reported_not_converged():
    # 400 evenly spaced eigenvalues in [0, 1] (relative gap 0.0025 at the top): one restart of 20 Lanczos
    # vectors does not resolve the top one; the answer comes back flagged, not as an error
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.standard_normal((400, 400)))
    h = torch.from_numpy((q * np.linspace(0.0, 1.0, 400)) @ q.T)
    short = top_eigenvalue(lambda v: h @ v, 400, max_hvps=1, seed=0)
    assert not short.converged and short.residual > RESIDUAL_TOL and short.value <= 1.0 and short.hvps <= 40
    full = top_eigenvalue(lambda v: h @ v, 400, max_hvps=2000, seed=0)
    assert full.converged and abs(full.value - 1.0) <= 1e-3 and full.hvps > short.hvps


def test_antithetic_filter_normalized_increase_is_half_rho2_dHd_at_any_point():
    loss, hessian, x_star = least_squares()
    x = torch.from_numpy(x_star + 0.7)  # away from the minimum: the gradient term cancels between +d and -d
    rhos, count, seed = (0.01, 0.1, 0.5), 7, 4
    shapes = loss.model.shapes
    means, stds = loss_increase(loss.value, x, shapes, rhos, count, seed)
    d = np.stack([filter_normalize(u, x, shapes).numpy() for u in random_directions(6, count, seed)])
    np.testing.assert_allclose(np.linalg.norm(d, axis=1), np.linalg.norm(x.numpy()), rtol=1e-14)  # one filter
    quad = np.einsum("md,de,me->m", d, hessian, d)  # d_m^T H d_m
    for rho, mean, std in zip(rhos, means, stds, strict=True):
        expected = 0.5 * rho**2 * quad
        np.testing.assert_allclose(mean, expected.mean(), rtol=1e-8)
        np.testing.assert_allclose(std, expected.std(), rtol=1e-6)
    other, _ = loss_increase(loss.value, x, shapes, rhos, count, seed + 1)
    assert other != means  # another seed draws other directions


def test_filter_normalization_gives_each_filter_the_models_norm_and_biases_none():
    x = torch.arange(1.0, 15.0, dtype=torch.float64)  # a (2, 3) weight, a (2,) bias, a (3, 2) weight
    shapes = [(2, 3), (2,), (3, 2)]
    d = filter_normalize(torch.ones(14, dtype=torch.float64), x, shapes)
    assert torch.allclose(d[:3].norm(), x[:3].norm()) and torch.allclose(d[3:6].norm(), x[3:6].norm())
    assert torch.all(d[6:8] == 0)
    for f in range(3):
        row = slice(8 + 2 * f, 10 + 2 * f)
        assert torch.allclose(d[row].norm(), x[row].norm()) and torch.allclose(d[row], d[row][0].expand(2))


def test_the_loss_increase_is_invariant_to_relu_rescaling_and_the_eigenvalue_is_not():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)).double()
    model = FlatModel(net)
    rng = np.random.default_rng(5)
    inputs, targets = torch.from_numpy(rng.standard_normal((64, 4))), torch.from_numpy(rng.integers(0, 3, 64))
    loss = SampleLoss(model, cross_entropy, inputs, targets)
    x = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    alpha = 3.0  # layer 1 (weight and bias) times alpha, layer 2's weight divided: the same function
    scaled = torch.cat([alpha * net[0].weight.reshape(-1), alpha * net[0].bias, net[2].weight.reshape(-1) / alpha,
                        net[2].bias]).detach()
    assert loss.value(scaled) == pytest.approx(loss.value(x), rel=1e-12)
    rise, _ = loss_increase(loss.value, x, model.shapes, (0.05, 0.2), 6, 0)
    rise_scaled, _ = loss_increase(loss.value, scaled, model.shapes, (0.05, 0.2), 6, 0)
    np.testing.assert_allclose(rise_scaled, rise, rtol=1e-9)
    top = top_eigenvalue(lambda v: loss.hvp(x, v), len(x), 400, 0).value
    top_scaled = top_eigenvalue(lambda v: loss.hvp(scaled, v), len(x), 400, 0).value
    assert abs(top_scaled - top) > 0.1 * top  # the sharpness changes with a reparametrization that changes nothing


TINY = ["--config", "configs/quickstart.yaml", "data.num_clients=10", "participation.clients_per_round=3",
        "local.steps=2", "local.strategy=sequential", "eval.every=0", "run.rounds=2", "checkpoint.every=1"]


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("flat") / "run"
    run_ranks(0, ["-m", "fedrun", "train", "--quiet", *TINY, f"run.dir={run}"])
    return run


def flatness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedrun", "flatness", *args], capture_output=True, text=True,
                          env=child_env(), cwd=REPO, timeout=300)


def test_flatness_of_a_cnn_checkpoint_is_finite_and_repeats_for_the_same_seed(cnn_run):
    small = ["--examples", "300", "--directions", "3", "--max-hvps", "40", "--rho", "0.01", "0.1"]
    first = flatness(str(cnn_run), *small, "--json")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert set(out) == {"checkpoint", "round", "examples", "seed", "top_eigenvalue", "hvps", "residual",
                        "converged", "rho", "directions", "loss_increase", "loss_increase_std", "train_loss",
                        "train_accuracy", "test_accuracy"}
    assert out["round"] == 2 and out["examples"] == 300 and out["directions"] == 3 and out["rho"] == [0.01, 0.1]
    assert out["checkpoint"].endswith("ckpt_00000002.h5") and 1 <= out["hvps"] <= 80
    assert out["converged"] == (out["residual"] <= RESIDUAL_TOL)
    numbers = [out["top_eigenvalue"], out["residual"], out["train_loss"], out["train_accuracy"], out["test_accuracy"],
               *out["loss_increase"], *out["loss_increase_std"]]
    assert all(math.isfinite(v) for v in numbers)
    assert out["top_eigenvalue"] > 0 and 0 <= out["train_accuracy"] <= 1 and 0 < out["test_accuracy"] <= 1
    assert out["loss_increase"][1] > out["loss_increase"][0]  # a ten times larger radius rises more
    again = flatness(str(cnn_run / "ckpt_00000002.h5"), *small, "--json")
    assert json.loads(again.stdout) == out  # the same checkpoint by file, the same seed: the same bits
    other = json.loads(flatness(str(cnn_run), *small, "--json", "--seed", "1").stdout)
    assert other["top_eigenvalue"] != out["top_eigenvalue"] and other["train_loss"] != out["train_loss"]
    table = flatness(str(cnn_run), *small)
    assert table.returncode == 0 and "top Hessian eigenvalue" in table.stdout
    assert f"{out['top_eigenvalue']:.6g}" in table.stdout


def test_sample_losses_are_each_checkpoints_train_loss_and_refuse_another_runs_checkpoint(cnn_run, tmp_path):
    """The training loss along a run (what the same-loss flatness comparison picks its models by) is
    measure_flatness's train_loss bit for bit at every checkpoint, and moves between rounds; a checkpoint of
    a run with other data is refused by name."""
    import shutil

    import h5py

    from fedrun.errors import CheckpointError

    first, last = cnn_run / "ckpt_00000001.h5", cnn_run / "ckpt_00000002.h5"
    losses = sample_losses([first, last], examples=300, seed=0)
    for path, loss in zip((first, last), losses, strict=True):
        assert loss == measure_flatness(path, examples=300, rho=(0.1,), directions=1, max_hvps=40).train_loss
    assert losses[0] != losses[1] and all(math.isfinite(v) for v in losses)
    assert sample_losses([last], examples=300, seed=1) != losses[1:]  # another seed, another sample
    other = tmp_path / "other_run.h5"
    shutil.copy(last, other)
    with h5py.File(other, "r+") as f:  # the same model on a partition into 11 clients: another run
        config = f["meta/config"].asstr()[()]
        assert "num_clients: 10" in config
        config = config.replace("num_clients: 10", "num_clients: 11")
        del f["meta/config"]
        f.create_dataset("meta/config", data=config, dtype=h5py.string_dtype("utf-8"))
        f["meta/config"].attrs["crc32"] = np.uint32(zlib.crc32(config.encode()))
    with pytest.raises(CheckpointError, match="other_run.h5: not a checkpoint of the run of"):
        sample_losses([first, other], examples=300)


@pytest.mark.parametrize("args, names", [
    (["{missing}"], "checkpoint file not found"),
    (["{not_ckpt}"], "not_a_checkpoint.h5"),
    (["{run}", "--examples", "0"], "--examples"),
    (["{run}", "--rho", "nan"], "--rho"),
    (["{run}", "--rho", "-0.1"], "--rho"),
    (["{run}", "--max-hvps", "2.5"], "--max-hvps"),
    (["{run}", "--iterations", "0"], "--iterations"),  # the old name of --max-hvps
    (["{run}", "--directions", "x"], "--directions"),
    (["{run}", "--seed", "-1"], "--seed"),
    (["{unbuildable}"], "model.name"),
    (["{nonfinite}"], "server/x has non-finite values"),
])
def test_bad_input_is_one_line_status_2_nothing_written(cnn_run, tmp_path, capsys, args, names):
    import shutil

    import h5py

    bad = tmp_path / "not_a_checkpoint.h5"
    bad.write_text("not hdf5\n")
    unbuildable = tmp_path / "unbuildable.h5"
    shutil.copy(cnn_run / "ckpt_00000002.h5", unbuildable)
    with h5py.File(unbuildable, "r+") as f:  # a valid file (checksum and all) whose model does not fit its data
        config = f["meta/config"].asstr()[()].replace("name: cnn_mnist", "name: cnn_svhn")
        del f["meta/config"]
        f.create_dataset("meta/config", data=config, dtype=h5py.string_dtype("utf-8"))
        f["meta/config"].attrs["crc32"] = np.uint32(zlib.crc32(config.encode()))
    nonfinite = tmp_path / "nonfinite.h5"
    shutil.copy(cnn_run / "ckpt_00000002.h5", nonfinite)
    with h5py.File(nonfinite, "r+") as f:  # a valid file holding a diverged model
        x = f["server/x"][()]
        x[0] = np.nan
        f["server/x"][...] = x
        f["server/x"].attrs["crc32"] = np.uint32(zlib.crc32(np.ascontiguousarray(x).tobytes()))
    paths = {"missing": tmp_path / "nope.h5", "not_ckpt": bad, "run": cnn_run, "unbuildable": unbuildable,
             "nonfinite": nonfinite}
    before = sorted(p.name for p in tmp_path.iterdir()), sorted(p.name for p in cnn_run.iterdir())
    try:  # in this process: the CLI's own error path (argparse's errors exit)
        code = main(["flatness", *[a.format(**paths) for a in args]])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    print(err)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and names in err, err
    assert (sorted(p.name for p in tmp_path.iterdir()), sorted(p.name for p in cnn_run.iterdir())) == before


def test_the_fmnist_flatness_step_measures_trained_runs_once_and_lists_the_rest(cnn_run, tmp_path, capsys,
                                                                               monkeypatch):
    """experiments/fmnist_flatness.py on a small spec list of its own: the trained run gets its JSON, a run
    without a summary is listed as not trained, a diverged one as diverged, a label outside the comparison
    is left out, a label without runs is named; a second call measures nothing again."""
    sys.path.insert(0, str(REPO / "experiments"))
    import fmnist_flatness

    monkeypatch.setattr(fmnist_flatness, "SETTINGS", {"examples": 200, "rho": (0.05,), "directions": 2,
                                                      "max_hvps": 40, "seed": 0})
    summaries = tmp_path / "summaries"
    summaries.mkdir()
    (summaries / "FedAvg_s0.json").write_text('{"finite": true}\n')
    (summaries / "FedAdam_s0.json").write_text('{"finite": false}\n')
    (summaries / "FedYogi_s0.json").write_text('{"finite": true}\n')

    def fake(label: str, name: str) -> dict:
        return {"label": label, "seed": 0, "summary": str(summaries / f"{name}.json"),
                "base": "configs/quickstart.yaml", "overrides": [f"run.dir={cnn_run}"]}

    specs = [fake("FedAvg global_lr=1.0", "FedAvg_s0"), fake("FADAS global_lr=0.01", "FADAS_s0"),
             fake("FedAdam global_lr=0.01", "FedAdam_s0"), fake("FedYogi global_lr=0.01", "FedYogi_s0"),
             fake("FedAvgM global_lr=0.3", "FedAvgM_s0")]
    out = tmp_path / "flatness"
    fmnist_flatness.flatness_all(specs, out)
    text = capsys.readouterr().out
    assert "0 of 4 runs measured already, 1 to do, 2 not trained yet, 1 diverged" in text, text
    assert "not trained yet: FADAS global_lr=0.01 seed 0" in text and "diverged, no minimum to measure: FedAdam" in text
    assert "no runs of FedAdamom yet" in text and "[1/1] FedAvg global_lr=1.0 seed 0" in text
    assert sorted(p.name for p in out.iterdir()) == ["FedAvg_s0.json"]
    record = json.loads((out / "FedAvg_s0.json").read_text())
    assert {"label", "seed", "top_eigenvalue", "hvps", "residual", "converged", "rho", "loss_increase",
            "loss_increase_std", "train_loss", "train_accuracy", "test_accuracy", "examples",
            "directions"} <= set(record)
    assert record["label"] == "FedAvg" and record["setting"] == "global_lr=1.0" and record["examples"] == 200
    assert record["rho"] == [0.05] and len(record["loss_increase"]) == 1 and math.isfinite(record["top_eigenvalue"])
    # the training run that wrote the checkpoint, for fedrun reproduce
    assert record["base"] == "configs/quickstart.yaml" and record["overrides"] == [f"run.dir={cnn_run}"]
    before = (out / "FedAvg_s0.json").read_bytes()
    fmnist_flatness.flatness_all(specs, out)
    assert "1 of 4 runs measured already, 0 to do" in capsys.readouterr().out
    assert (out / "FedAvg_s0.json").read_bytes() == before


def test_the_same_loss_step_measures_each_method_at_its_first_round_at_or_below_the_common_loss(tmp_path, capsys,
                                                                                              monkeypatch):
    """experiments/fmnist_flatness.py's same-loss step on three tiny real runs: L* is the largest of the three
    curves' minima, each method is measured at its first round at or below it (the measured model's loss is
    that round's point of its curve), a method outside the claim is left out, the retrained runs are deleted,
    and a second call measures nothing again."""
    sys.path.insert(0, str(REPO / "experiments"))
    import fmnist_flatness

    monkeypatch.setattr(fmnist_flatness, "SETTINGS", {"examples": 200, "rho": (0.05,), "directions": 2,
                                                      "max_hvps": 40, "seed": 0})
    tiny = ["data.num_clients=10", "participation.clients_per_round=3", "local.steps=2", "local.strategy=sequential",
            "eval.every=0", "run.rounds=4", "run.seed=0"]
    methods = {"FedAdamom": ["algorithm.name=fedadamom", "algorithm.global_lr=1.0"],
               "FedAdam": ["algorithm.name=fedadam", "algorithm.global_lr=0.01"],
               "FedAvgM": ["algorithm.name=fedavgm", "algorithm.global_lr=0.3"],
               "FedAvg": ["algorithm.name=fedavg"]}
    specs = [{"group": "g", "label": f"{m} lr", "seed": 0, "base": "configs/quickstart.yaml",
              "overrides": [*tiny, *o, f"run.dir={tmp_path / 'committed' / m}"],
              "summary": str(tmp_path / "summaries" / f"{m}_s0.json")} for m, o in methods.items()]
    out, runs = tmp_path / "same_loss", tmp_path / "retrained"
    fmnist_flatness.same_loss_all(specs, out, runs)
    assert "0 of 1 seeds measured already, 1 to do" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["FedAdam_s0.json", "FedAdamom_s0.json", "FedAvgM_s0.json"]
    records = [json.loads((out / f"{m}_s0.json").read_text()) for m in ("FedAdamom", "FedAdam", "FedAvgM")]
    target = records[0]["target_loss"]
    assert target == max(min(r["loss_curve"]) for r in records)
    for r in records:
        curve = r["loss_curve"]
        assert r["target_loss"] == target and r["rounds_trained"] == len(curve) == 4
        assert r["round"] == 1 + next(i for i, v in enumerate(curve) if v <= target)
        assert r["train_loss"] == curve[r["round"] - 1]  # the measured model is that round's checkpoint
        # the retraining run that wrote the checkpoint (fedrun reproduce reruns it)
        assert r["base"] == "configs/quickstart.yaml" and "checkpoint.every=1" in r["overrides"]
        assert f"run.dir={Path(r['checkpoint']).parent}" in r["overrides"]
    assert any(r["train_loss"] == target for r in records)  # the method that sets L*, at its lowest point
    assert list(runs.iterdir()) == [] and not (tmp_path / "committed").exists()
    before = (out / "FedAdam_s0.json").read_bytes()
    fmnist_flatness.same_loss_all(specs, out, runs)
    assert "1 of 1 seeds measured already, 0 to do" in capsys.readouterr().out
    assert (out / "FedAdam_s0.json").read_bytes() == before
