"""The client side of a round on this rank: what its clients train with, and the algorithm's client rules.

For a group C of this rank's clients (block rows, sorted), round t, with downlink ``down`` and the model
``start`` their local plan starts from (usually ``down``):

    plan   = local_plan(start, state_C, clients_C, ctx)
    local  = K local steps of the oracle of the run's local strategy on C's minibatches of round t
    up_C, state_C' = client_finish(down, state_C, local, clients_C, ctx)

then the runtime's own changes to the uploads, which the algorithm never sees: each upload transform's
``client_uploads`` in list order (:mod:`fedrun.federation.upload_transform`: the chosen clients' corruption,
the privacy mechanism's clipping and local noise). After the exchange, ``active_update`` on the consumed
clients' rows and ``after_round`` on the block's scalar entries.

The trainer receives what it uses (the algorithm, the model, this rank's client block, ``local``, the seed
and the upload transforms), never the whole config; the round (:mod:`fedrun.federation.rounds`) passes it
the run state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from fedrun.algorithms.base import Algorithm
from fedrun.config import LocalConfig
from fedrun.data.client_block import ClientBlock
from fedrun.federation.run_state import RunState
from fedrun.federation.upload_transform import UploadTransform
from fedrun.protocol import Clients, Declaration, LocalResult, RoundContext, Vector
from fedrun.state.store import ClientStore
from fedrun.training.dropout import DropoutSeeds
from fedrun.training.flat_model import FlatModel
from fedrun.training.losses import LossFn


@dataclass
class Learner:
    """The model and what it is trained and tested with on this rank."""

    model: FlatModel
    random_model: bool  # the forward pass draws random numbers (dropout)
    loss_fn: LossFn
    classification: bool
    test_x: Tensor  # this rank's shard of the test set: whole batches of eval.batch_size
    test_y: Tensor
    num_test: int  # examples in the whole test set


@dataclass
class ClientTrainer:
    """Trains groups of this rank's clients and applies the algorithm's client rules to their rows."""

    algorithm: Algorithm
    decl: Declaration
    learner: Learner
    block: ClientBlock  # this rank's clients (block row r is client block.first + r)
    local: LocalConfig
    seed: int
    transforms: list[UploadTransform] = field(default_factory=list)  # the runtime's changes to the uploads

    def train(self, state: RunState, rows: np.ndarray, start: dict[str, Tensor], down: dict[str, Tensor],
              ctx: RoundContext, staleness: Tensor | None) -> tuple[dict[str, Tensor], Tensor, dict[str, Tensor]]:
        """The plan (from ``start``), the K local steps of round ``ctx.round`` and the client rule (against
        ``down``) for block rows ``rows`` (sorted); ``staleness``: what the rules see while training (the
        schedule's :meth:`~fedrun.federation.schedule.Step.training_staleness`). Returns the uploads, the mean
        training losses and the new client state, ``[C, ...]`` in the order of ``rows``."""
        t, algorithm, learner, block, local_cfg = ctx.round, self.algorithm, self.learner, self.block, self.local
        index = self.index(rows)
        clients = self.view(state, rows, t, staleness)
        client_state = state.clients.gather(index, self.client_names())
        plan = algorithm.local_plan(start, client_state, clients, ctx)
        batches = block.batches(rows, self.seed, t, local_cfg.batch_size, local_cfg.steps, local_cfg.epochs,
                                local_cfg.shuffle)
        seeds = DropoutSeeds(rows + block.first, self.seed, t) if learner.random_model else None
        local: LocalResult = state.strategy.train(plan, batches, ctx.lr, local_cfg, seeds)
        up, new_state = algorithm.client_finish(down, client_state, local, clients, ctx)
        for transform in self.transforms:  # before the uploads leave the clients; the algorithm never knows
            up = transform.client_uploads(up, rows + block.first, t)
        return up, local.loss, new_state

    def view(self, state: RunState, rows: np.ndarray, t: int, staleness: Tensor | None) -> Clients:
        """What the rules may know about this rank's clients ``rows`` (block rows) in round t."""
        device, dtype = self.block.device, self.block.dtype
        ids = rows + self.block.first
        probabilities = state.schedule.probabilities(t)
        participations, last_active = state.delay.of(ids)
        return Clients(
            ids=torch.as_tensor(ids, device=device),
            num_examples=torch.as_tensor(self.block.num_examples[rows], dtype=dtype, device=device),
            participations=torch.as_tensor(participations, device=device),
            last_active=torch.as_tensor(last_active, device=device),
            probability=None if probabilities is None else torch.as_tensor(probabilities[ids], dtype=dtype,
                                                                           device=device),
            staleness=staleness,
        )

    def update(self, store: ClientStore, down_next: dict[str, Tensor], consumed: np.ndarray,
               ctx: RoundContext) -> None:
        """The algorithm's rules after the round: ``active_update`` on the rows of this rank's consumed clients
        (block rows ``consumed``), then ``after_round`` on the block's scalar entries (with the consumed clients
        as a bool mask of the block, built only then); each runs only when the algorithm has one (the defaults
        change nothing)."""
        algorithm = self.algorithm
        if algorithm.defines("active_update") and len(consumed):
            index = self.index(consumed)
            store.scatter(index, algorithm.active_update(down_next, store.gather(index, self.client_names()), ctx))
        if algorithm.defines("after_round"):
            mask = torch.zeros(self.block.num_clients, dtype=torch.bool, device=self.block.device)
            mask[self.index(consumed).long()] = True
            scalars = [e.name for e in self.decl.client if not isinstance(e, Vector)]
            store.replace(algorithm.after_round(down_next, store.whole(scalars), mask, ctx))

    def client_names(self) -> list[str]:
        """The algorithm's per-client entries."""
        return [e.name for e in self.decl.client]

    def index(self, rows: np.ndarray) -> Tensor:
        """Block rows as an index tensor on this rank's device."""
        return torch.as_tensor(rows, device=self.block.device)
