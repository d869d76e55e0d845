"""Local learning-rate schedules, indexed by the global round t and constant within a round."""

from __future__ import annotations

import math

from fedrun.config import LocalConfig


def local_lr(cfg: LocalConfig, t: int) -> float:
    """eta_l(t): constant; ``inv_sqrt`` eta_0 / sqrt(t/10 + 1) (FedSUM Table 2); ``exponential``
    eta_0 * decay^t (FedAdamom README: 0.998 per round)."""
    if cfg.lr_schedule == "constant":
        return cfg.lr
    if cfg.lr_schedule == "inv_sqrt":
        return cfg.lr / math.sqrt(t / 10 + 1)
    return cfg.lr * cfg.lr_decay**t
