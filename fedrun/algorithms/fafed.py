"""FAFED (Wu, Huang, Hu, Huang, AAAI 2023) in fedrun's partial-participation adaptation
(docs/algorithms/fadas_fedcada_fafed_async.md): local STORM momentum with a shared adaptive matrix
A = sqrt(vbar) + rho, frozen during the round, and averaging of x, m, v at every round's end (q = K).

    Server: xbar, mbar, vbar, n (applied rounds). Client: none (default).   Down 3 (+ n) / up 3.
    client, from y = y_prev = xbar, v = vbar, m = mbar (init_m "global"), A = sqrt(vbar) + rho, k = 1..K:
        xi minibatch ; g_new = grad F_i(y; xi) ; g_old = grad F_i(y_prev; xi)     (SAME minibatch: 2 grads)
        m <- g_new + (1 - alpha)(m - ext g_old) ; v <- beta v + (1 - beta) g_new^2
        y_prev <- y ; y <- y - gamma eta_r m / A          (gamma = local.lr; eta_r = 1 for schedule constant)
    up (y - xbar, m, v);  xbar <- xbar + mean(y - xbar) ; mbar <- mean m ; vbar <- mean v

Switches (Hparams; choices fedrun makes where the paper is silent):

* ``bootstrap`` (how mbar, vbar and A are first set): ``round`` (default) -- the first applied round is an
  INIT round: each sampled client computes one gradient g at x_0 on the round's first minibatch and
  uploads (0, g, g^2); the server sets mbar = mean g, vbar = mean g^2 (so A = sqrt(v_0) + rho) and x stays
  x_0 (the code's INIT; the runtime has one reduce per round, so a "same round" bootstrap costs
  one round without local steps). ``rho``: the simpler alternative, round 0 runs with A = rho and
  each client's m starts from its own gradient (init_m restart).
* ``init_m``: ``global`` (mbar, default) | ``restart`` (the client's own gradient on its first local
  minibatch, so the first step is plain g) | ``local`` (its own stored m_i, needs persist_client_state).
* ``persist_client_state`` (default false): clients keep m_i and y_prev_i across rounds (a first
  participation uses mbar, xbar); with full participation and init_m local this is the original FAFED.
* ``ext`` (default 1, exact STORM; code drivers use 0.95), ``schedule`` constant (code) | cube_root
  (paper: eta_r = k0 / (w + r)^(1/3), alpha = min(1, c eta_{r-1}^2), r the global local-iteration index).

Empty round: nothing changes. A >= rho > 0 always.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from fedrun.algorithms.base import (
    Algorithm,
    Clients,
    Declaration,
    Entry,
    LocalPlan,
    LocalResult,
    RoundContext,
    Scalar,
    Vector,
    model_delta,
    rows,
    unchanged_if_empty,
)
from fedrun.algorithms.fedcada import average_model_and_moments
from fedrun.config.hparams import FAFEDHparams


def adaptive_matrix(vbar: Tensor, rho: float) -> Tensor:
    """A = sqrt(vbar) + rho (the diagonal of FAFED's shared adaptive matrix)."""
    return vbar.sqrt() + rho


@dataclass
class Storm:
    """FAFED's local step (a fedrun.protocol.LocalOptimizer): two gradients per step on the same minibatch."""

    a: Tensor  # [d] or [C, d], frozen for the whole round
    alpha: float
    beta: float
    ext: float
    restart: bool  # m starts from the gradient of the first local minibatch
    schedule: Literal["constant", "cube_root"] = "constant"
    first_iteration: int = 0  # global local-iteration index r of step k = 0
    k0: float = 1.0
    w: float = 1.0
    c: float = 1.0

    def init(self, x: Tensor, state: dict[str, Tensor] | None) -> dict[str, Tensor]:
        state = dict(state or {})
        out = {"v": state["v"].clone(), "y_prev": state["y_prev"].clone() if "y_prev" in state else x.clone()}
        out["m"] = state["m"].clone() if "m" in state else torch.zeros_like(x)
        return out

    def eta(self, r: int) -> float:
        return 1.0 if self.schedule == "constant" else self.k0 / (self.w + r) ** (1 / 3)

    def step(self, k: int, x: Tensor, u: Tensor, state: dict[str, Tensor],
             grad_at: Callable[[Tensor], Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        g_old = grad_at(state["y_prev"])
        r = self.first_iteration + k
        alpha = self.alpha if self.schedule == "constant" else min(1.0, self.c * self.eta(max(r - 1, 0)) ** 2)
        m_prev = u if (self.restart and k == 0) else state["m"]
        m = u + (1 - alpha) * (m_prev - self.ext * g_old)
        v = self.beta * state["v"] + (1 - self.beta) * u * u
        direction = m / self.a if self.schedule == "constant" else self.eta(r) * m / self.a
        return direction, {"m": m, "v": v, "y_prev": x}


class FAFED(Algorithm):
    name = "fafed"
    Hparams = FAFEDHparams

    def declare(self) -> Declaration:
        up: tuple[Entry, ...] = (Vector("dx"), Vector("m"), Vector("v"))
        if self.hp.weighting == "data_size":
            up += (Scalar("weight"),)
        client: tuple[Entry, ...] = ()
        if self.hp.persist_client_state:
            client = (Vector("m_i"), Vector("y_prev_i"), Scalar("seen"))
        server = (Vector("x", "model"), Vector("m"), Vector("v"), Scalar("rounds"))
        return Declaration(server=server, client=client, down=("x", "m", "v", "rounds"), up=up)

    def _bootstrapping(self, down: dict[str, Tensor]) -> bool:
        return self.hp.bootstrap == "round" and int(down["rounds"]) == 0

    def local_plan(self, down: dict[str, Tensor], state: dict[str, Tensor], clients: Clients,
                   ctx: RoundContext) -> LocalPlan:
        hp = self.hp
        c = len(clients.ids)
        start = down["x"].expand(c, -1).clone()
        if self._bootstrapping(down):  # one gradient at x_0 on the first minibatch, no move
            return LocalPlan(start=start, move=False, steps=1)
        n = int(down["rounds"]) - (1 if hp.bootstrap == "round" else 0)
        restart = hp.init_m == "restart" or (hp.bootstrap == "rho" and n == 0)
        init: dict[str, Tensor] = {"v": down["v"].expand(c, -1)}
        if hp.persist_client_state:
            seen = rows(state["seen"]) > 0
            init["y_prev"] = torch.where(seen, state["y_prev_i"], start)
            if hp.init_m == "local":
                init["m"] = torch.where(seen, state["m_i"], down["m"].expand(c, -1))
        if "m" not in init and not restart:
            init["m"] = down["m"].expand(c, -1)
        rule = Storm(adaptive_matrix(down["v"], hp.rho), hp.alpha, hp.beta, hp.ext, restart, hp.schedule,
                     n * ctx.local_steps, hp.k0, hp.w, hp.c)
        return LocalPlan(start=start, optimizer=rule, optimizer_state=init)

    def client_finish(self, down: dict[str, Tensor], state: dict[str, Tensor], local: LocalResult,
                      clients: Clients, ctx: RoundContext) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        if self._bootstrapping(down):
            g = local.grad_mean
            up = {"dx": torch.zeros_like(g), "m": g, "v": g * g}
        else:
            opt = local.optimizer_state
            up = {"dx": model_delta(local, down), "m": opt["m"], "v": opt["v"]}
            if self.hp.persist_client_state:
                state = {**state, "m_i": opt["m"], "y_prev_i": opt["y_prev"],
                         "seen": torch.ones_like(state["seen"])}
        if self.hp.weighting == "data_size":
            w = rows(clients.num_examples)
            return {**{k: w * v for k, v in up.items()}, "weight": clients.num_examples}, state
        return up, state

    def active_update(self, down_next: dict[str, Tensor], state: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        """The original FAFED's sync: a participating worker's m_i becomes the averaged m (x_i^prev is kept)."""
        if not self.hp.persist_client_state or int(down_next["rounds"]) <= (self.hp.bootstrap == "round"):
            return {}
        return {"m_i": down_next["m"].unsqueeze(0).expand_as(state["m_i"])}

    @unchanged_if_empty
    def server_update(self, server: dict[str, Tensor], up: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        return average_model_and_moments(server, up, ctx, self.hp.global_lr, self.hp.weighting)
