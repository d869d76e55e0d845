"""FedAdamom: server momentum with an adaptive, per-coordinate beta1 (Hou et al. CVPR 2026;
confirmed against the official code's ``fedadamom`` branch; docs/algorithms/fedopt_memory_fedau_fedawe.md).

    Delta_t = (1/|S_t|) sum_{i in S_t} Delta_i
    v       <- beta2 v + (1 - beta2) Delta_t^2           # updated BEFORE beta1_t: uses this round's Delta
    vbar    =  (1/d) sum_j v_j                           # one scalar over ALL model coordinates
    beta1_t =  clip(1 - v / vbar, 0, 1 - eps)            # eps: the clip margin, not a denominator term
    m       <- beta1_t * m + (1 - beta1_t) * Delta_t
    x       <- x + eta m                                 # no 1/sqrt(v), no bias correction; m_0 = v_0 = 0

Choices where the paper is silent: vbar = 0 gives beta1_t = 0 (the code would divide 0/0);
an empty S_t is skipped, nothing changes. Down 1 / up 1 (only the model is sent).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedrun.algorithms.base import (
    Algorithm,
    Clients,
    Declaration,
    LocalResult,
    RoundContext,
    Vector,
    model_delta,
    unchanged_if_empty,
)
from fedrun.config.hparams import FedAdamomHparams


def adaptive_beta1(v: Tensor, eps: float) -> Tensor:
    """beta1_t = clip(1 - v / mean(v), 0, 1 - eps) element-wise; 0 everywhere when mean(v) = 0."""
    vbar = v.mean()
    if not bool(vbar > 0):
        return torch.zeros_like(v)
    return (1 - v / vbar).clamp(0.0, 1.0 - eps)


class FedAdamom(Algorithm):
    name = "fedadamom"
    Hparams = FedAdamomHparams

    def declare(self) -> Declaration:
        return Declaration(server=(Vector("x", "model"), Vector("m"), Vector("v")), down=("x",),
                           up=(Vector("delta"),))

    def client_finish(self, down: dict[str, Tensor], state: dict[str, Tensor], local: LocalResult,
                      clients: Clients, ctx: RoundContext) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        return {"delta": model_delta(local, down)}, state

    @unchanged_if_empty
    def server_update(self, server: dict[str, Tensor], up: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        hp = self.hp
        delta = up["delta"] / ctx.num_active
        v = hp.beta2 * server["v"] + (1 - hp.beta2) * delta * delta
        beta1 = adaptive_beta1(v, hp.eps)
        m = beta1 * server["m"] + (1 - beta1) * delta
        return {**server, "x": server["x"] + hp.global_lr * m, "m": m, "v": v}
