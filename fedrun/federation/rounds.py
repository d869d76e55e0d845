"""One round: the single place where a round happens, whatever the schedule.

Round (or asynchronous server step) t, on every rank; the runtime never knows which algorithm runs:

1. ask the schedule: who starts training now, whose uploads the server consumes now (identical on
   every rank);
2. read this round's downlink (received by the broadcast that ended the previous round);
3. train this rank's starting clients: local plan, K local steps, client rule; the schedule holds their
   uploads (the synchronous one until step 4 of the same round, the asynchronous one in their rows);
4. the schedule releases this rank's consumed uploads; sum them (gathered entries: place their rows),
   store the trained clients' new state (not a dropped client's) and join ONE reduce to rank 0;
5. rank 0 applies the server rule and publishes the next downlink in ONE broadcast;
6. the consumed clients' update (``active_update``, on their rows) and the block-wide bookkeeping of the
   scalar client entries (``after_round``), delay metrics, evaluation, the metrics record.

The round receives the objects it uses (:class:`Round`): the client trainer (this rank's clients and the
algorithm's client rules, :mod:`fedrun.federation.client_trainer`), the exchange, the evaluation, the placement
of the clients on the ranks, the run's fixed numbers (:class:`RoundFacts`) and the upload transforms
(:mod:`fedrun.federation.upload_transform`: corruption, privacy), a list it applies without knowing what is
in it: the trainer applies their client side in step 3, the round their server rules around the sum in step
5 and their parts of the record in step 6. What changes from round to round, including the schedule that
owns its buffer of waiting uploads and the client store they wait in, is the
:class:`~fedrun.federation.run_state.RunState` it is passed. Staleness is the schedule's: the round asks the step
(:meth:`~fedrun.federation.schedule.Step.consumed_staleness`) and never tests for a synchronous round.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrun.federation.blocks import Placement
from fedrun.federation.client_trainer import ClientTrainer
from fedrun.federation.evaluation import CLIENT_ARRAYS, Evaluation
from fedrun.federation.exchange import Exchange, Uplink, finite_uploads
from fedrun.federation.run_state import RunState
from fedrun.federation.schedule import Step
from fedrun.federation.upload_transform import UploadTransform
from fedrun.metrics.fingerprint import fingerprint
from fedrun.protocol import RoundContext
from fedrun.runtime.world import World
from fedrun.training.schedule import local_lr

__all__ = ["CLIENT_ARRAYS", "Round", "RoundFacts", "start_groups"]


@dataclass(frozen=True)
class RoundFacts:
    """The run's fixed numbers every round reads (the constants of :class:`~fedrun.protocol.RoundContext`)."""

    num_clients: int  # N
    dim: int  # d
    total_examples: float  # sum_j n_j
    rounds: int  # T (run.rounds)
    local_steps: int  # K (local.steps)
    skip_nonfinite: bool  # run.skip_nonfinite_clients

    def context(self, t: int, lr: float, num_active: int, staleness: tuple[Tensor | None, int] = (None, 0),
                ) -> RoundContext:
        """What the rules know about step t: |S_t| = ``num_active``, and the consumed uploads' staleness
        and its maximum (:meth:`~fedrun.federation.schedule.Step.consumed_staleness`)."""
        return RoundContext(round=t, lr=lr, num_clients=self.num_clients, num_active=num_active,
                            local_steps=self.local_steps, dim=self.dim, total_examples=self.total_examples,
                            total_rounds=self.rounds, staleness=staleness[0], max_staleness=staleness[1])


@dataclass
class Round:
    """The round of a run on this rank, with the collaborators it uses (see the module docstring)."""

    trainer: ClientTrainer
    exchange: Exchange
    evaluation: Evaluation
    placement: Placement
    world: World
    facts: RoundFacts
    transforms: list[UploadTransform] = field(default_factory=list)  # the runtime's changes to the uploads

    def run(self, state: RunState, t: int, stop_requested: Callable[[], bool] = lambda: False) -> dict[str, Any]:
        """Run round t (collective over all ranks), advance ``state`` and return the round's metrics record;
        ``stop_requested()``: this rank received a stop signal, asked when the round's reduce is packed (a
        signal during local training stops the run after this round, on every rank)."""
        world, schedule, placement, facts, trainer = self.world, state.schedule, self.placement, self.facts, \
            self.trainer
        wall = time.perf_counter()
        # 1. the schedule's step, identical on every rank
        step = schedule.begin(t)
        lr = local_lr(trainer.local, t)
        train_ctx = facts.context(t, lr, len(step.start))
        ctx = facts.context(t, lr, len(step.consume), step.consumed_staleness(world.device))
        # 2. this round's downlink
        down = self.exchange.downlink()
        # 3. local training of this rank's starting clients; the schedule holds their uploads
        trained = []
        starting = placement.local_rows(step.start)
        for rows, start in start_groups(step, starting, placement.first, down):
            staleness = step.training_staleness(len(rows), world.device)
            up, loss, new_state = trainer.train(state, rows, start, down, train_ctx, staleness)
            schedule.hold(state.clients, trainer.index(rows), {**up, "loss": loss})
            trained.append((rows, new_state))
        # 4. this rank's consumed uploads, released by the schedule (summed exactly in 5); the trained clients'
        # new state
        # a synchronous round consumes the very clients it started: the same rows
        consumed = starting if step.consume is step.start else placement.local_rows(step.consume)
        uplink, kept = self.consume(state, step, consumed, stop_requested)
        bad = consumed[~kept]
        for rows, new_state in trained:
            self.store_state(state, rows, new_state, bad)
        # 5. one reduce, the server rule on rank 0, one broadcast
        label = f"{schedule.step_name} {t + 1}"  # user-visible numbers count from 1
        rule = trainer.algorithm.server_update
        for transform in reversed(self.transforms):  # on rank 0 the sum meets the first transform's rule first
            rule = transform.server_rule(rule, schedule.probabilities(t))
        outcome = self.exchange.step(label, ctx, uplink, state.server, rule)
        state.server = outcome.server
        arrived = np.zeros(facts.num_clients, dtype=bool)
        arrived[step.consume] = True
        dropped = outcome.nonfinite if facts.skip_nonfinite else 0
        if dropped:  # the dropped clients count as absent from this round, on every rank
            ctx = dataclasses.replace(ctx, num_active=ctx.num_active - dropped)
            for ids in world.allgather_object((bad + placement.first).tolist()):
                arrived[ids] = False
            consumed = consumed[kept]
        # 6. bookkeeping for every client of the block, delay metrics, evaluation
        trainer.update(state.clients, outcome.down_next, consumed, ctx)
        delays = state.delay.update(arrived)
        delays.pop("round")  # the tracker's own 0-based counter; user-visible rounds count from 1 (README)
        entry: dict[str, Any] = {"round": t + 1, "train_loss": outcome.train_loss, "active_clients": ctx.num_active,
                                 "local_lr": lr, **delays}
        if facts.skip_nonfinite:
            entry["dropped_clients"] = dropped
        for transform in self.transforms:
            entry.update(transform.after_step(t, step.consume))
        entry.update(schedule.end(t, step, down["x"]))
        if self.evaluation.due(t):
            entry.update(self.evaluation.after_round(outcome.down_next["x"], t, state.strategy, stop_requested))
            if self.evaluation.stopped:  # every rank stops after this round, as if the reduce had carried it
                self.exchange.stop_after_step()
        self.account(state, entry, ctx.num_active, len(step.start) - dropped)
        if world.is_root:  # the server state's exact bits (x among them), for fedrun compare
            entry["fingerprint"] = fingerprint(state.server, "server/")
        entry["wall_s"] = time.perf_counter() - wall
        state.next_round = t + 1
        return entry

    def consume(self, state: RunState, step: Step, consumed: np.ndarray,
                stop_requested: Callable[[], bool]) -> tuple[Uplink, np.ndarray]:
        """This rank's part of the step's reduce: the uploads of its consumed clients (block rows ``consumed``),
        released by the schedule, to be summed exactly by the exchange (without the non-finite ones under
        ``run.skip_nonfinite_clients``, zeroed otherwise), and a bool mask of the clients whose upload was
        finite."""
        first = self.placement.first
        if not len(consumed):
            return Uplink(stop_requested=stop_requested()), np.ones(0, dtype=bool)
        up = state.schedule.release(state.clients, self.trainer.index(consumed))
        loss = up.pop("loss")
        uploads, losses, kept = finite_uploads(up, loss, self.facts.skip_nonfinite)
        bad = consumed[~kept] + first
        rows = consumed[kept] if self.facts.skip_nonfinite else consumed  # the uploads' rows (dropped: none)
        slots = np.searchsorted(step.consume, rows + first)  # their positions among the consumed, in id order
        return Uplink(uploads, losses, slots, nonfinite=len(bad), bad_client=int(bad.min()) if len(bad) else -1,
                      stop_requested=stop_requested()), kept

    def store_state(self, state: RunState, rows: np.ndarray, new_state: dict[str, Tensor],
                    dropped: np.ndarray) -> None:
        """Store the new client state of the trained block rows ``rows``, except for the ``dropped`` rows (a
        client dropped for a non-finite upload keeps its state from before the round)."""
        if len(dropped):
            keep = ~np.isin(rows, dropped)
            if not keep.all():
                new_state = {name: value[torch.as_tensor(keep, device=value.device)]
                             for name, value in new_state.items()}
                rows = rows[keep]
        state.clients.scatter(self.trainer.index(rows), new_state)

    def account(self, state: RunState, entry: dict[str, Any], uploads: int, downloads: int) -> None:
        """Communication of the round in floats, per round and cumulative (from the declaration)."""
        entry["uplink_floats"] = uploads * self.exchange.up_floats
        entry["downlink_floats"] = downloads * self.exchange.down_floats
        prev = state.metrics[-1] if state.metrics else {}
        entry["cum_uplink_floats"] = prev.get("cum_uplink_floats", 0) + entry["uplink_floats"]
        entry["cum_downlink_floats"] = prev.get("cum_downlink_floats", 0) + entry["downlink_floats"]


def start_groups(step: Step, rows: np.ndarray, first: int, down: dict[str, Tensor],
                 ) -> list[tuple[np.ndarray, dict[str, Tensor]]]:
    """This rank's starting clients (block rows ``rows``; global id = row + ``first``) grouped by the
    downlink their local plan starts from: those the step starts from the previous model first, then the
    others from ``down``."""
    if not len(step.from_previous):  # no client starts from the previous model (all but the asynchronous quirk)
        return [(rows, down)] if len(rows) else []
    previous = np.isin(rows + first, step.from_previous)
    groups = [(rows[previous], {**down, "x": step.previous_x}), (rows[~previous], down)]
    return [(group, start) for group, start in groups if len(group)]
