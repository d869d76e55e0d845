"""Memory of every client's latest update: MIFA (Gu et al. 2021) and FedVARP (Jhunjhunwala et al. 2022).

The papers keep the memories G_i / Y_i on the server (N model-sized vectors). Here they are CLIENT
entries, held by the rank that owns the client (docs/design.md): a participant uploads the
CHANGE of its memory, and the server keeps only the running sum (MIFA) or mean (FedVARP), which the
sum of those changes updates exactly. So rank 0 never holds N x d, and each active client still sends
one vector up and receives one down.

``form``:
* ``code`` (default; the FedAU/FedAWE baseline codes that FedSUM likely used): memories hold the raw
  model deltas Delta_i = x_i^(t,K) - x^(t).
* ``paper``: memories hold normalized pseudo-gradients (x - x_end) / eta_l(t) and the server steps
  with eta_g eta_l(t). Identical to ``code`` for a constant eta_l; they differ when eta_l(t) decays.
"""

from __future__ import annotations

from torch import Tensor

from fedrun.algorithms.base import (
    Algorithm,
    Clients,
    Declaration,
    Entry,
    LocalResult,
    RoundContext,
    Scalar,
    Vector,
    model_delta,
    unchanged_if_empty,
)
from fedrun.config.hparams import FedVarpHparams, Form, MifaHparams
from fedrun.errors import ConfigError


def memory_entry(local: LocalResult, down: dict[str, Tensor], form: Form, ctx: RoundContext) -> Tensor:
    """What the memory stores for this round: Delta_i (code) or (x - x_end) / eta_l(t) (paper)."""
    delta = model_delta(local, down)
    if form == "code":
        return delta
    if ctx.lr <= 0:
        raise ConfigError("algorithm.form=paper normalizes by the local lr, which is 0 in round "
                          f"{ctx.round + 1}; expected form=code or a positive local.lr")
    return -delta / ctx.lr


def server_step(form: Form, global_lr: float, direction: Tensor, ctx: RoundContext) -> Tensor:
    """The x-increment along a memory average: eta_g d (code) or -eta_g eta_l(t) d (paper)."""
    return global_lr * direction if form == "code" else -global_lr * ctx.lr * direction


# --------------------------------------------------------------------------------------------- MIFA


class Mifa(Algorithm):
    """MIFA: G_i <- latest update of i; x <- x + eta_g (1/N) sum_{i=1..N} G_i, every round.

    Server: x, g_sum = sum_i G_i (and the count of clients that have reported, with wait_all).
    Client (owner rank): G_i, zero-initialized. Upload: G_i^new - G_i^old (+ a first-report flag).
    The update applies even when S_t is empty (the stale memory average).
    """

    name = "mifa"
    Hparams = MifaHparams

    def declare(self) -> Declaration:
        server: tuple[Entry, ...] = (Vector("x", "model"), Vector("g_sum"))
        up: tuple[Entry, ...] = (Vector("g_change"),)
        if self.hp.wait_all:
            server += (Scalar("reported"),)
            up += (Scalar("first_report"),)
        return Declaration(server=server, client=(Vector("g"),), down=("x",), up=up, memory=("g",))

    def client_finish(self, down: dict[str, Tensor], state: dict[str, Tensor], local: LocalResult,
                      clients: Clients, ctx: RoundContext) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        g_new = memory_entry(local, down, self.hp.form, ctx)
        up = {"g_change": g_new - state["g"]}
        if self.hp.wait_all:
            up["first_report"] = (clients.participations == 0).to(g_new.dtype)
        return up, {**state, "g": g_new}

    def server_update(self, server: dict[str, Tensor], up: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        new = {**server, "g_sum": server["g_sum"] + up["g_change"]}
        if self.hp.wait_all:
            new["reported"] = server["reported"] + up["first_report"]
            if float(new["reported"]) < ctx.num_clients:
                return new
        step = server_step(self.hp.form, self.hp.global_lr, new["g_sum"] / ctx.num_clients, ctx)
        new["x"] = server["x"] + step
        return new


# ------------------------------------------------------------------------------------------ FedVARP


class FedVarp(Algorithm):
    """FedVARP (SAGA-style):

        v    = Ybar + (1/|S_t|) sum_{i in S_t} (Delta_i - Y_i)     # OLD Y_i and OLD Ybar
        Ybar <- Ybar + (1/N) sum_{i in S_t} (Delta_i - Y_i)         # keeps Ybar = (1/N) sum_i Y_i
        Y_i  <- Delta_i (i in S_t) ;  x <- x + eta_g v

    Server: x, y_mean = Ybar. Client (owner rank): Y_i, zero-initialized. Upload: Delta_i - Y_i^old,
    the one sum both server lines need. Empty S_t: no update at all (the codes).
    """

    name = "fedvarp"
    Hparams = FedVarpHparams

    def declare(self) -> Declaration:
        return Declaration(server=(Vector("x", "model"), Vector("y_mean")), client=(Vector("y"),),
                           down=("x",), up=(Vector("innovation"),), memory=("y",))

    def client_finish(self, down: dict[str, Tensor], state: dict[str, Tensor], local: LocalResult,
                      clients: Clients, ctx: RoundContext) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        y_new = memory_entry(local, down, self.hp.form, ctx)
        return {"innovation": y_new - state["y"]}, {**state, "y": y_new}

    @unchanged_if_empty
    def server_update(self, server: dict[str, Tensor], up: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        direction = server["y_mean"] + up["innovation"] / ctx.num_active
        return {**server,
                "x": server["x"] + server_step(self.hp.form, self.hp.global_lr, direction, ctx),
                "y_mean": server["y_mean"] + up["innovation"] / ctx.num_clients}
