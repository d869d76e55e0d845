"""``fedrun flatness``: the top Hessian eigenvalue and the perturbation loss increase against their equations on
a float64 least-squares problem (H = (1/n) A^T A for the loss 1/2 (a^T x - b)^2), then the command on a real
two-round CNN run's checkpoint (JSON fields, finite, the same for the same seed) and its bad inputs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import zlib

import numpy as np
import pytest
import torch
from helpers import REPO, child_env, run_ranks

from fedrun.cli import main
from fedrun.flatness import SampleLoss, loss_increase, random_directions, top_eigenvalue
from fedrun.models.linear import LinearNoBias
from fedrun.training.flat_model import FlatModel
from fedrun.training.losses import half_squared_error


def least_squares(n: int = 40, d: int = 6) -> tuple[SampleLoss, np.ndarray, np.ndarray]:
    """L(x) = (1/n) sum_j 1/2 (a_j^T x - b_j)^2 as a SampleLoss (chunks of 7: several chunks summed), its
    Hessian (1/n) A^T A and its minimiser."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((n, d)) * np.linspace(0.5, 3.0, d)  # a clear gap between the top eigenvalues
    b = rng.standard_normal(n)
    loss = SampleLoss(FlatModel(LinearNoBias(d).double()), half_squared_error, torch.from_numpy(a),
                      torch.from_numpy(b), batch_size=7)
    return loss, a.T @ a / n, np.linalg.lstsq(a, b, rcond=None)[0]


def test_top_eigenvalue_is_the_largest_of_numpy_eigvalsh():
    loss, hessian, x_star = least_squares()
    x = torch.from_numpy(x_star + 1.0)  # H does not depend on x for a quadratic
    np.testing.assert_allclose(loss.hvp(x, torch.ones(6, dtype=torch.float64)).numpy(), hessian @ np.ones(6),
                               rtol=1e-12)
    value, used = top_eigenvalue(lambda v: loss.hvp(x, v), 6, iterations=500, seed=0, tol=1e-14)
    expected = np.linalg.eigvalsh(hessian)[-1]
    assert abs(value - expected) <= 1e-6 * expected
    assert 1 < used < 500  # stopped by the relative change, not the iteration cap
    again = top_eigenvalue(lambda v: loss.hvp(x, v), 6, iterations=500, seed=0, tol=1e-14)
    assert again == (value, used)
    capped, used_capped = top_eigenvalue(lambda v: loss.hvp(x, v), 6, iterations=2, seed=0, tol=1e-14)
    assert used_capped == 2 and capped < expected  # a Rayleigh quotient short of convergence is below lambda_max


def test_loss_increase_at_the_minimum_is_half_r2_uHu_for_the_same_directions():
    loss, hessian, x_star = least_squares()
    x = torch.from_numpy(x_star)
    rhos, count, seed = (0.01, 0.1, 0.5), 7, 4
    means, stds = loss_increase(loss.value, x, rhos, count, seed)
    u = random_directions(6, count, seed).numpy()
    np.testing.assert_allclose(np.linalg.norm(u, axis=1), 1.0, rtol=1e-14)
    quad = np.einsum("md,de,me->m", u, hessian, u)  # u_m^T H u_m
    for rho, mean, std in zip(rhos, means, stds, strict=True):
        r = rho * np.linalg.norm(x_star)
        expected = 0.5 * r**2 * quad
        np.testing.assert_allclose(mean, expected.mean(), rtol=1e-8)
        np.testing.assert_allclose(std, expected.std(), rtol=1e-6)
    other, _ = loss_increase(loss.value, x, rhos, count, seed + 1)
    assert other != means  # another seed draws other directions


TINY = ["--config", "configs/quickstart.yaml", "data.num_clients=10", "participation.clients_per_round=3",
        "local.steps=2", "local.strategy=sequential", "eval.every=0", "run.rounds=2"]


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("flat") / "run"
    run_ranks(0, ["-m", "fedrun", "train", "--quiet", *TINY, f"run.dir={run}"])
    return run


def flatness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fedrun", "flatness", *args], capture_output=True, text=True,
                          env=child_env(), cwd=REPO, timeout=300)


def test_flatness_of_a_cnn_checkpoint_is_finite_and_repeats_for_the_same_seed(cnn_run):
    small = ["--examples", "300", "--directions", "3", "--iterations", "5", "--rho", "0.01", "0.1"]
    first = flatness(str(cnn_run), *small, "--json")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert set(out) == {"checkpoint", "round", "examples", "seed", "top_eigenvalue", "iterations", "rho",
                        "directions", "loss_increase", "loss_increase_std", "train_loss", "train_accuracy",
                        "test_accuracy"}
    assert out["round"] == 2 and out["examples"] == 300 and out["directions"] == 3 and out["rho"] == [0.01, 0.1]
    assert out["checkpoint"].endswith("ckpt_00000002.h5") and 1 <= out["iterations"] <= 5
    numbers = [out["top_eigenvalue"], out["train_loss"], out["train_accuracy"], out["test_accuracy"],
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


@pytest.mark.parametrize("args, names", [
    (["{missing}"], "checkpoint file not found"),
    (["{not_ckpt}"], "not_a_checkpoint.h5"),
    (["{run}", "--examples", "0"], "--examples"),
    (["{run}", "--rho", "nan"], "--rho"),
    (["{run}", "--rho", "-0.1"], "--rho"),
    (["{run}", "--iterations", "2.5"], "--iterations"),
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
                                                      "iterations": 3, "seed": 0})
    summaries = tmp_path / "summaries"
    summaries.mkdir()
    (summaries / "FedAvg_s0.json").write_text('{"finite": true}\n')
    (summaries / "FedAdam_s0.json").write_text('{"finite": false}\n')
    (summaries / "FedYogi_s0.json").write_text('{"finite": true}\n')

    def fake(label: str, name: str) -> dict:
        return {"label": label, "seed": 0, "summary": str(summaries / f"{name}.json"),
                "overrides": [f"run.dir={cnn_run}"]}

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
    assert {"label", "seed", "top_eigenvalue", "iterations", "rho", "loss_increase", "loss_increase_std",
            "train_loss", "train_accuracy", "test_accuracy", "examples", "directions"} <= set(record)
    assert record["label"] == "FedAvg" and record["setting"] == "global_lr=1.0" and record["examples"] == 200
    assert record["rho"] == [0.05] and len(record["loss_increase"]) == 1 and math.isfinite(record["top_eigenvalue"])
    before = (out / "FedAvg_s0.json").read_bytes()
    fmnist_flatness.flatness_all(specs, out)
    assert "1 of 4 runs measured already, 0 to do" in capsys.readouterr().out
    assert (out / "FedAvg_s0.json").read_bytes() == before
