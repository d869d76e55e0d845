"""Algorithm registry: ``name -> Algorithm subclass``. One file per algorithm family; ``algorithm.name``
may also be ``package.module:Class``, an :class:`Algorithm` subclass outside fedrun (docs/extending.md)."""

from __future__ import annotations

import dataclasses

from fedrun.algorithms.base import Algorithm
from fedrun.algorithms.fadamgc import FAdamGC
from fedrun.algorithms.fadas import FADAS
from fedrun.algorithms.fafed import FAFED
from fedrun.algorithms.fedadamom import FedAdamom
from fedrun.algorithms.fedau import FedAU
from fedrun.algorithms.fedavg import FedAvg
from fedrun.algorithms.fedawe import FedAWE
from fedrun.algorithms.fedcada import FedCAda
from fedrun.algorithms.fedmedian import FedMedian
from fedrun.algorithms.fedopt import FedAdagrad, FedAdam, FedAvgM, FedYogi
from fedrun.algorithms.fedprox import FedProx
from fedrun.algorithms.fedsum import FedSum, FedSumB, FedSumCR
from fedrun.algorithms.fedtrimmedavg import FedTrimmedAvg
from fedrun.algorithms.krum import Krum
from fedrun.algorithms.memory import FedVarp, Mifa
from fedrun.algorithms.scaffold import Scaffold
from fedrun.errors import brief
from fedrun.plugins import is_import_path, load

ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (
    FedAvg, FedProx,
    FedAvgM, FedAdam, FedYogi, FedAdagrad, FedAdamom, Mifa, FedVarp, FedAU, FedAWE,
    FedSumB, FedSum, FedSumCR, Scaffold, FAdamGC,
    FADAS, FedCAda, FAFED,
    FedMedian, FedTrimmedAvg, Krum,
)}


def get_algorithm(name: str) -> type[Algorithm]:
    """The class registered under ``name`` or imported from ``package.module:Class`` (``ConfigError``
    naming ``algorithm.name`` when it cannot be); ``KeyError`` with the known names otherwise."""
    if is_import_path(name):
        return load(name, "algorithm.name", "a subclass of fedrun.algorithms.base.Algorithm with an Hparams dataclass",
                    lambda obj: isinstance(obj, type) and issubclass(obj, Algorithm)
                    and dataclasses.is_dataclass(getattr(obj, "Hparams", None)))
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise KeyError(f"unknown algorithm {brief(name)} (known: {', '.join(sorted(ALGORITHMS))})") from None
