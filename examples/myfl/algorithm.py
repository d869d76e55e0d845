"""ClippedFedAvg: FedAvg on clipped client deltas (the aggregation of DP-FedAvg, without the noise).

Client i uploads its model delta Delta_i = x_i^(t,K) - x^(t) scaled to norm at most ``clip``:

    u_i = Delta_i * min(1, clip / ||Delta_i||)

and the server averages them: x <- x + global_lr * (1/|S_t|) sum_{i in S_t} u_i. An empty round leaves x
unchanged. The algorithm only declares state and writes tensor rules; fedrun does the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from fedrun.algorithms.base import Algorithm, Clients, Declaration, LocalResult, RoundContext, Vector, model_delta
from fedrun.errors import require


@dataclass
class ClippedFedAvgHparams:
    """Every field is a config key under ``algorithm:``, type-checked like a built-in's."""

    clip: float = 1.0  # largest norm of an uploaded delta
    global_lr: float = 1.0  # eta_g

    def check(self) -> None:
        require(self.clip > 0, "algorithm.clip", "a number > 0", self.clip)
        require(self.global_lr > 0, "algorithm.global_lr", "a number > 0", self.global_lr)


class ClippedFedAvg(Algorithm):
    name = "clipped_fedavg"
    Hparams = ClippedFedAvgHparams

    def declare(self) -> Declaration:
        # server state: the global model x (initialised to the model's x^(0)); every client receives x and
        # uploads one model-sized vector, which the runtime sums over the round's participants
        return Declaration(server=(Vector("x", "model"),), down=("x",), up=(Vector("delta"),),
                           model_delta="delta")

    def client_finish(self, down: dict[str, Tensor], state: dict[str, Tensor], local: LocalResult,
                      clients: Clients, ctx: RoundContext) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        delta = model_delta(local, down)  # [C, d]
        norms = delta.norm(dim=1, keepdim=True)
        scale = (self.hp.clip / norms.clamp_min(1e-30)).clamp(max=1.0)
        return {"delta": delta * scale}, state

    def server_update(self, server: dict[str, Tensor], up: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        if ctx.num_active == 0:
            return server
        return {**server, "x": server["x"] + self.hp.global_lr * up["delta"] / ctx.num_active}
