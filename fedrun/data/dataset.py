"""The in-memory form every dataset loader returns, before partitioning into clients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

# what a resident dataset refused for its number of clients is told (docs/scale.md)
ON_DEMAND_HINT = ("for more clients than a resident dataset holds use an on-demand dataset, which reads each "
                  "round's clients only: data.name=synthetic_fedprox, or federated_h5 for per-client HDF5 files "
                  "(docs/scale.md)")


@dataclass
class TaskData:
    """Train and test arrays of one task.

    ``x`` arrays are float32 (images [n, C, H, W] scaled to [0, 1] and normalized, or features [n, f])
    or int64 token sequences; ``y`` is int64 class labels (classification) or float targets
    (regression). ``groups`` gives a natural client index per training example (LEAF writers, the
    rows of a least-squares client) for the ``natural`` partition, else None. ``groups_test`` gives the
    same client index for each test example where the dataset has its own per-user test split (LEAF;
    -1 for a test user without training examples), else None.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    task: Literal["classification", "regression"] = "classification"
    groups: np.ndarray | None = None
    groups_test: np.ndarray | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])
