"""FedSUM family: FedSUM-B, FedSUM and FedSUM-CR (You & Pu, arXiv 2512.18275;
docs/algorithms/fedsum_scaffold_fadamgc.md).

"Stochastic Uplink-Merge": client i keeps h_i, its latest average of raw minibatch gradients, and
uploads only the difference delta_i = h_i_new - h_i_old. The server keeps the SUM y = sum_i h_i of the
latest h of every client (never-seen clients contribute h_i = 0) and steps along y / N (invariant
y = sum_i h_i after every round). The three variants differ only in what a client uses for
the other clients' contribution during its local steps:

* FedSUM-B (Algorithm 1):  no local moves; K minibatch gradients at x^(t).      down 1, up 1
* FedSUM   (Algorithm 2):  the downloaded y^(t-1).                              down 2, up 1
* FedSUM-CR(Algorithm 3):  ybar_i recovered from its stored model z_i = x^(a_i)  down 1 (+ C_t), up 1
  and x^(t) by inverting the server recursion.

Scalings fedrun chooses where the paper is silent (the doc says why), shared by the three:

    server:  y <- y + sum_{i in S_t} delta_i ;   x <- x - eta_g eta_l(t) K y / N
    local:   x_i <- x_i - (eta_l / N) (g_i + Y_i - h_i)      with Y_i = y^(t-1) (FedSUM) or ybar_i (CR)

Options: ``skip_empty_rounds`` (default false: an empty round still takes the stale step along y),
``weighting=data_size`` (fedrun's extension, with p_i = n_i / sum_j n_j: the server adds N p_i delta_i to y
and the local direction becomes p_i (g - h_i) + Y_i / N; with equal n_i it is the uniform algorithm).
"""

from __future__ import annotations

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
    rows,
)
from fedrun.config.hparams import FedSumCRHparams, FedSumHparams


class _FedSumFamily(Algorithm):
    """The shared server rule, upload and client memory h_i of the three variants.

    A variant says which extra state it keeps and how a client estimates the memory sum
    (``memory_estimate``: Y_i, whose h_i entry is the client's own stale h_i).
    """

    Hparams = FedSumHparams
    moves = True  # local steps move the iterate (False: FedSUM-B)

    # ---- variant hooks
    def extra_server(self) -> tuple[Entry, ...]:
        return ()

    def extra_client(self) -> tuple[Entry, ...]:
        return ()

    def extra_down(self) -> tuple[str, ...]:
        return ()

    def memory_estimate(self, down: dict[str, Tensor], state: dict[str, Tensor], clients: Clients,
                        ctx: RoundContext) -> Tensor:
        """Y_i [C, d]: the client's estimate of y = sum_j h_j (its own entry being its stale h_i)."""
        raise NotImplementedError

    def client_extra_state(self, down: dict[str, Tensor], state: dict[str, Tensor]) -> dict[str, Tensor]:
        return {}

    # ---- shared rules
    def declare(self) -> Declaration:
        return Declaration(
            server=(Vector("x", "model"), Vector("y")) + self.extra_server(),
            client=(Vector("h"),) + self.extra_client(),
            down=("x",) + self.extra_down(),
            up=(Vector("delta"),),
            memory=("h",),  # y = sum_i h_i
        )

    def weights(self, clients: Clients, ctx: RoundContext) -> Tensor | None:
        """N p_i [C] under data-size weighting (1 for every client when n_i are equal); None: uniform."""
        if self.hp.weighting == "uniform":
            return None
        return ctx.num_clients * clients.num_examples / ctx.total_examples

    def local_plan(self, down: dict[str, Tensor], state: dict[str, Tensor], clients: Clients,
                   ctx: RoundContext) -> LocalPlan:
        start = down["x"].expand(len(clients.ids), -1)
        if not self.moves:
            return LocalPlan(start=start, move=False)
        # each step: x <- x - (eta_l / N)(g + Y_i - h_i)      (y_i = Y_i - h_i)
        # weighted:  x <- x - eta_l (p_i (g - h_i) + Y_i / N) = x - eta_l (N p_i / N)(g + Y_i / (N p_i) - h_i)
        estimate = self.memory_estimate(down, state, clients, ctx)
        w = self.weights(clients, ctx)
        if w is None:
            return LocalPlan(start=start, correction=estimate - state["h"], lr_scale=1.0 / ctx.num_clients)
        return LocalPlan(start=start, correction=estimate / rows(w) - state["h"],
                         lr_scale=w / ctx.num_clients)

    def client_finish(self, down: dict[str, Tensor], state: dict[str, Tensor], local: LocalResult,
                      clients: Clients, ctx: RoundContext) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        h_new = local.grad_mean  # (1/K) sum_k of the RAW gradients
        delta = h_new - state["h"]  # x_end is NOT uploaded
        w = self.weights(clients, ctx)
        upload = delta if w is None else rows(w) * delta
        return {"delta": upload}, {**state, "h": h_new, **self.client_extra_state(down, state)}

    def server_step(self, ctx: RoundContext) -> float:
        """c_t = eta_g eta_l(t) K / N: x^(t+1) = x^(t) - c_t y^(t)."""
        return self.hp.global_lr * ctx.lr * ctx.local_steps / ctx.num_clients

    def server_update(self, server: dict[str, Tensor], up: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        if ctx.num_active == 0 and self.hp.skip_empty_rounds:
            return server
        y = server["y"] + up["delta"]  # y^(t) = y^(t-1) + sum_{S_t} delta_i = sum_i h_i
        return {**server, "y": y, "x": server["x"] - self.server_step(ctx) * y}


class FedSumB(_FedSumFamily):
    """FedSUM-B (Algorithm 1): h_i = mean of K minibatch gradients at x^(t); no local moves.

    With full participation this is minibatch GD with step eta_g eta_l K (docs/verification.md, V2).
    """

    name = "fedsum_b"
    moves = False


class FedSum(_FedSumFamily):
    """FedSUM (Algorithm 2): the client downloads y^(t-1) and corrects with y_i = y - h_i."""

    name = "fedsum"

    def extra_down(self) -> tuple[str, ...]:
        return ("y",)  # y^(t-1): the server state before this round's update

    def memory_estimate(self, down: dict[str, Tensor], state: dict[str, Tensor], clients: Clients,
                        ctx: RoundContext) -> Tensor:
        return down["y"].expand_as(state["h"])


class FedSumCR(_FedSumFamily):
    """FedSUM-CR (Algorithm 3): the correction is recovered from the stored model.

    The server recursion x^(s+1) = x^(s) - c_s y^(s) gives

        z_i - x^(t) = sum_{s=a_i}^{t-1} c_s y^(s)  =>  ybar_i = (z_i - x^(t)) / sum_{s=a_i}^{t-1} c_s

    with z_i = x^(a_i) the last model it received (x^(0) before its first participation), so the client
    uses Y_i = ybar_i, a c-weighted average of y over the intervening rounds (it contains the client's own
    current h_i unchanged). Denominator, by ``cr_form``:

    * cumulative: C_t - C_{a_i}, with C_t = sum_{s<t} c_s sent down as a scalar and C at the last
      participation kept by the client (0 for a new client: average over rounds 0..t-1);
    * constant:   eta_g eta_l(t) K (t - a_i) / N (a new client, a_i = -1, divides by t + 1: it counts a
      zero-contribution "round -1", fedrun's choice where the paper is silent).

    A non-positive denominator (t = 0 in the cumulative form, eta_l = 0) gives ybar_i = 0.
    a_i is the runtime's ``Clients.last_active`` (the round of the last participation, -1 if never).
    """

    name = "fedsum_cr"
    Hparams = FedSumCRHparams

    @property
    def cumulative(self) -> bool:
        return self.hp.cr_form == "cumulative"

    def extra_server(self) -> tuple[Entry, ...]:
        return (Scalar("C"),) if self.cumulative else ()

    def extra_client(self) -> tuple[Entry, ...]:
        z = Vector("z", "model")  # z_i = x^(a_i); x^(0) for a never-seen client
        return (z, Scalar("c_seen")) if self.cumulative else (z,)  # c_seen = C_{a_i}

    def extra_down(self) -> tuple[str, ...]:
        return ("C",) if self.cumulative else ()

    def memory_estimate(self, down: dict[str, Tensor], state: dict[str, Tensor], clients: Clients,
                        ctx: RoundContext) -> Tensor:
        if self.cumulative:
            denom = down["C"] - state["c_seen"]
        else:
            elapsed = (ctx.round - clients.last_active).to(state["z"].dtype)  # t - a_i >= 1
            denom = self.server_step(ctx) * elapsed
        safe = torch.where(denom > 0, denom, torch.ones_like(denom))
        ybar = (state["z"] - down["x"]) / rows(safe)
        return torch.where(rows(denom > 0), ybar, torch.zeros_like(ybar))

    def client_extra_state(self, down: dict[str, Tensor], state: dict[str, Tensor]) -> dict[str, Tensor]:
        new = {"z": down["x"].expand_as(state["z"]).clone()}  # z_i <- x^(t)
        if self.cumulative:
            new["c_seen"] = down["C"].expand_as(state["c_seen"]).clone()  # C at the last participation
        return new

    def server_update(self, server: dict[str, Tensor], up: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        new = super().server_update(server, up, ctx)
        if self.cumulative and new is not server:  # a step was taken: C_{t+1} = C_t + c_t
            new["C"] = server["C"] + self.server_step(ctx)
        return new
