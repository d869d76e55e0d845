"""FedAWE: adaptive innovation echoing and implicit gossiping (Xiang et al. NeurIPS 2024;
following the official code; docs/algorithms/fedopt_memory_fedau_fedawe.md).

Per client i (owner rank): its own model x~_i (x^(0) initially) and the echo multiplier c_i (1
initially; rounds since its last participation, counting the current one).

    for i in S_t:  x_end <- LOCAL_SGD(x~_i)                 # from its OWN stale model, not from x
                   u_i <- c_i (x_end - x~_i)                 # echo: amplify by the rounds missed
    if S_t != {}:  x <- mean_{S_t} x~_i + eta_g CLIP_r(mean_{S_t} u_i)     # implicit gossiping
    then (``after_round``, with the new x):
        i in S_t:     x~_i <- x ; c_i <- 1                   # sent AFTER aggregation, to active clients
        i not in S_t: c_i <- c_i + 1

CLIP_r(v) = v min(1, r / ||v||_2) over the whole flattened vector, r = ``clip`` = 0.5 in the
official code (code only, not in the paper's algorithm). With ``clip: null`` each client uploads
the single vector x~_i + eta_g u_i (up 1); with a clip it uploads x~_i and u_i (up 2). Down 1.
Empty S_t: x unchanged (the counters still grow).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedrun.algorithms.base import (
    Algorithm,
    Clients,
    Declaration,
    LocalPlan,
    LocalResult,
    RoundContext,
    Scalar,
    Vector,
    rows,
    unchanged_if_empty,
)
from fedrun.config.hparams import FedAWEHparams


def clip_norm(v: Tensor, radius: float) -> Tensor:
    """v * min(1, radius / ||v||_2)."""
    norm = torch.linalg.vector_norm(v)
    return v * torch.clamp(radius / norm.clamp_min(torch.finfo(v.dtype).tiny), max=1.0)


class FedAWE(Algorithm):
    name = "fedawe"
    Hparams = FedAWEHparams

    def declare(self) -> Declaration:
        up = (Vector("x_next"),) if self.hp.clip is None else (Vector("x_own"), Vector("echo_update"))
        client = (Vector("x_own", "model"), Scalar("echo", 1.0))
        return Declaration(server=(Vector("x", "model"),), client=client, down=("x",), up=up)

    def local_plan(self, down: dict[str, Tensor], state: dict[str, Tensor], clients: Clients,
                   ctx: RoundContext) -> LocalPlan:
        return LocalPlan(start=state["x_own"].clone())

    def client_finish(self, down: dict[str, Tensor], state: dict[str, Tensor], local: LocalResult,
                      clients: Clients, ctx: RoundContext) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        u = rows(state["echo"]) * (local.x_end - state["x_own"])
        if self.hp.clip is None:
            return {"x_next": state["x_own"] + self.hp.global_lr * u}, state
        return {"x_own": state["x_own"], "echo_update": u}, state

    @unchanged_if_empty
    def server_update(self, server: dict[str, Tensor], up: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        n = ctx.num_active
        if self.hp.clip is None:
            return {**server, "x": up["x_next"] / n}
        x = up["x_own"] / n + self.hp.global_lr * clip_norm(up["echo_update"] / n, self.hp.clip)
        return {**server, "x": x}

    def active_update(self, down_next: dict[str, Tensor], state: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        return {"x_own": down_next["x"].unsqueeze(0).expand_as(state["x_own"])}

    def after_round(self, down_next: dict[str, Tensor], state: dict[str, Tensor], active: Tensor,
                    ctx: RoundContext) -> dict[str, Tensor]:
        return {"echo": torch.where(active, torch.ones_like(state["echo"]), state["echo"] + 1)}
