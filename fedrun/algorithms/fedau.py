"""FedAU: weights from online estimates of each client's participation interval (Wang & Ji 2023;
following the official code; docs/algorithms/fedopt_memory_fedau_fedawe.md).

Per client i, three scalars: ``gap`` (cnt_i, rounds since its last recorded interval), ``interval_sum``
and ``interval_count``; omega_i = interval_sum / interval_count (1 before the first interval).

    for i in S_t:   omega_i read from PAST intervals only   -> upload omega_i Delta_i
    x <- x + eta_g (1/N) sum_{i in S_t} omega_i Delta_i      # divides by the TOTAL number of clients N
    then, for every client (``after_round``):
        i in S_t:   record interval gap_i + 1 ; gap_i <- 0
        i not in S_t: gap_i <- gap_i + 1 ; if gap_i >= K_cut: record interval gap_i ; gap_i <- 0

"record L" is interval_sum += L, interval_count += 1. Reading omega before recording the current
interval keeps the weight independent of the current participation indicator. Down 1 / up 1;
the counters are O(1) scalars per client, held by the owner rank. Empty S_t: x unchanged.
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
    Scalar,
    Vector,
    model_delta,
    rows,
    unchanged_if_empty,
)
from fedrun.config.hparams import FedAUHparams


def interval_weight(state: dict[str, Tensor]) -> Tensor:
    """omega = mean recorded interval, 1 when none is recorded yet."""
    count = state["interval_count"]
    return torch.where(count > 0, state["interval_sum"] / count.clamp_min(1), torch.ones_like(count))


class FedAU(Algorithm):
    name = "fedau"
    Hparams = FedAUHparams

    def declare(self) -> Declaration:
        return Declaration(server=(Vector("x", "model"),),
                           client=(Scalar("gap"), Scalar("interval_sum"), Scalar("interval_count")),
                           down=("x",), up=(Vector("delta"),))

    def client_finish(self, down: dict[str, Tensor], state: dict[str, Tensor], local: LocalResult,
                      clients: Clients, ctx: RoundContext) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        return {"delta": rows(interval_weight(state)) * model_delta(local, down)}, state

    @unchanged_if_empty
    def server_update(self, server: dict[str, Tensor], up: dict[str, Tensor],
                      ctx: RoundContext) -> dict[str, Tensor]:
        return {**server, "x": server["x"] + self.hp.global_lr * up["delta"] / ctx.num_clients}

    def after_round(self, down_next: dict[str, Tensor], state: dict[str, Tensor], active: Tensor,
                    ctx: RoundContext) -> dict[str, Tensor]:
        length = state["gap"] + 1  # active: the interval ending now; inactive: the grown gap
        record = active
        if self.hp.cutoff is not None:
            record = record | (length >= self.hp.cutoff)
        recorded = record.to(length.dtype)
        return {"gap": torch.where(record, torch.zeros_like(length), length),
                "interval_sum": state["interval_sum"] + recorded * length,
                "interval_count": state["interval_count"] + recorded}
