"""MLflow tracking (``metrics.mlflow``), rank 0 only. Where it logs (:func:`tracking_uri`):

* ``true``: ``MLFLOW_TRACKING_URI`` when it is set (the convention of every MLflow tool), else a SQLite store
  ``<run_dir>/mlflow.db``;
* a URI (``http://host:port``, ``sqlite:///path``, ``postgresql://...``): that store;
* a directory (or a ``file:`` URI), the local store of older MLflow versions: a SQLite store ``mlflow.db`` in
  it (MLflow 3's directory store is in maintenance mode and fails on start).

Artifacts of an experiment fedrun creates in a SQLite store go next to the database (``mlartifacts/``),
never into the working directory (MLflow's default ``./mlruns``); a server decides for itself.

One MLflow run per fedrun run, in the experiment ``metrics.mlflow_experiment``, named ``run.name``:

* parameters: every key of the resolved config, dotted (``local.lr``), plugin digests included;
* metrics: every numeric field of a metrics.jsonl record, with step = the round r (counting from 1);
* artifacts: each evaluation's per-client arrays as ``clients/round_<r>.npz`` (the arrays of clients.h5)
  and the run's provenance as ``provenance.json`` (its scalar fields also as ``provenance.*`` tags).

The MLflow run id is kept in ``<run_dir>/mlflow_run.json``, so a resumed run goes on logging to the same
MLflow run (a redone round logs its step again). Written with MLflow's own client
(``pip install 'fedrun[mlflow]'``; ``make`` installs it).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedrun.config import MetricsConfig
from fedrun.errors import ConfigError, RunFailure
from fedrun.metrics.log import flatten
from fedrun.metrics.observer import Arrays, Observer

RUN_FILE = "mlflow_run.json"


class MlflowLog(Observer):
    """The MLflow run of a fedrun run, an observer of its rounds (:mod:`fedrun.metrics.observer`)."""

    def __init__(self, run_dir: Path | None, cfg: MetricsConfig, run_name: str, params: dict[str, Any]) -> None:
        """Start (or, on resume, continue) the MLflow run ``run_name`` and log ``params`` (the resolved config,
        dotted keys); ``run_dir``: the run directory (None: log nothing). An unreachable URI is a
        :class:`ConfigError`."""
        self.client = None
        self.run_id = ""
        if run_dir is None:
            return
        try:
            uri = tracking_uri(cfg.mlflow, run_dir)
        except OSError as exc:
            raise ConfigError(f"metrics.mlflow={cfg.mlflow}: cannot create the local store there "
                              f"({exc.strerror or exc}); expected a writable directory or a tracking URI") from None
        # MLflow retries a failed request 7 times with doubling waits (minutes); 3 keeps an unreachable
        # server a one-line error within seconds, and still rides out a brief hiccup mid-run
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "3")
        try:
            from mlflow.entities import Metric, RunStatus
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise ConfigError("metrics.mlflow: expected the mlflow package to be installed "
                              "(pip install 'fedrun[mlflow]'), or metrics.mlflow=null") from None
        self._metric, self._status = Metric, RunStatus
        try:
            self.client = MlflowClient(tracking_uri=uri)
            record = run_dir / RUN_FILE
            previous = json.loads(record.read_text()) if record.is_file() else {}
            if previous.get("tracking_uri") == uri and previous.get("run_id"):
                self.run_id = previous["run_id"]
                self.client.update_run(self.run_id, status="RUNNING")
                return
            name = cfg.mlflow_experiment
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(
                name, artifact_location=artifact_root(uri))
            self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
            record.write_text(json.dumps({"tracking_uri": uri, "run_id": self.run_id}) + "\n")
            self.client.log_batch(self.run_id, params=[
                _param(k, v if isinstance(v, str) else json.dumps(v)) for k, v in params.items()])
        except Exception as exc:
            raise ConfigError(f"metrics.mlflow: cannot start an MLflow run at {uri!r}: {_why(exc)}") from None

    def on_start(self, provenance: dict[str, Any]) -> None:
        """``provenance.json``, and its dotted scalar fields as ``provenance.*`` tags."""
        if self.client is None:
            return
        try:
            self.client.log_dict(self.run_id, provenance, "provenance.json")
            for key, value in flatten(provenance).items():
                if isinstance(value, (str, int, float)) and value != "":
                    self.client.set_tag(self.run_id, f"provenance.{key}", str(value)[:5000])
        except Exception as exc:
            raise RunFailure(f"metrics.mlflow: logging the provenance failed: {_why(exc)}") from None

    def on_round_end(self, entry: dict[str, Any], arrays: Arrays) -> None:
        """The round's numeric fields as metrics (step = round) and its per-client arrays as an artifact."""
        if self.client is None:
            return
        step, now = int(entry["round"]), int(time.time() * 1000)
        metrics = [self._metric(k, float(v), now, step) for k, v in entry.items()
                   if k != "round" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
        try:
            self.client.log_batch(self.run_id, metrics=metrics)
            if arrays:
                with tempfile.TemporaryDirectory() as tmp:
                    path = Path(tmp) / f"round_{step:08d}.npz"
                    np.savez(path, **arrays)
                    self.client.log_artifact(self.run_id, str(path), "clients")
        except Exception as exc:
            raise RunFailure(f"metrics.mlflow: logging round {step} failed: {_why(exc)}") from None

    def on_stop(self, finished: bool) -> None:
        """Mark the MLflow run FINISHED (all rounds done) or KILLED (stopped; a resume continues it)."""
        if self.client is not None:
            status = self._status.to_string(self._status.FINISHED if finished else self._status.KILLED)
            try:
                self.client.set_terminated(self.run_id, status)
            except Exception:  # the run's own outcome is what the user needs to see; MLflow shows RUNNING
                pass
            self.client = None


def tracking_uri(setting: bool | str, run_dir: Path) -> str:
    """The tracking URI of ``metrics.mlflow`` = ``setting`` (see the module docstring)."""
    if setting is True:
        return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
    text = str(setting)
    if text.startswith("file:"):
        text = text[len("file://"):] if text.startswith("file://") else text[len("file:"):]
    elif "://" in text or text.startswith("databricks"):
        return text
    directory = Path(text).expanduser().resolve()
    directory.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{directory / 'mlflow.db'}"


def artifact_root(uri: str) -> str | None:
    """Where a new experiment of a SQLite store keeps its artifacts: ``mlartifacts/`` beside the database
    (None: the store's or server's own choice)."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()


def _why(exc: BaseException) -> str:
    """MLflow's whole message on one line (it may span lines; none of it is cut)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _param(key: str, value: str) -> Any:
    from mlflow.entities import Param

    return Param(key, value[:6000])
