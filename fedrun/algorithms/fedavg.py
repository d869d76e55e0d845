"""FedAvg on the active clients (McMahan et al. 2017; docs/algorithms.md).

    x <- x + eta_g * sum_{i in S_t} w_i Delta_i

with w_i = 1/|S_t| (uniform, as in the FedAU/FedAWE codes), n_i / sum_{j in S_t} n_j (data size),
1/N (FedAU code's ``average_all``) or 1/(N p_i) (``known_prob``, needs a pattern with known p_i).
An empty round leaves x unchanged.
"""

from __future__ import annotations

from torch import Tensor

from fedrun.algorithms.base import (
    Algorithm,
    Clients,
    Declaration,
    LocalResult,
    RoundContext,
    Scalar,
    Vector,
    model_delta,
    rows,
    unchanged_if_empty,
)
from fedrun.config.hparams import FedAvgHparams


class FedAvg(Algorithm):
    name = "fedavg"
    Hparams = FedAvgHparams

    def declare(self) -> Declaration:
        up = (Vector("delta"), Scalar("weight")) if self.hp.weighting == "data_size" else (Vector("delta"),)
        return Declaration(server=(Vector("x", "model"),), down=("x",), up=up, model_delta="delta")

    def client_finish(self, down: dict[str, Tensor], state: dict[str, Tensor], local: LocalResult,
                      clients: Clients, ctx: RoundContext) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        delta = model_delta(local, down)
        if self.hp.weighting == "data_size":
            return {"delta": rows(clients.num_examples) * delta, "weight": clients.num_examples}, state
        if self.hp.weighting == "known_prob":
            if clients.probability is None:
                raise ValueError("algorithm.weighting=known_prob needs a participation pattern with "
                                 "known probabilities (bernoulli, p2, p3, biased)")
            return {"delta": delta / rows(clients.probability)}, state
        return {"delta": delta}, state

    @unchanged_if_empty
    def server_update(self, server: dict[str, Tensor], up: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        divisor = {
            "uniform": ctx.num_active,
            "data_size": up.get("weight"),
            "average_all": ctx.num_clients,
            "known_prob": ctx.num_clients,
        }[self.hp.weighting]
        return {**server, "x": server["x"] + self.hp.global_lr * up["delta"] / divisor}
