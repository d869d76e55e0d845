"""FedProx (Li et al., MLSys 2020; docs/algorithms.md): FedAvg whose clients minimise a proximal objective.

Client i in round t starts at x^(t) and takes its K local steps on

    h_i(x) = F_i(x) + (mu / 2) ||x - x^(t)||^2,   i.e. every local gradient gains mu (x - x^(t)),

which keeps the local models near the global one under heterogeneous data. The server averages the
model deltas exactly as FedAvg does (same weightings, ``global_lr``):

    x <- x + eta_g * sum_{i in S_t} w_i Delta_i

``mu = 0`` is FedAvg, bit for bit (the proximal term is not even added). The paper's inexact local
solvers (a variable amount of local work per client) are the runtime's ``local.epochs`` / step settings.
"""

from __future__ import annotations

from torch import Tensor

from fedrun.algorithms.base import Clients, LocalPlan, RoundContext
from fedrun.algorithms.fedavg import FedAvg
from fedrun.config.hparams import FedProxHparams


class FedProx(FedAvg):
    name = "fedprox"
    Hparams = FedProxHparams

    def local_plan(self, down: dict[str, Tensor], state: dict[str, Tensor], clients: Clients,
                   ctx: RoundContext) -> LocalPlan:
        return LocalPlan(start=down["x"].expand(len(clients.ids), -1), prox=self.hp.mu)
