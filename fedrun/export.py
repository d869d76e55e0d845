"""``fedrun export RUN --out model.pt``: a run's global model as a PyTorch ``state_dict`` file.

The model is rebuilt as the run built it (``model.name`` for the dataset's input shape and classes, from
the checkpoint's resolved config) and its parameters are set to the checkpoint's global model ``server/x``,
so ``module.load_state_dict(torch.load("model.pt"))`` works on ``fedrun.models.build_model(...)`` of the
same name and shapes. Buffers (batch-norm statistics) are the freshly built module's.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from fedrun.checkpoint import CheckpointReader, find_latest_valid
from fedrun.config import config_from_dict
from fedrun.data import load_task
from fedrun.errors import CheckpointError, ConfigError
from fedrun.federation.snapshot import saved_config
from fedrun.models import build_model
from fedrun.training.flat_model import module_at


def export_model(source: str | Path, out: str | Path) -> tuple[Path, Path, int]:
    """Write the global model of ``source`` (a run directory: its newest valid checkpoint; or a checkpoint
    file) to ``out`` as a state_dict; returns (checkpoint, out, rounds done)."""
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
        x = torch.as_tensor(ckpt.read("server/x"))
        done = int(ckpt.meta["round"])
    task = load_task(cfg.data, cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    dtype = torch.float64 if cfg.run.dtype == "float64" else torch.float32
    module = build_model(cfg.model.name, task.input_shape, task.num_classes, cfg.model.settings).to(dtype=dtype)
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        torch.save(module_at(module, x).state_dict(), tmp)
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"--out {out}: cannot write the file ({exc.strerror or exc})") from None
    return path, out, done
