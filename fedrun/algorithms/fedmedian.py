"""FedMedian: the coordinate-wise median of the round's model deltas (Yin et al., ICML 2018).

    x <- x + global_lr * med(Delta_1, ..., Delta_n),  med_j = the middle value of coordinate j, or the
    mean of the two middle values when n is even.

Robust to fewer than n/2 arbitrary (Byzantine) deltas per coordinate; the uploads are gathered
(fedrun/algorithms/gathered.py).
"""

from __future__ import annotations

from torch import Tensor

from fedrun.algorithms.base import GlobalLrHparams
from fedrun.algorithms.gathered import GatheredDeltas, sorted_columns


class FedMedian(GatheredDeltas):
    name = "fedmedian"
    Hparams = GlobalLrHparams

    def aggregate(self, deltas: Tensor) -> Tensor:
        n = deltas.shape[0]
        ordered = sorted_columns(deltas)
        return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2  # odd n: (a + a) / 2 = a exactly
