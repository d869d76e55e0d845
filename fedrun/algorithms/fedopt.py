"""Server optimizers on the mean client update (FedOpt, Reddi et al. 2021; FedAvgM, Hsu et al. 2019).

Clients run plain local SGD from x and upload Delta_i = x_i^(t,K) - x^(t); the server forms

    Delta_t = sum_{i in S_t} w_i Delta_i      (w_i = 1/|S_t|; or n_i / sum_{S_t} n_j, Flower's default)

and treats it as a pseudo-gradient (signed as movement):

* FedAvgM (heavy ball without damping):  m <- beta m + Delta_t ;  x <- x + eta m
* FedAdam / FedYogi / FedAdagrad (Reddi et al. 2021), one skeleton:

      m <- beta1 m + (1 - beta1) Delta_t
      v <- rule(v, Delta_t^2)       Adam:    beta2 v + (1 - beta2) Delta_t^2
                                    Yogi:    v - (1 - beta2) Delta_t^2 * sign(v - Delta_t^2)   (sign(0) = 0)
                                    Adagrad: v + Delta_t^2
      x <- x + eta m / (sqrt(v) + tau)

Down 1 / up 1 vector. Empty S_t: nothing changes, no moment decay (fedrun's convention; the
paper does not say).
Options: ``bias_correction`` (default false, as in Reddi et al.; ``true``: Adam's 1/(1 - beta^n) on m and
v, as FADAS applies it; FedAdam only, ``flower``: Flower's step-size form, see ``FedAdamHparams``),
``v_init`` (``tau_squared``: v_{-1} = tau^2 as in the paper, the default; ``zero``: Flower/FedAdamom).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
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
    rows,
    unchanged_if_empty,
)
from fedrun.config.hparams import AdagradHparams, EmaHparams, FedAdamHparams, FedAvgMHparams


class ServerOptimizer(Algorithm):
    """Plain local SGD on the clients; the subclass turns the mean update Delta_t into a server step.

    Subclasses set ``server_state()`` (entries besides x) and ``step(server, delta) -> changed entries``.
    Their Hparams carry ``weighting`` (uniform or data_size).
    """

    def server_state(self) -> tuple[Entry, ...]:
        raise NotImplementedError

    def step(self, server: dict[str, Tensor], delta: Tensor, ctx: RoundContext) -> dict[str, Tensor]:
        raise NotImplementedError

    def declare(self) -> Declaration:
        up: tuple[Entry, ...] = (Vector("delta"),)
        if self.hp.weighting == "data_size":
            up += (Scalar("weight"),)
        return Declaration(server=(Vector("x", "model"), *self.server_state()), down=("x",), up=up)

    def client_finish(self, down: dict[str, Tensor], state: dict[str, Tensor], local: LocalResult,
                      clients: Clients, ctx: RoundContext) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        delta = model_delta(local, down)
        if self.hp.weighting == "data_size":
            return {"delta": rows(clients.num_examples) * delta, "weight": clients.num_examples}, state
        return {"delta": delta}, state

    @unchanged_if_empty
    def server_update(self, server: dict[str, Tensor], up: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        divisor = up["weight"] if self.hp.weighting == "data_size" else ctx.num_active
        return {**server, **self.step(server, up["delta"] / divisor, ctx)}


# ------------------------------------------------------------------------------------------ FedAvgM


class FedAvgM(ServerOptimizer):
    """m <- beta m + Delta_t ; x <- x + eta m. beta = 0 is FedAvg with server lr eta."""

    name = "fedavgm"
    Hparams = FedAvgMHparams

    def server_state(self) -> tuple[Entry, ...]:
        return (Vector("m"),)

    def step(self, server: dict[str, Tensor], delta: Tensor, ctx: RoundContext) -> dict[str, Tensor]:
        m = self.hp.beta * server["m"] + delta
        return {"m": m, "x": server["x"] + self.hp.global_lr * m}


# ------------------------------------------------------------------------ FedAdam / FedYogi / FedAdagrad


class AdaptiveServer(ServerOptimizer):
    """The FedOpt skeleton; subclasses give the second-moment rule."""

    ema: ClassVar[bool]  # v is an exponential average (bias correction of v applies)

    def second_moment(self, v: Tensor, sq: Tensor) -> Tensor:
        raise NotImplementedError

    def server_state(self) -> tuple[Entry, ...]:
        v0 = self.hp.tau ** 2 if self.hp.v_init == "tau_squared" else 0.0
        return (Vector("m"), Vector("v", v0), Scalar("steps"))

    def step(self, server: dict[str, Tensor], delta: Tensor, ctx: RoundContext) -> dict[str, Tensor]:
        hp = self.hp
        steps = server["steps"] + 1
        m = hp.beta1 * server["m"] + (1 - hp.beta1) * delta
        v = self.second_moment(server["v"], delta * delta)
        if hp.bias_correction == "flower":  # Flower's FedAdam: a corrected step size, tau outside
            r = ctx.round + 2  # Flower's exponent server_round + 1, its server_round counted from 1
            eta = hp.global_lr * math.sqrt(1 - hp.beta2 ** r) / (1 - hp.beta1 ** r)
            return {"x": server["x"] + eta * m / (v.sqrt() + hp.tau), "m": m, "v": v, "steps": steps}
        m_hat, v_hat = m, v
        if hp.bias_correction is True:
            if hp.beta1 > 0:
                m_hat = m / (1 - hp.beta1 ** steps)
            if self.ema and hp.beta2 > 0:
                v_hat = v / (1 - hp.beta2 ** steps)
        x = server["x"] + hp.global_lr * m_hat / (v_hat.sqrt() + hp.tau)
        return {"x": x, "m": m, "v": v, "steps": steps}


class FedAdam(AdaptiveServer):
    name = "fedadam"
    Hparams = FedAdamHparams
    ema = True

    def second_moment(self, v: Tensor, sq: Tensor) -> Tensor:
        return self.hp.beta2 * v + (1 - self.hp.beta2) * sq


class FedYogi(AdaptiveServer):
    name = "fedyogi"
    Hparams = EmaHparams
    ema = True

    def second_moment(self, v: Tensor, sq: Tensor) -> Tensor:
        return v - (1 - self.hp.beta2) * sq * torch.sign(v - sq)


class FedAdagrad(AdaptiveServer):
    name = "fedadagrad"
    Hparams = AdagradHparams
    ema = False

    def second_moment(self, v: Tensor, sq: Tensor) -> Tensor:
        return v + sq
