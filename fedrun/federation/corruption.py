"""Corrupted clients (the ``corruption`` config section): chosen clients upload a corrupted model delta,
so that a user can show an aggregator failing (FedAvg) or holding (fedmedian, fedtrimmedavg, krum).

An upload transform (:mod:`fedrun.federation.upload_transform`) acting on the clients' side only: the
runtime applies it after the client rule, to the upload entry the algorithm declares as its model delta
(``Declaration.model_delta``), so the algorithm never knows; the client's own state is untouched.
For a corrupted client i in round t:

* ``sign_flip``: u_i <- -scale * u_i (the honest delta, reversed and scaled);
* ``gaussian``:  u_i <- scale * z_i, z_i ~ N(0, I_d) drawn from rng([seed, t, i, STREAM]), the same on
  every rank whatever the number of ranks.

The corrupted set is ``corruption.clients``, or round(fraction * N) clients drawn once from the run seed.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedrun.config import CorruptionConfig
from fedrun.errors import ConfigError
from fedrun.protocol import Declaration, ServerRule

STREAM = 0x434F5252  # "CORR": which clients (round 0) and the Gaussian uploads (per round and client)


class Corruption:
    """The corrupted clients of a run and what their uploads become (an ``UploadTransform``)."""

    def __init__(self, cfg: CorruptionConfig, decl: Declaration, algorithm: str, num_clients: int, seed: int) -> None:
        if decl.model_delta is None:
            raise ConfigError(f"corruption.kind={cfg.kind}: algorithm {algorithm} declares no model-delta upload "
                              "(Declaration.model_delta); expected an algorithm that does, e.g. fedavg, fedprox, "
                              "fedmedian, fedtrimmedavg, krum")
        if cfg.clients is not None and max(cfg.clients) >= num_clients:
            raise ConfigError(f"corruption.clients: expected client ids below data.num_clients = {num_clients}, "
                              f"got {max(cfg.clients)}")
        self.cfg, self.entry, self.seed = cfg, decl.model_delta, seed
        self.mask = np.zeros(num_clients, dtype=bool)
        if cfg.clients is not None:
            self.mask[cfg.clients] = True
        else:
            count = round(cfg.fraction * num_clients)
            self.mask[np.random.default_rng([seed, 0, STREAM]).choice(num_clients, count, replace=False)] = True

    def client_uploads(self, up: dict[str, Tensor], ids: np.ndarray, t: int) -> dict[str, Tensor]:
        """The uploads ``up`` (``[C, ...]``) of global clients ``ids`` in round t, the corrupted rows replaced."""
        rows = np.flatnonzero(self.mask[ids])
        if not len(rows):
            return up
        value = up[self.entry].clone()
        scale = self.cfg.scale
        for row in rows:
            if self.cfg.kind == "sign_flip":
                value[row] = -scale * value[row]
            else:
                noise = np.random.default_rng([self.seed, t, int(ids[row]), STREAM]).standard_normal(value.shape[1])
                value[row] = scale * torch.as_tensor(noise, dtype=value.dtype, device=value.device)
        return {**up, self.entry: value}

    def server_rule(self, rule: ServerRule, probabilities: np.ndarray | None) -> ServerRule:
        """The server rule as it is: the sum of corrupted and honest uploads is the aggregator's to handle."""
        return rule

    def after_step(self, t: int, participants: np.ndarray) -> dict[str, float]:
        """Nothing for the metrics record (the corrupted set is fixed for the run)."""
        return {}
