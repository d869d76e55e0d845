"""The algorithm interface: declared state plus pure tensor rules.

An algorithm never sees a rank, a file or a communicator. It declares

* ``server``: vectors and scalars held by the server (rank 0), with initial values;
* ``client``: vectors and scalars held per client, on the rank that owns the client, whether the
  paper calls them client memory (SCAFFOLD c_i) or server memory (MIFA G_i);
* ``down``: the server entries each participating client receives (read at the start of the round);
* ``up``: what each participating client uploads; the runtime only ever delivers their SUM over the
  round's participants to the server rule.

and implements four rules over tensors with a leading client dimension ``[C, ...]``:

* ``local_plan``: where local training starts, the gradient correction and the local optimizer;
* ``client_finish``: from the local result, the upload and the new per-client state;
* ``server_update``: from the summed uploads, the new server state;
* ``active_update`` (optional): the new state of this round's consumed clients given the next round's
  downlink (FedAWE's x_own, FAFED's synced m_i): the only rule after the round that may change a vector
  entry, so its cost is the rows that change, whatever the number of clients;
* ``after_round`` (optional): block-wide bookkeeping of the scalar entries of all of a rank's clients,
  active or not (FedAU's interval counters, FedAWE's echo counts).

From the declaration the runtime derives allocation, sharding by client block, the flat reduce and
broadcast layouts, checkpoint contents and communication accounting.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ClassVar

from torch import Tensor

from fedrun.config.hparams import GlobalLrHparams
from fedrun.protocol import (
    Clients,
    Declaration,
    Entry,
    LocalOptimizer,
    LocalPlan,
    LocalResult,
    RoundContext,
    Scalar,
    Vector,
)

__all__ = ["Algorithm", "Clients", "Declaration", "Entry", "GlobalLrHparams", "LocalOptimizer", "LocalPlan",
           "LocalResult", "RoundContext", "Scalar", "Vector", "model_delta", "rows", "unchanged_if_empty"]


class Algorithm:
    """Base class. Subclasses set ``name``, ``Hparams`` and implement the rules."""

    name: ClassVar[str]
    Hparams: ClassVar[type]

    def __init__(self, hparams: object) -> None:
        self.hp = hparams

    def declare(self) -> Declaration:
        raise NotImplementedError

    def local_plan(self, down: dict[str, Tensor], state: dict[str, Tensor], clients: Clients,
                   ctx: RoundContext) -> LocalPlan:
        """Default: plain local SGD from the downloaded global model."""
        return LocalPlan(start=down["x"].expand(len(clients.ids), -1))

    def client_finish(self, down: dict[str, Tensor], state: dict[str, Tensor], local: LocalResult,
                      clients: Clients, ctx: RoundContext) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        raise NotImplementedError

    def server_update(self, server: dict[str, Tensor], up: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        raise NotImplementedError

    def defines(self, rule: str) -> bool:
        """Whether this algorithm has its own ``rule`` (``active_update``, ``after_round``): the engine skips an
        optional rule the algorithm leaves at its default, which changes nothing."""
        return getattr(type(self), rule) is not getattr(Algorithm, rule)

    def active_update(self, down_next: dict[str, Tensor], state: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        """The new rows of the entries that change for the clients consumed this round: ``state`` holds their
        client entries (``[A, ...]``); returns only the changed entries (default: none)."""
        return {}

    def after_round(self, down_next: dict[str, Tensor], state: dict[str, Tensor], active: Tensor,
                    ctx: RoundContext) -> dict[str, Tensor]:
        """Block-wide update of the scalar client entries (``state``: each ``[C_block]``); ``active`` is a bool
        ``[C_block]`` mask of the clients consumed this round. Returns the changed entries (default: none)."""
        return {}


ServerRule = Callable[[Algorithm, dict[str, Tensor], dict[str, Tensor], RoundContext], dict[str, Tensor]]


def unchanged_if_empty(rule: ServerRule) -> ServerRule:
    """Decorate a ``server_update``: a step that consumed no upload (``ctx.num_active == 0``) returns the
    server state as it is (no step, no moment decay, no step count), without calling the rule."""

    @functools.wraps(rule)
    def guarded(self: Algorithm, server: dict[str, Tensor], up: dict[str, Tensor],
                ctx: RoundContext) -> dict[str, Tensor]:
        if ctx.num_active == 0:
            return server
        return rule(self, server, up, ctx)

    return guarded


def model_delta(local: LocalResult, down: dict[str, Tensor]) -> Tensor:
    """Delta_i = x_i^(t,K) - x^(t), signed as movement (docs/algorithms.md)."""
    return local.x_end - down["x"]


def rows(mask_or_weights: Tensor) -> Tensor:
    """Broadcast a ``[C]`` tensor against ``[C, d]``."""
    return mask_or_weights.unsqueeze(-1)

