"""FedCAda (Zhou et al., arXiv 2405.11811): client-side Adam whose moments are
averaged by the server. The update rule is fedrun's choice (the paper's method section was not available;
docs/algorithms/fadas_fedcada_fafed_async.md says what is known and why each choice).

    Server: x, mbar, vbar (3 model-sized vectors, mbar = vbar = 0) and n (applied rounds). Client: none.
    down (x, mbar, vbar, n)  -- 3 vectors (+ the round counter, one float)
    client, from y = x, m = mbar, v = vbar, for k = 1..K:
        m <- b1 m + (1-b1) g ; v <- b2 v + (1-b2) g^2
        s = n K + k  (step_count "global", default)  or  s = k  ("restart")
        mhat = m / (1 - b1^s + a_m(n)) ; vhat = v / (1 - b2^s + a_v(n))
        y <- y - eta_l mhat / (sqrt(vhat) + eps)
    up (y - x, m, v)  -- 3 vectors
    x <- x + eta_g mean(y - x) ; mbar <- mean m ; vbar <- mean v     (uniform mean over S_t; eta_g = 1)

Switches (Hparams): ``step_count`` (global | restart); ``adjustment`` a(n) for both
denominators: none (default, a = 0) | inv_t a0/(n+1) | inv_sqrt_t a0/sqrt(n+1) | exp a0 exp(-n/t0), with
``adjust_a0`` = 1 and ``adjust_t0`` = T/10 when null; ``adjust_moments`` (both | m | v) says which
denominators receive it; ``weighting`` uniform | data_size. An empty round changes nothing (n not advanced).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

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
    model_delta,
    rows,
    unchanged_if_empty,
)
from fedrun.config.hparams import FedCAdaHparams


def adjustment(hp: FedCAdaHparams, n: int, total_rounds: int) -> float:
    """a(n) >= 0, non-increasing in the applied-round count n, -> 0."""
    if hp.adjustment == "none":
        return 0.0
    if hp.adjustment == "inv_t":
        return hp.adjust_a0 / (n + 1)
    if hp.adjustment == "inv_sqrt_t":
        return hp.adjust_a0 / math.sqrt(n + 1)
    t0 = hp.adjust_t0 if hp.adjust_t0 is not None else max(total_rounds, 1) / 10
    return hp.adjust_a0 * math.exp(-n / t0)


@dataclass
class ClientAdam:
    """FedCAda's client Adam (a fedrun.protocol.LocalOptimizer): moments warm-started from the server."""

    beta1: float
    beta2: float
    eps: float
    first_step: int  # s of local step k = 0 is first_step + 1
    a_m: float
    a_v: float

    def init(self, x: Tensor, state: dict[str, Tensor] | None) -> dict[str, Tensor]:
        assert state is not None
        return {"m": state["m"].clone(), "v": state["v"].clone()}

    def step(self, k: int, x: Tensor, u: Tensor, state: dict[str, Tensor],
             grad_at: Callable[[Tensor], Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        m = self.beta1 * state["m"] + (1 - self.beta1) * u
        v = self.beta2 * state["v"] + (1 - self.beta2) * u * u
        s = self.first_step + k + 1
        m_hat = m / (1 - self.beta1 ** s + self.a_m)
        v_hat = v / (1 - self.beta2 ** s + self.a_v)
        return m_hat / (v_hat.sqrt() + self.eps), {"m": m, "v": v}


def average_model_and_moments(server: dict[str, Tensor], up: dict[str, Tensor], ctx: RoundContext,
                              global_lr: float, weighting: str) -> dict[str, Tensor]:
    """x <- x + eta_g mean(dx_i); m, v <- mean(m_i), mean(v_i); count the round (FedCAda, FAFED, whose
    server rules leave an empty round unchanged: :func:`~fedrun.algorithms.base.unchanged_if_empty`)."""
    divisor = up["weight"] if weighting == "data_size" else ctx.num_active
    return {**server, "x": server["x"] + global_lr * up["dx"] / divisor, "m": up["m"] / divisor,
            "v": up["v"] / divisor, "rounds": server["rounds"] + 1}


class FedCAda(Algorithm):
    name = "fedcada"
    Hparams = FedCAdaHparams

    def declare(self) -> Declaration:
        up: tuple = (Vector("dx"), Vector("m"), Vector("v"))
        if self.hp.weighting == "data_size":
            up += (Scalar("weight"),)
        server = (Vector("x", "model"), Vector("m"), Vector("v"), Scalar("rounds"))
        return Declaration(server=server, down=("x", "m", "v", "rounds"), up=up)

    def local_plan(self, down: dict[str, Tensor], state: dict[str, Tensor], clients: Clients,
                   ctx: RoundContext) -> LocalPlan:
        hp = self.hp
        c = len(clients.ids)
        n = int(down["rounds"])
        a = adjustment(hp, n, ctx.total_rounds)
        rule = ClientAdam(hp.beta1, hp.beta2, hp.eps, n * ctx.local_steps if hp.step_count == "global" else 0,
                          a if hp.adjust_moments in ("both", "m") else 0.0,
                          a if hp.adjust_moments in ("both", "v") else 0.0)
        moments = {"m": down["m"].expand(c, -1), "v": down["v"].expand(c, -1)}
        return LocalPlan(start=down["x"].expand(c, -1).clone(), optimizer=rule, optimizer_state=moments)

    def client_finish(self, down: dict[str, Tensor], state: dict[str, Tensor], local: LocalResult,
                      clients: Clients, ctx: RoundContext) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        up = {"dx": model_delta(local, down), "m": local.optimizer_state["m"], "v": local.optimizer_state["v"]}
        if self.hp.weighting == "data_size":
            w = rows(clients.num_examples)
            return {**{k: w * v for k, v in up.items()}, "weight": clients.num_examples}, state
        return up, state

    @unchanged_if_empty
    def server_update(self, server: dict[str, Tensor], up: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        return average_model_and_moments(server, up, ctx, self.hp.global_lr, self.hp.weighting)
