"""Datasets, partitioners and the device-resident per-client data of a rank."""

from __future__ import annotations

from collections.abc import Callable

from fedrun.config import DataConfig
from fedrun.data.builtin import load_arrays, load_least_squares, load_mnist5k, load_synthetic
from fedrun.data.dataset import TaskData
from fedrun.data.sources import DATASETS, load_dataset
from fedrun.errors import DataError

BUILTIN: dict[str, Callable[[DataConfig, int], TaskData]] = {
    "mnist5k": load_mnist5k,
    "synthetic": load_synthetic,
    "least_squares": load_least_squares,
    "arrays": load_arrays,
}


def load_task(cfg: DataConfig, seed: int) -> TaskData:
    """Load the dataset named by ``data.name`` (built-in, or from ``data.root`` on disk)."""
    if cfg.name in BUILTIN:
        return BUILTIN[cfg.name](cfg, seed)
    if cfg.name in DATASETS:
        return load_dataset(cfg.name, cfg.root, seed, cfg.test_fraction)
    known = ", ".join(sorted([*BUILTIN, *DATASETS]))
    raise DataError(f"data.name: expected one of {known}, got {cfg.name!r}")


__all__ = ["DataError", "TaskData", "load_task"]
