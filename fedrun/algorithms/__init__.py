"""Algorithm registry: ``name -> Algorithm subclass``. One file per algorithm family."""

from __future__ import annotations

from fedrun.algorithms.base import Algorithm
from fedrun.algorithms.fadamgc import FAdamGC
from fedrun.algorithms.fadas import FADAS
from fedrun.algorithms.fafed import FAFED
from fedrun.algorithms.fedadamom import FedAdamom
from fedrun.algorithms.fedau import FedAU
from fedrun.algorithms.fedavg import FedAvg
from fedrun.algorithms.fedawe import FedAWE
from fedrun.algorithms.fedcada import FedCAda
from fedrun.algorithms.fedopt import FedAdagrad, FedAdam, FedAvgM, FedYogi
from fedrun.algorithms.fedsum import FedSum, FedSumB, FedSumCR
from fedrun.algorithms.memory import FedVarp, Mifa
from fedrun.algorithms.scaffold import Scaffold

ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (
    FedAvg,
    FedAvgM, FedAdam, FedYogi, FedAdagrad, FedAdamom, Mifa, FedVarp, FedAU, FedAWE,
    FedSumB, FedSum, FedSumCR, Scaffold, FAdamGC,
    FADAS, FedCAda, FAFED,
)}


def get_algorithm(name: str) -> type[Algorithm]:
    """The class registered under ``name``; ``KeyError`` with the known names otherwise."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise KeyError(f"unknown algorithm {name!r} (known: {', '.join(sorted(ALGORITHMS))})") from None
