"""Datasets, partitioners and the per-client data of a rank (resident, or read on demand: ``ON_DEMAND``).

``data.name`` names a built-in dataset, an on-disk one under ``data.root``, or ``package.module:loader``:
a ``(cfg: DataConfig, seed: int) -> TaskData`` outside fedrun, whose ``groups`` (optional) are the
natural client of every training example (docs/extending.md)."""

from __future__ import annotations

from collections.abc import Callable

from fedrun.config import DataConfig
from fedrun.data.builtin import load_arrays, load_least_squares, load_mnist5k, load_synthetic
from fedrun.data.client_source import ClientSource
from fedrun.data.dataset import TaskData
from fedrun.data.federated_h5 import FederatedH5
from fedrun.data.sources import DATASETS, load_dataset
from fedrun.data.synthetic_fedprox import SyntheticFedprox
from fedrun.errors import ConfigError, DataError
from fedrun.plugins import call, is_import_path, load

BUILTIN: dict[str, Callable[[DataConfig, int], TaskData]] = {
    "mnist5k": load_mnist5k,
    "synthetic": load_synthetic,
    "least_squares": load_least_squares,
    "arrays": load_arrays,
}

#: Datasets read per client on demand (docs/scale.md): ``(cfg, seed) -> ClientSource``.
ON_DEMAND: dict[str, Callable[[DataConfig, int], ClientSource]] = {
    "synthetic_fedprox": SyntheticFedprox,
    "federated_h5": FederatedH5,
}


def load_task(cfg: DataConfig, seed: int) -> TaskData:
    """Load the dataset named by ``data.name`` (built-in, from ``data.root`` on disk, or a plugin loader)."""
    if is_import_path(cfg.name):
        contract = "a loader (cfg: DataConfig, seed: int) -> TaskData"
        loader = load(cfg.name, "data.name", contract, callable)
        task = call("data.name", cfg.name, contract, loader, cfg, seed)
        if not isinstance(task, TaskData):
            raise ConfigError(f"data.name: {cfg.name} returned {type(task).__name__}; expected "
                              "fedrun.data.dataset.TaskData")
        n, m = len(task.x_train), len(task.x_test)
        sizes_ok = len(task.y_train) == n and len(task.y_test) == m and (task.groups is None or len(task.groups) == n)
        if not sizes_ok or n == 0:
            raise ConfigError(f"data.name: {cfg.name} returned arrays of lengths x_train {n}, y_train "
                              f"{len(task.y_train)}, x_test {m}, y_test {len(task.y_test)}, groups "
                              f"{None if task.groups is None else len(task.groups)}; expected one row per example")
        return task
    if cfg.name in BUILTIN:
        return BUILTIN[cfg.name](cfg, seed)
    if cfg.name in DATASETS:
        return load_dataset(cfg.name, cfg.root, seed, cfg.test_fraction)
    known = ", ".join(sorted([*BUILTIN, *DATASETS, *ON_DEMAND]))
    raise DataError(f"data.name: expected one of {known}, got {cfg.name!r}")


__all__ = ["ON_DEMAND", "DataError", "TaskData", "load_task"]
