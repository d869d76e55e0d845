"""Plain local SGD with heavy-ball momentum: the local optimizer of every algorithm that names none.

    buf <- momentum * buf + u ;  direction = buf        (buf = u without momentum)

``u`` is the processed gradient (clipped, plus the plan's correction and ``local.weight_decay * x``, see
``fedrun.training.local``). The buffer starts at zero every round and is not persisted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SGD:
    """A :class:`fedrun.protocol.LocalOptimizer`; ``momentum`` 0 keeps no state."""

    momentum: float = 0.0

    def init(self, x: Tensor, state: dict[str, Tensor] | None) -> dict[str, Tensor]:
        return {"momentum": torch.zeros_like(x)} if self.momentum > 0 else {}

    def step(self, k: int, x: Tensor, u: Tensor, state: dict[str, Tensor],
             grad_at: Callable[[Tensor], Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        if not state:
            return u, state
        buf = self.momentum * state["momentum"] + u
        return buf, {"momentum": buf}
