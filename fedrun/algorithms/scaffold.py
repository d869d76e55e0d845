"""SCAFFOLD (Karimireddy et al. ICML 2020), Option II, and its single-uplink form (Huang, Li, Li 2023).

docs/algorithms/fedsum_scaffold_fadamgc.md. Server: x, c. Client i: c_i (persistent, init 0). Downlink (x, c).
Local steps from x^(t) with the correction c - c_i:  x_i <- x_i - eta_l (g_i(x_i) - c_i + c).

``form=original`` (up 2: Delta x_i, Delta c_i):

    c_i+ = c_i - c + (x - x_i) / (K eta_l)                       (Option II)
    x   <- x + eta_g (1/|S_t|) sum_{S_t} Delta x_i
    c   <- c + (1/N) sum_{S_t} Delta c_i

``form=single_uplink`` (up 1: delta_i = gbar_i - c_i, since Option II gives c_i+ = gbar_i, the mean of
the raw gradients):

    x <- x - eta_g eta_l K (c + (1/|S_t|) sum_{S_t} delta_i)
    c <- c + (1/N) sum_{S_t} delta_i

The two forms are identical iterate by iterate (docs/verification.md, V8); both keep c = (1/N) sum_i c_i
(V9). An empty round leaves the server state unchanged. K is the nominal ``local.steps``.
"""

from __future__ import annotations

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
from fedrun.config.hparams import ScaffoldHparams
from fedrun.errors import ConfigError


class Scaffold(Algorithm):
    name = "scaffold"
    Hparams = ScaffoldHparams

    @property
    def single_uplink(self) -> bool:
        return self.hp.form == "single_uplink"

    def declare(self) -> Declaration:
        up = (Vector("delta"),) if self.single_uplink else (Vector("dx"), Vector("dc"))
        return Declaration(server=(Vector("x", "model"), Vector("c")), client=(Vector("c_i"),),
                           down=("x", "c"), up=up, memory=("c_i",))  # c = (1/N) sum_i c_i

    def local_plan(self, down: dict[str, Tensor], state: dict[str, Tensor], clients: Clients,
                   ctx: RoundContext) -> LocalPlan:
        start = down["x"].expand(len(clients.ids), -1)
        return LocalPlan(start=start, correction=down["c"] - state["c_i"])

    def client_finish(self, down: dict[str, Tensor], state: dict[str, Tensor], local: LocalResult,
                      clients: Clients, ctx: RoundContext) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        c_i = state["c_i"]
        if self.single_uplink:
            gbar = local.grad_mean
            return {"delta": gbar - c_i}, {**state, "c_i": gbar}
        dx = model_delta(local, down)
        if ctx.lr <= 0:  # 0/0: the control variates would be NaN, and the run would end as "divergence"
            raise ConfigError(f"local.lr: SCAFFOLD's Option II control variates divide by the local lr, which is "
                              f"0 in round {ctx.round + 1}; expected a positive local.lr (or algorithm.form="
                              "single_uplink)")
        c_plus = c_i - down["c"] - dx / (ctx.local_steps * ctx.lr)  # Option II
        return {"dx": dx, "dc": c_plus - c_i}, {**state, "c_i": c_plus}

    @unchanged_if_empty
    def server_update(self, server: dict[str, Tensor], up: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        x, c, eta_g = server["x"], server["c"], self.hp.global_lr
        if self.single_uplink:
            delta = up["delta"]
            x = x - eta_g * ctx.lr * ctx.local_steps * (c + delta / ctx.num_active)
            return {**server, "x": x, "c": c + delta / ctx.num_clients}
        return {**server, "x": x + eta_g * up["dx"] / ctx.num_active, "c": c + up["dc"] / ctx.num_clients}
