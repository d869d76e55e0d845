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
from fedrun.errors import ConfigError, RunFailure, require_path
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
        uri = tracking_uri(cfg.mlflow, run_dir)  # checked at start-up already (fedrun.preflight.check_sinks)
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


# the schemes MLflow's tracking client takes (a database's "+driver" is cut off before the comparison)
SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc", "file")


def tracking_uri(setting: bool | str, run_dir: Path) -> str:
    """The tracking URI of ``metrics.mlflow`` = ``setting`` (see the module docstring), checked without
    writing anything: a URI of another scheme, a directory that does not exist (``htp:::bad`` would be a
    folder made in the working directory) or a SQLite store MLflow could not write (it retries for minutes)
    is a :class:`ConfigError` naming the setting."""
    if setting is True and not os.environ.get("MLFLOW_TRACKING_URI"):
        return f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"  # the run directory is writable: its lock
    name, text = ("MLFLOW_TRACKING_URI", os.environ["MLFLOW_TRACKING_URI"]) if setting is True else \
        ("metrics.mlflow", str(setting))
    scheme = text.split(":", 1)[0].split("+", 1)[0].lower() if ":" in text else ""
    expected = f"expected true, a tracking URI ({', '.join(SCHEMES)}) or an existing directory"
    if scheme == "file":
        folder = text[len("file://"):] if text.startswith("file://") else text[len("file:"):]
    elif "://" in text or text in ("databricks", "databricks-uc", "uc"):
        if scheme not in SCHEMES:
            raise ConfigError(f"{name}={text}: unknown scheme {scheme!r}; {expected}")
        if scheme == "sqlite" and text[len("sqlite:///"):]:
            require_path(name, text[len("sqlite:///"):])
            _check_writable(name, text, Path(text[len("sqlite:///"):]).expanduser())
        return text
    else:
        folder = text
    require_path(name, folder)
    directory = Path(folder).expanduser()
    if not directory.is_dir():
        raise ConfigError(f"{name}={text}: neither a tracking URI nor an existing directory; {expected}")
    _check_writable(name, text, directory / "mlflow.db")
    return f"sqlite:///{directory.resolve() / 'mlflow.db'}"


def _check_writable(name: str, text: str, database: Path) -> None:
    """Refuse a SQLite store this process cannot write, tried as SQLite would: the file opened for update,
    or (a new store) a scratch file made and removed in its folder, where SQLite keeps its journal. A
    read-only mount, a file system that takes no new files (sysfs), a missing folder: one line, at once;
    MLflow itself retries for 105 s."""
    folder = database.parent
    if not folder.is_dir():
        raise ConfigError(f"{name}={text}: no such directory {folder}; expected the SQLite store's folder to exist")
    try:
        if database.exists():
            with open(database, "r+b"):
                pass
        else:
            handle, scratch = tempfile.mkstemp(prefix=".fedrun-probe-", dir=folder)
            os.close(handle)
            os.unlink(scratch)
    except OSError as exc:
        raise ConfigError(f"{name}={text}: cannot write the SQLite store {database} ({exc.strerror or exc}); "
                          "expected a writable location") from None


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
