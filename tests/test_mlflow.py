"""``metrics.mlflow``: a real ``mlflow server`` on loopback, a real 2-rank run logging to it, and the run read
back with MLflow's own client (parameters, per-round metrics, per-client arrays, provenance)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from helpers import metrics, run_ranks, train_args

pytest.importorskip("mlflow", reason="the mlflow extra (pip install 'fedrun[mlflow]'; make installs it)")
from mlflow.tracking import MlflowClient  # noqa: E402

pytestmark = pytest.mark.mpi


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    port = _free_port()
    mlflow = Path(sys.executable).parent / "mlflow"
    store = tmp_path / "server"
    store.mkdir()
    log = (store / "server.log").open("w")
    proc = subprocess.Popen([str(mlflow if mlflow.exists() else shutil.which("mlflow")), "server", "--host",
                             "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
                             "--artifacts-destination", str(store / "artifacts")],
                            cwd=store, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            assert proc.poll() is None, (store / "server.log").read_text()
            time.sleep(0.5)
    else:
        pytest.fail("mlflow server did not answer within 180 s: " + (store / "server.log").read_text()[-2000:])
    yield uri
    os.killpg(proc.pid, signal.SIGTERM)  # the server and its workers: the group this fixture started
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    log.close()


def test_a_two_rank_run_logs_params_metrics_client_arrays_and_provenance(tmp_path, mlflow_server):
    run = tmp_path / "run"
    extra = [f"metrics.mlflow={mlflow_server}", "metrics.mlflow_experiment=fedrun-test", "run.name=tracked",
             "data.client_test_fraction=0.25", "data.least_squares.rows_per_client=8", "eval.every=2"]
    run_ranks(2, train_args(run, 4, extra), timeout=300)
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("fedrun-test")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1  # rank 0 only
    logged = runs[0]
    assert logged.info.run_name == "tracked" and logged.info.status == "FINISHED"
    assert logged.data.params["local.lr"] == "0.05" and logged.data.params["run.rounds"] == "4"
    history = client.get_metric_history(logged.info.run_id, "train_loss")
    records = metrics(run)
    assert [m.step for m in history] == [1, 2, 3, 4]
    np.testing.assert_allclose([m.value for m in history], [r["train_loss"] for r in records])
    assert [m.step for m in client.get_metric_history(logged.info.run_id, "client_loss_mean")] == [2, 4]
    artifacts = {a.path for a in client.list_artifacts(logged.info.run_id, "clients")}
    assert artifacts == {"clients/round_00000002.npz", "clients/round_00000004.npz"}
    local = client.download_artifacts(logged.info.run_id, "clients/round_00000004.npz", str(tmp_path))
    with np.load(local) as arrays:
        assert arrays["loss"].shape == (7,)  # one value per client (N = 7)
    provenance = client.download_artifacts(logged.info.run_id, "provenance.json", str(tmp_path))
    assert '"started"' in Path(provenance).read_text()
    assert logged.data.tags["provenance.fedrun"] == __import__("fedrun").__version__


def test_true_logs_to_mlflow_tracking_uri_else_to_sqlite_under_the_run_dir_never_the_working_directory(tmp_path):
    """``metrics.mlflow=true`` with MLFLOW_TRACKING_URI unset: a SQLite store ``<run.dir>/mlflow.db`` with the
    artifacts beside it; with MLFLOW_TRACKING_URI set: that store. The working directory stays empty (MLflow's
    default artifact root is ``./mlruns``)."""
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    base = ["-m", "fedrun", "train", "--quiet", "run.rounds=2", "data.name=least_squares", "data.num_clients=12",
            "data.partition=iid", "model.name=linear", "data.client_test_fraction=0.3", "eval.every=1",
            "metrics.mlflow=true"]
    run_dir = tmp_path / "own"
    proc = subprocess.run([sys.executable, *base, f"run.dir={run_dir}"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    own = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    run = own.get_run(json.loads((run_dir / "mlflow_run.json").read_text())["run_id"])
    assert run.data.params["run.rounds"] == "2" and run.info.status == "FINISHED"
    assert run.info.artifact_uri.startswith((run_dir / "mlartifacts").as_uri())
    assert [a.path for a in own.list_artifacts(run.info.run_id, "clients")]  # the per-client arrays
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'shared.db'}"
    proc = subprocess.run([sys.executable, *base, f"run.dir={tmp_path / 'env'}"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "shared.db").is_file() and not (tmp_path / "env" / "mlflow.db").exists()
    assert list(work.iterdir()) == []
