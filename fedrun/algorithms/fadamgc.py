"""FAdamGC (Chen et al., arXiv 2502.02727 v3, "Gradient Correction in FL with Adaptive Optimization").

A "pre-estimation" correction: the drift correction enters the gradient BEFORE the moments of the local
AMSGrad optimizer (docs/algorithms/fedsum_scaffold_fadamgc.md).

    Server: x, y (= (1/N) sum_i y_i).   Client i: y_i (persistent, init 0).   Down (x, y), up 2.
    local, k = 1..K from x_t:  ghat = g + y_t - y_i
                               m <- b1 m + (1-b1) ghat ; v <- b2 v + (1-b2) ghat^2 ; vhat <- max(vhat, v)
                               x_loc <- x_loc - eta_l m / (sqrt(vhat) + eps)       (no bias correction)
    y_i_new = (1/K) sum_k g (raw gradients)
    x <- x + eta_g (1/|S_t|) sum_{S_t} (x_loc - x_t)

Choices fedrun makes where the paper is silent, each an option:

* ``persist_moments`` (default false): m, v, vhat reset to 0 every round; true keeps them per client
  across rounds (also across rounds in which the client is inactive).
* ``tracking`` (default ``scaffold``): y <- y + (1/N) sum_{S_t} (y_i_new - y_i), which keeps
  y = (1/N) sum_i y_i (docs/verification.md, V9); ``mean_active``: y <- mean_{S_t} y_i_new (the clients
  then upload y_i_new instead of the difference; identical under full participation).
* ``correction`` (default true): false drops the correction, ghat = g: local AMSGrad from x_t averaged
  by the server, the paper's "local Adam without correction" baseline. Nothing is tracked then (no y,
  no y_i; down 1, up 1).

Defaults beta1 = 0.9, beta2 = 0.999, eps = 1e-8, eta_g = 1 (standard Adam values; the paper gives none).
An empty round leaves the server state unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from fedrun.algorithms.base import (
    Algorithm,
    Clients,
    Declaration,
    LocalPlan,
    LocalResult,
    RoundContext,
    Vector,
    model_delta,
    unchanged_if_empty,
)
from fedrun.config.hparams import FAdamGCHparams

MOMENTS = ("m", "v", "vhat")


@dataclass(frozen=True)
class AMSGrad:
    """Local AMSGrad on the corrected gradient u (a :class:`fedrun.protocol.LocalOptimizer`):

        m <- b1 m + (1 - b1) u ;  v <- b2 v + (1 - b2) u^2 ;  vhat <- max(vhat, v)
        direction = m / (sqrt(vhat) + eps)

    The moments start from the plan's state when it is persisted, else from zeros."""

    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def init(self, x: Tensor, state: dict[str, Tensor] | None) -> dict[str, Tensor]:
        state = {key: value.clone() for key, value in (state or {}).items()}
        for key in MOMENTS:
            state.setdefault(key, torch.zeros_like(x))
        return state

    def step(self, k: int, x: Tensor, u: Tensor, state: dict[str, Tensor],
             grad_at: Callable[[Tensor], Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        m = self.beta1 * state["m"] + (1 - self.beta1) * u
        v = self.beta2 * state["v"] + (1 - self.beta2) * u * u
        vhat = torch.maximum(state["vhat"], v)
        return m / (vhat.sqrt() + self.eps), {"m": m, "v": v, "vhat": vhat}


class FAdamGC(Algorithm):
    name = "fadamgc"
    Hparams = FAdamGCHparams

    def declare(self) -> Declaration:
        moments = tuple(Vector(k) for k in MOMENTS) if self.hp.persist_moments else ()
        if not self.hp.correction:
            return Declaration(server=(Vector("x", "model"),), client=moments, down=("x",), up=(Vector("dx"),))
        second = Vector("dy") if self.hp.tracking == "scaffold" else Vector("y_new")
        return Declaration(server=(Vector("x", "model"), Vector("y")), client=(Vector("y_i"), *moments),
                           down=("x", "y"), up=(Vector("dx"), second),
                           memory=("y_i",) if self.hp.tracking == "scaffold" else ())  # y = (1/N) sum_i y_i

    def local_plan(self, down: dict[str, Tensor], state: dict[str, Tensor], clients: Clients,
                   ctx: RoundContext) -> LocalPlan:
        start = down["x"].expand(len(clients.ids), -1)
        moments = {k: state[k] for k in MOMENTS} if self.hp.persist_moments else None  # None: zeros
        adam = AMSGrad(self.hp.beta1, self.hp.beta2, self.hp.eps)
        correction = down["y"] - state["y_i"] if self.hp.correction else None
        return LocalPlan(start=start, correction=correction, optimizer=adam, optimizer_state=moments)

    def client_finish(self, down: dict[str, Tensor], state: dict[str, Tensor], local: LocalResult,
                      clients: Clients, ctx: RoundContext) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        up, new_state = {"dx": model_delta(local, down)}, dict(state)
        if self.hp.correction:
            y_new = local.grad_mean
            up.update({"dy": y_new - state["y_i"]} if self.hp.tracking == "scaffold" else {"y_new": y_new})
            new_state["y_i"] = y_new
        if self.hp.persist_moments:
            new_state.update({k: local.optimizer_state[k] for k in MOMENTS})
        return up, new_state

    @unchanged_if_empty
    def server_update(self, server: dict[str, Tensor], up: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        x = server["x"] + self.hp.global_lr * up["dx"] / ctx.num_active
        if not self.hp.correction:
            return {**server, "x": x}
        if self.hp.tracking == "scaffold":
            y = server["y"] + up["dy"] / ctx.num_clients
        else:
            y = up["y_new"] / ctx.num_active
        return {**server, "x": x, "y": y}
