"""FedTrimmedAvg: the coordinate-wise trimmed mean of the round's model deltas (Yin et al., ICML 2018).

Per coordinate j, drop the k = floor(beta n) largest and the k smallest of the n values and average the
other n - 2k:

    x <- x + global_lr * (1 / (n - 2k)) sum_{r = k}^{n-k-1} Delta_(r), j   (Delta_(r) the r-th smallest)

beta < 1/2 keeps at least one value; beta = 0 is the plain mean of the deltas (FedAvg's uniform step).
"""

from __future__ import annotations

import math

from torch import Tensor

from fedrun.algorithms.gathered import GatheredDeltas, sorted_columns
from fedrun.config.hparams import FedTrimmedAvgHparams


class FedTrimmedAvg(GatheredDeltas):
    name = "fedtrimmedavg"
    Hparams = FedTrimmedAvgHparams

    def aggregate(self, deltas: Tensor) -> Tensor:
        n = deltas.shape[0]
        k = math.floor(self.hp.beta * n)
        return sorted_columns(deltas)[k:n - k].mean(dim=0)
