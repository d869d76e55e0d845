"""Krum and Multi-Krum (Blanchard et al., NeurIPS 2017) on the round's model deltas.

With f = ``num_malicious`` and n deltas, each delta is scored by its distance to its closest neighbours:

    score_i = sum_{j in N_i} ||Delta_i - Delta_j||^2,   N_i = the n - f - 2 deltas nearest to Delta_i (j != i)

Krum (m = ``num_keep`` = 1) steps along the lowest-scoring delta; Multi-Krum (m > 1) along the mean of
the min(m, n - f) lowest-scoring ones (ties: the smaller client id first):

    x <- x + global_lr * (1/m) sum_{i in the m best} Delta_i

Policy for a round too small for the rule (n <= 2f + 2, where the paper's guarantee needs n > 2f + 2):
no server step, x stays as it is (the round's deltas are discarded; the metrics still record the round).
Squared distances come from the Gram matrix, ||a||^2 + ||b||^2 - 2 a.b, clamped at 0.
"""

from __future__ import annotations

from torch import Tensor

from fedrun.algorithms.gathered import GatheredDeltas
from fedrun.config.hparams import KrumHparams


class Krum(GatheredDeltas):
    name = "krum"
    Hparams = KrumHparams

    def aggregate(self, deltas: Tensor) -> Tensor | None:
        n, f = deltas.shape[0], self.hp.num_malicious
        if n <= 2 * f + 2:
            return None
        norms = (deltas * deltas).sum(dim=1)
        distances = (norms[:, None] + norms[None, :] - 2 * deltas @ deltas.T).clamp_min(0)
        distances.fill_diagonal_(float("inf"))  # a delta is not its own neighbour
        scores = distances.sort(dim=1).values[:, :n - f - 2].sum(dim=1)
        keep = min(self.hp.num_keep, n - f)
        best = scores.argsort(stable=True)[:keep]
        return deltas[best.sort().values].mean(dim=0)
