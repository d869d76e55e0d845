"""Upload transforms: what the runtime does to the uploads between the algorithm's client rule and its server
rule, without the algorithm knowing (corrupted clients, :mod:`fedrun.federation.corruption`; differential
privacy, :mod:`fedrun.privacy.mechanism`).

The run builds its transforms once at start-up, from their config sections, as a list (empty when neither
``corruption`` nor ``privacy`` is set); the round and the client trainer apply the list without knowing what
is in it. For transforms T_1, ..., T_m in list order, step t with consumed clients S_t:

    u_i  <- T_m.client_uploads(... T_1.client_uploads(u_i) ...)   each client i, on its rank, before the sum
    U    =  sum_{i in S_t} u_i                                     the exchange's exact sum, on rank 0
    rule =  T_1.server_rule(T_2.server_rule(... T_m.server_rule(server_update) ...))

so on rank 0 the sum passes through T_1's rule first, then T_2's, ..., then the algorithm's
``server_update``. Where a transform acts is fixed by the hook, never by the round: per client before the
exact sum (clipping, local noise, corruption), or on the sum on rank 0 (central noise), so the sum's bits do
not depend on the number of ranks. A run's list is [corruption, privacy], each when configured (a corrupted
upload is clipped like any other).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from torch import Tensor

from fedrun.protocol import ServerRule


class UploadTransform(Protocol):
    """One change the runtime makes to the uploads (see the module docstring). ``server_rule`` and
    ``after_step`` are called once a step on every rank, in list order, so they may be collective;
    ``client_uploads`` is called for each group of clients a rank trains (none on a rank without any)."""

    def client_uploads(self, up: dict[str, Tensor], ids: np.ndarray, t: int) -> dict[str, Tensor]:
        """The uploads ``up`` (``[C, ...]``) of global clients ``ids`` in round t as they leave the clients."""

    def server_rule(self, rule: ServerRule, probabilities: np.ndarray | None) -> ServerRule:
        """The rule rank 0 applies to the step's exact sum in place of ``rule`` (``probabilities``: the
        step's P(i in S_t) as the schedule reports it); called on every rank before the step's reduce."""

    def after_step(self, t: int, participants: np.ndarray) -> dict[str, Any]:
        """Step t done with ``participants`` (global ids): what the transform adds to the metrics record."""
