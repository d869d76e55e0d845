"""A dataset loader: ``(cfg: DataConfig, seed: int) -> TaskData``.

Gaussian blobs in 8 dimensions, 4 classes. There are ``data.num_clients`` natural groups (think of them
as writers): group g draws its labels from its own skewed class mix and shifts every example by its own
offset, so ``data.partition=natural`` gives non-i.i.d. clients. Everything is a function of ``seed``.
"""

from __future__ import annotations

import numpy as np

from fedrun.config import DataConfig
from fedrun.data.dataset import TaskData

FEATURES, CLASSES, PER_CLIENT, TEST = 8, 4, 40, 400


def blobs(cfg: DataConfig, seed: int) -> TaskData:
    rng = np.random.default_rng([seed, 2024])
    means = rng.normal(scale=2.0, size=(CLASSES, FEATURES))
    groups = np.repeat(np.arange(cfg.num_clients), PER_CLIENT)
    mix = rng.dirichlet(np.full(CLASSES, 0.5), size=cfg.num_clients)  # each group's class mix
    y = np.array([rng.choice(CLASSES, p=mix[g]) for g in groups], dtype=np.int64)
    offsets = rng.normal(scale=0.3, size=(cfg.num_clients, FEATURES))
    x = means[y] + offsets[groups] + rng.normal(size=(len(y), FEATURES))
    y_test = rng.integers(0, CLASSES, size=TEST)
    x_test = means[y_test] + rng.normal(size=(TEST, FEATURES))
    return TaskData(name="blobs", x_train=x.astype(np.float32), y_train=y, x_test=x_test.astype(np.float32),
                    y_test=y_test.astype(np.int64), num_classes=CLASSES, groups=groups)
