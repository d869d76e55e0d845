"""Checks of a whole config that need the data or this machine: does the model fit the dataset, are
there the CPUs for ``run.threads``, can the run write its sinks (TensorBoard's folder, MLflow's store)?

``fedrun sweep`` runs them on every task before anything is queued (fedrun.sweep.validate), and the
round engine's build step calls :func:`check_model_fits_data` too, so a mismatch is one line naming the
model, the input shape it expects and the data's, instead of a matmul error from inside a rank.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedrun.errors import ConfigError

if TYPE_CHECKING:
    from fedrun.config import Config, MetricsConfig, RunConfig
    from fedrun.data.dataset import TaskData

# The input each model is built for, per example (C: any channel count; F: any feature count; L: any
# sequence length). Only what the error message says: the check itself builds the model and runs it.
EXPECTED_INPUT: dict[str, str] = {
    "cnn_mnist": "[C, 28, 28] images",
    "cnn_svhn": "[C, 32, 32] images",
    "cnn_cifar10": "[C, 32, 32] images",
    "cnn_femnist": "[C, H, W] images (H, W >= 4)",
    "resnet18": "[C, H, W] images",
    "resnet18_bn": "[C, H, W] images",
    "logistic": "features or images of any shape (flattened)",
    "linear": "[F] features (regression)",
    "lstm_shakespeare": "[L] int64 token ids",
    "lstm_shakespeare_unrolled": "[L] int64 token ids",
}


def check_threads(run: RunConfig) -> None:
    """Raise :class:`ConfigError` unless ``run.threads`` is at most the CPUs this process may run on (its
    affinity mask): more intra-op threads than CPUs only contend, and torch crashes at some thousands
    (``run.threads=100000`` ended in a segmentation fault). Checked where a rank starts, not on a login
    node that validates a sweep for other machines."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    if run.threads > cpus:
        raise ConfigError(f"run.threads: expected at most the {cpus} CPU(s) this process may use, got "
                          f"{run.threads}")


def check_sinks(metrics: MetricsConfig, run_dir: Path | None) -> None:
    """Raise :class:`ConfigError` (one line, nothing written) for a sink the run could not write, before the
    run directory is touched: ``<run.dir>/tensorboard`` a file or not writable (TensorBoard's writer raised
    FileExistsError mid-start-up), a ``metrics.mlflow`` that is neither a tracking URI of a known scheme nor
    an existing directory, or a SQLite store on a read-only mount (MLflow retried for 105 s)."""
    if run_dir is None:
        return
    board = run_dir / "tensorboard"
    if metrics.tensorboard and (board.exists() or board.is_symlink()):
        if not board.is_dir():
            raise ConfigError(f"metrics.tensorboard: {board} is a file; expected a directory for TensorBoard's "
                              "event files (move the file, or metrics.tensorboard=false)")
        if not os.access(board, os.W_OK | os.X_OK):
            raise ConfigError(f"metrics.tensorboard: {board} is not writable; expected a writable directory "
                              "(or metrics.tensorboard=false)")
    if metrics.mlflow:
        from fedrun.metrics.mlflow import tracking_uri

        tracking_uri(metrics.mlflow, run_dir)


def check_model_fits_data(cfg: Config, task: TaskData | None = None) -> None:
    """Raise :class:`ConfigError` (one line: model, expected and actual input shape) unless
    ``cfg.model.name`` built for ``cfg.data``'s input shape takes one example and returns what the task's
    loss needs ([1, classes] logits for classification, [1] for regression).

    ``task``: the loaded dataset, when the caller has it (the round engine); else it is loaded here.
    Cost: one model build and one forward pass on one example, on the CPU.
    """
    if task is None:
        from fedrun.data import open_dataset
        from fedrun.data.client_source import ClientSource

        data = open_dataset(cfg.data, cfg.run.seed)
        task = data.task if isinstance(data, ClientSource) else data
    problem = model_data_mismatch(cfg.model.name, task, cfg.model.settings)
    if problem is not None:
        raise ConfigError(problem)


def model_data_mismatch(model_name: str, task: TaskData, settings: Any = None) -> str | None:
    """The one-line reason ``model_name`` (with a plugin's ``settings``) does not fit ``task``, or None when it does."""
    import torch

    from fedrun.models import build_model

    shape = tuple(int(s) for s in task.input_shape)
    kind = "int64 token ids" if np.issubdtype(task.x_train.dtype, np.integer) else "floats"
    got = f"data.name={task.name} gives {_shape(shape)} {kind} per example"
    expected = EXPECTED_INPUT.get(model_name, "the input it was built for")
    head = f"model.name={model_name} does not fit the data: it expects {expected}, {got}"
    if len(task.x_train) == 0:
        return None  # nothing to try it on; the data checks report empty datasets
    example = torch.from_numpy(np.ascontiguousarray(task.x_train[:1]))
    if example.is_floating_point():
        example = example.to(torch.float32)
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():  # the run's seed stays put
            warnings.simplefilter("ignore")  # e.g. "zero-element tensors" of a 0-class head: reported below
            model = build_model(model_name, shape, task.num_classes, settings)
        model.eval()
        with torch.no_grad():
            out = model(example)
    except ConfigError:  # the model itself is refused (an unknown name, a plugin that breaks its contract)
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to build or run it is the mismatch
        return f"{head} ({_first_line(exc)})"
    want = (1, task.num_classes) if task.task == "classification" else (1,)
    if tuple(out.shape) != want:
        what = f"{task.num_classes}-class logits [1, {task.num_classes}]" if task.task == "classification" \
            else "one regression value per example [1]"
        return f"{head}; for one example it returns {_shape(tuple(out.shape))}, the {task.task} task needs {what}"
    return None


def parameter_count(model_name: str, input_shape: tuple[int, ...], num_classes: int, settings: Any = None,
                    ) -> int | None:
    """d, the model's number of parameters, counted on PyTorch's meta device (shapes without storage: a
    model of 10^9 parameters costs nothing to count), or None when the model cannot be built there (the
    real build then reports it)."""
    import torch

    from fedrun.models import build_model

    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = build_model(model_name, tuple(int(s) for s in input_shape), num_classes, settings)
        return sum(p.numel() for p in module.parameters())
    except ConfigError:
        raise
    except Exception:  # noqa: BLE001 - not buildable on the meta device: not counted here
        return None


def _shape(shape: tuple[Any, ...]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."
