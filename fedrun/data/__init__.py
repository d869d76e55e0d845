"""Datasets: one registry from ``data.name`` to the data, held in memory or read per client on demand.

Every name is a :class:`DatasetFormat` of :data:`DATASETS` (the built-ins, the on-disk formats under
``data.root``, the on-demand sources), or ``package.module:loader``, a plugin with the same contract:
``loader(cfg: DataConfig, seed: int)`` returns either

* a :class:`~fedrun.data.dataset.TaskData`: the examples held in memory, cut into ``data.num_clients``
  clients by ``data.partition`` (its optional ``groups`` are each training example's natural client), or
* a :class:`~fedrun.data.client_source.ClientSource`: the clients' examples read per client on demand
  (docs/scale.md), N and every client's size fixed by the source, nothing per example held whole.

:func:`open_dataset` gives either; :func:`load_task` the in-memory kind only (the tools that need the whole
training set: export, data statistics). docs/extending.md writes one of each kind ("A dataset", "A dataset format").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedrun.config import DataConfig
from fedrun.data.builtin import arrays_source, load_arrays, load_least_squares, load_mnist5k, load_synthetic
from fedrun.data.client_source import ClientSource
from fedrun.data.dataset import TaskData
from fedrun.data.federated_h5 import FederatedH5
from fedrun.data.sources import ON_DISK, load_dataset
from fedrun.data.synthetic_fedprox import SyntheticFedprox
from fedrun.data.validate import check_task
from fedrun.errors import ConfigError, DataError, brief
from fedrun.plugins import call, is_import_path, load

Data = TaskData | ClientSource
PLUGIN_CONTRACT = "a loader (cfg: DataConfig, seed: int) -> TaskData or ClientSource"


@dataclass(frozen=True)
class DatasetFormat:
    """How one ``data.name`` becomes data: ``open(cfg, seed)``, a TaskData when not ``on_demand``, else a
    ClientSource; ``on_disk``: it reads files under ``data.root`` (named in its messages)."""

    open: Callable[[DataConfig, int], Data]
    on_demand: bool = False
    on_disk: bool = False


def _from_root(name: str) -> Callable[[DataConfig, int], TaskData]:
    def open_(cfg: DataConfig, seed: int) -> TaskData:
        return load_dataset(name, cfg.root, seed, cfg.test_fraction)

    return open_


DATASETS: dict[str, DatasetFormat] = {
    "mnist5k": DatasetFormat(load_mnist5k),
    "synthetic": DatasetFormat(load_synthetic),
    "least_squares": DatasetFormat(load_least_squares),
    "arrays": DatasetFormat(load_arrays),
    **{name: DatasetFormat(_from_root(name), on_disk=True) for name in ON_DISK},
    "synthetic_fedprox": DatasetFormat(SyntheticFedprox, on_demand=True),
    "federated_h5": DatasetFormat(FederatedH5, on_demand=True),
}


def open_dataset(cfg: DataConfig, seed: int) -> Data:
    """The data ``data.name`` names, checked at the door: a TaskData by :func:`~fedrun.data.validate.check_task`
    (DataError naming file, array and index), a plugin's ClientSource by :func:`check_source`."""
    if is_import_path(cfg.name):
        loader = load(cfg.name, "data.name", PLUGIN_CONTRACT, callable)
        data = call("data.name", cfg.name, PLUGIN_CONTRACT, loader, cfg, seed)
        if isinstance(data, ClientSource):
            check_source(data, f"data.name={cfg.name}")
            if data.num_clients != cfg.num_clients:
                raise ConfigError(f"data.num_clients: expected {data.num_clients} (the clients of data.name="
                                  f"{cfg.name}), got {cfg.num_clients}")
            return data
        if not isinstance(data, TaskData):
            raise ConfigError(f"data.name: {cfg.name} returned {type(data).__name__}; expected "
                              "fedrun.data.dataset.TaskData or fedrun.data.client_source.ClientSource")
        check_task(data, f"data.name={cfg.name}")
        return data
    fmt = DATASETS.get(cfg.name)
    if fmt is None:
        raise DataError(f"data.name: expected one of {', '.join(sorted(DATASETS))}, got {brief(cfg.name)}")
    data = fmt.open(cfg, seed)
    if isinstance(data, TaskData):
        if cfg.name == "arrays":
            source: str | dict[str, str] = arrays_source(Path(cfg.root))
        else:
            source = f"data.name={cfg.name}" + (f" (data.root={cfg.root})" if fmt.on_disk else "")
        check_task(data, source)
    return data


def load_task(cfg: DataConfig, seed: int) -> TaskData:
    """The in-memory dataset ``data.name`` names (built-in, from ``data.root`` on disk, or a plugin loader)."""
    fmt = DATASETS.get(cfg.name)
    if fmt is not None and fmt.on_demand:
        raise DataError(f"data.name={cfg.name}: is read per client on demand (docs/scale.md), never held whole; "
                        "expected a dataset held in memory here")
    data = open_dataset(cfg, seed)
    if not isinstance(data, TaskData):
        raise DataError(f"data.name={cfg.name}: returned a ClientSource read per client on demand, never held "
                        "whole; expected a dataset held in memory here")
    return data


def check_source(source: ClientSource, where: str) -> ClientSource:
    """A plugin's on-demand source, checked before any client is read: a TaskData describing it, and every
    client's example counts as non-negative integers (one DataError line naming ``where`` otherwise)."""
    if not isinstance(getattr(source, "resident", None), bool):
        raise DataError(f"{where}: the ClientSource's resident is {brief(getattr(source, 'resident', None))}; "
                        "expected True (a rank loads its clients once) or False (per round, on demand)")
    if not isinstance(getattr(source, "task", None), TaskData):
        raise DataError(f"{where}: the ClientSource's task is {type(getattr(source, 'task', None)).__name__}; "
                        "expected a fedrun.data.dataset.TaskData (name, shapes, classes, the pooled test set)")
    for field in ("num_examples", "test_examples"):
        counts = getattr(source, field, None)
        if counts is None and field == "test_examples":
            continue
        counts = np.asarray(counts)
        if counts.ndim != 1 or not np.issubdtype(counts.dtype, np.integer) or (counts < 0).any():
            raise DataError(f"{where}: the ClientSource's {field} is {brief(counts)}; expected one non-negative "
                            "integer per client")
    if source.num_clients == 0:
        raise DataError(f"{where}: the ClientSource has no clients; expected at least one")
    return source


__all__ = ["DATASETS", "DataError", "DatasetFormat", "TaskData", "load_task", "open_dataset"]
