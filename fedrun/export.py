"""``fedrun export RUN --out model.pt``: a run's global model as a PyTorch ``state_dict`` file.

The model is rebuilt as the run built it (``model.name`` for the dataset's input shape and classes, from
the checkpoint's resolved config) and its parameters are set to the checkpoint's global model ``server/x``,
so ``module.load_state_dict(torch.load("model.pt"))`` works on ``fedrun.models.build_model(...)`` of the
same name and shapes. Buffers (batch-norm statistics) are the freshly built module's.
:func:`read_global_model` and :func:`rebuild_module` are also what ``fedrun flatness`` starts from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from fedrun.checkpoint import CheckpointReader, find_latest_valid
from fedrun.checkpoint.format import SERVER
from fedrun.config import Config, config_from_dict
from fedrun.data import load_task
from fedrun.errors import CheckpointError, ConfigError
from fedrun.federation.snapshot import saved_config
from fedrun.models import build_model
from fedrun.training.flat_model import module_at


@dataclass
class SavedModel:
    """The global model of a checkpoint: where it came from, the run's resolved config, its flat vector."""

    checkpoint: Path
    cfg: Config
    x: torch.Tensor  # server/x, in the model's named_parameters() order
    rounds: int  # rounds done


def read_global_model(source: str | Path) -> SavedModel:
    """The global model of ``source``: a run directory (its newest valid checkpoint) or a checkpoint file."""
    source = Path(source)
    path = find_latest_valid(source) if source.is_dir() else source
    if path is None:
        raise CheckpointError(f"{source}: no valid checkpoint in this run directory (expected ckpt_*.h5)")
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found (expected a run directory or a ckpt_*.h5)")
    try:
        cfg = config_from_dict(saved_config(path))
    except ConfigError as exc:
        raise CheckpointError(f"{path}: meta/config is not a valid config ({exc})") from None
    with CheckpointReader(path) as ckpt:
        x = torch.as_tensor(ckpt.read(f"{SERVER}/x"))
        done = ckpt.round
    return SavedModel(path, cfg, x, done)


def rebuild_module(saved: SavedModel, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """``model.name`` built as the run built it (seeded, in ``run.dtype``) with the checkpoint's parameters."""
    cfg = saved.cfg
    torch.manual_seed(cfg.run.seed)
    dtype = torch.float64 if cfg.run.dtype == "float64" else torch.float32
    module = build_model(cfg.model.name, input_shape, num_classes, cfg.model.settings).to(dtype=dtype)
    try:
        return module_at(module, saved.x)
    except ValueError as exc:
        raise CheckpointError(f"{saved.checkpoint}: server/x does not fit model {cfg.model.name} ({exc})") from None


def export_model(source: str | Path, out: str | Path) -> tuple[Path, Path, int]:
    """Write the global model of ``source`` (a run directory: its newest valid checkpoint; or a checkpoint
    file) to ``out`` as a state_dict; returns (checkpoint, out, rounds done)."""
    saved = read_global_model(source)
    task = load_task(saved.cfg.data, saved.cfg.run.seed)
    module = rebuild_module(saved, task.input_shape, task.num_classes)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        torch.save(module.state_dict(), tmp)
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"--out {out}: cannot write the file ({exc.strerror or exc})") from None
    return saved.checkpoint, out, saved.rounds
