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
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrun.config import Config
from fedrun.federation.build import RunState, Setup
from fedrun.federation.exchange import Uplink, finite_uploads
from fedrun.federation.schedule import Step
from fedrun.metrics.fingerprint import fingerprint
from fedrun.metrics.per_client import summary
from fedrun.protocol import Clients, LocalResult, RoundContext, Vector
from fedrun.runtime.exact_sum import all_reduce_exact_sum
from fedrun.training.evaluate import evaluate_examples
from fedrun.training.gradients import local_oracle
from fedrun.training.local import run_local
from fedrun.training.schedule import local_lr

CLIENT_ARRAYS = "_client_arrays"  # entry key of the per-client arrays of an evaluation (the loop takes them out)


def run_round(setup: Setup, state: RunState, t: int, stop_requested: Callable[[], bool] = lambda: False,
              ) -> dict[str, Any]:
    """Run round t (collective over all ranks), advance ``state`` and return the round's metrics record;
    ``stop_requested()``: this rank received a stop signal, asked when the round's reduce is packed (a
    signal during local training stops the run after this round, on every rank)."""
    cfg, world, schedule, placement = setup.cfg, setup.world, state.schedule, setup.placement
    wall = time.perf_counter()
    # 1. the schedule's step, identical on every rank
    step = schedule.begin(t)
    lr = local_lr(cfg.local, t)
    train_ctx = context(setup, t, lr, len(step.start))
    ctx = context(setup, t, lr, len(step.consume), step.staleness)
    # 2. this round's downlink
    down = setup.exchange.downlink()
    # 3. local training of this rank's starting clients; the schedule holds their uploads
    trained = []
    for rows, start in start_groups(step, placement.local_rows(step.start), placement.first, down):
        fresh = None if step.staleness is None else np.zeros(len(rows), dtype=np.int64)  # counts from the start
        up, loss, new_state = train_clients(setup, state, rows, start, down, t, train_ctx, fresh)
        schedule.hold(state.clients, rows_index(setup, rows), {**up, "loss": loss})
        trained.append((rows, new_state))
    # 4. this rank's consumed uploads, released by the schedule (summed exactly in 5); the trained clients' new state
    skip = cfg.run.skip_nonfinite_clients
    consumed = placement.local_rows(step.consume)
    uplink, kept = consume(setup, state, step, consumed, stop_requested)
    bad = consumed[~kept]
    for rows, new_state in trained:
        store_state(setup, state, rows, new_state, bad)
    # 5. one reduce, the server rule on rank 0, one broadcast
    label = f"{schedule.step_name} {t + 1}"  # user-visible numbers count from 1
    rule, privacy = setup.algorithm.server_update, setup.privacy
    if privacy is not None:  # the server rule sees the noised sum (docs/privacy.md); the algorithm never knows
        privacy.before_exchange()
        rule = privacy.server_rule(rule, schedule.probabilities(t))
    outcome = setup.exchange.step(label, ctx, uplink, state.server, rule)
    if privacy is not None:
        privacy.after_exchange()
    state.server = outcome.server
    arrived = np.zeros(setup.num_clients, dtype=bool)
    arrived[step.consume] = True
    dropped = outcome.nonfinite if skip else 0
    if dropped:  # the dropped clients count as absent from this round, on every rank
        ctx = dataclasses.replace(ctx, num_active=ctx.num_active - dropped)
        for ids in world.allgather_object((bad + placement.first).tolist()):
            arrived[ids] = False
        consumed = consumed[kept]
    # 6. bookkeeping for every client of the block, delay metrics, evaluation
    mask = torch.zeros(placement.block.num_clients, dtype=torch.bool, device=world.device)
    mask[torch.as_tensor(consumed, device=world.device, dtype=torch.long)] = True
    update_clients(setup, state, outcome.down_next, consumed, mask, ctx)
    delays = state.delay.update(arrived)
    delays.pop("round")  # the tracker's own 0-based counter; user-visible rounds count from 1 (README)
    entry: dict[str, Any] = {"round": t + 1, "train_loss": outcome.train_loss, "active_clients": ctx.num_active,
                             "local_lr": lr, **delays}
    if skip:
        entry["dropped_clients"] = dropped
    if privacy is not None:
        entry.update(privacy.record(t, step.consume))
    entry.update(schedule.end(t, step, down["x"]))
    if eval_due(cfg, t):
        entry.update(evaluate(setup, outcome.down_next["x"]))
        if setup.client_eval is not None:
            entry.update(evaluate_clients(setup, state, outcome.down_next["x"], t))
    account(setup, state, entry, ctx.num_active, len(step.start) - dropped)
    if world.is_root:  # the server state's exact bits (x among them), for fedrun compare
        entry["fingerprint"] = fingerprint(state.server, "server/")
    entry["wall_s"] = time.perf_counter() - wall
    state.next_round = t + 1
    return entry


def context(setup: Setup, t: int, lr: float, num_active: int, staleness: np.ndarray | None = None) -> RoundContext:
    """What the rules know about step t: |S_t| = ``num_active``, and the staleness of the consumed uploads."""
    cfg = setup.cfg
    tau = None if staleness is None else torch.as_tensor(staleness, dtype=torch.int64, device=setup.world.device)
    return RoundContext(round=t, lr=lr, num_clients=setup.num_clients, num_active=num_active,
                        local_steps=cfg.local.steps, dim=setup.dim, total_examples=setup.total_examples,
                        total_rounds=cfg.run.rounds, staleness=tau,
                        max_staleness=int(staleness.max()) if staleness is not None and len(staleness) else 0)


def consume(setup: Setup, state: RunState, step: Step, consumed: np.ndarray,
            stop_requested: Callable[[], bool]) -> tuple[Uplink, np.ndarray]:
    """This rank's part of the step's reduce: the uploads of its consumed clients (block rows ``consumed``),
    released by the schedule, to be summed exactly by the exchange (without the non-finite ones under
    ``run.skip_nonfinite_clients``, zeroed otherwise), and a bool mask of the clients whose upload was finite."""
    first = setup.placement.first
    if not len(consumed):
        return Uplink(stop_requested=stop_requested()), np.ones(0, dtype=bool)
    up = state.schedule.release(state.clients, rows_index(setup, consumed))
    loss = up.pop("loss")
    uploads, losses, kept = finite_uploads(up, loss, setup.cfg.run.skip_nonfinite_clients)
    bad = consumed[~kept] + first
    slots = np.searchsorted(step.consume, consumed + first)  # rows of gathered uploads, client-id order
    return Uplink(uploads, losses, slots, nonfinite=len(bad), bad_client=int(bad.min()) if len(bad) else -1,
                  stop_requested=stop_requested()), kept


def store_state(setup: Setup, state: RunState, rows: np.ndarray, new_state: dict[str, Tensor],
                dropped: np.ndarray) -> None:
    """Store the new client state of the trained block rows ``rows``, except for the ``dropped`` rows (a
    client dropped for a non-finite upload keeps its state from before the round)."""
    keep = ~np.isin(rows, dropped)
    if not keep.all():
        new_state = {name: value[torch.as_tensor(keep, device=value.device)] for name, value in new_state.items()}
    state.clients.scatter(rows_index(setup, rows[keep]), new_state)


def update_clients(setup: Setup, state: RunState, down_next: dict[str, Tensor], consumed: np.ndarray,
                   mask: Tensor, ctx: RoundContext) -> None:
    """The algorithm's rules after the round: ``active_update`` on the rows of this rank's consumed clients
    (block rows ``consumed``, ``mask`` as a bool mask of the block), then ``after_round`` on the block's scalar
    entries; each runs only when the algorithm has one (the defaults change nothing)."""
    algorithm, store = setup.algorithm, state.clients
    if algorithm.defines("active_update") and len(consumed):
        index = rows_index(setup, consumed)
        rows = store.gather(index, [e.name for e in setup.decl.client])
        store.scatter(index, algorithm.active_update(down_next, rows, ctx))
    if algorithm.defines("after_round"):
        scalars = [e.name for e in setup.decl.client if not isinstance(e, Vector)]
        store.replace(algorithm.after_round(down_next, store.whole(scalars), mask, ctx))


def rows_index(setup: Setup, rows: np.ndarray) -> Tensor:
    """Block rows as an index tensor on this rank's device."""
    return torch.as_tensor(rows, device=setup.world.device)


def start_groups(step: Step, rows: np.ndarray, first: int, down: dict[str, Tensor],
                 ) -> list[tuple[np.ndarray, dict[str, Tensor]]]:
    """This rank's starting clients (block rows ``rows``; global id = row + ``first``) grouped by the
    downlink their local plan starts from: those the step starts from the previous model first, then the
    others from ``down``."""
    previous = np.isin(rows + first, step.from_previous)
    groups = [(rows[previous], {**down, "x": step.previous_x}), (rows[~previous], down)]
    return [(group, start) for group, start in groups if len(group)]


def train_clients(setup: Setup, state: RunState, rows: np.ndarray, start: dict[str, Tensor],
                  down: dict[str, Tensor], t: int, ctx: RoundContext, staleness: np.ndarray | None,
                  ) -> tuple[dict[str, Tensor], Tensor, dict[str, Tensor]]:
    """The plan (from ``start``, usually the round's downlink ``down``), the K local steps and the client
    rule (against ``down``) for block rows ``rows`` (sorted); ``staleness``: what the rules see while
    training (None in synchronous rounds). Returns the uploads, the mean training losses and the new
    client state, ``[C, ...]`` in the order of ``rows``."""
    cfg, algorithm, learner, block = setup.cfg, setup.algorithm, setup.learner, setup.placement.block
    index = rows_index(setup, rows)
    clients = client_view(setup, state, rows, t, staleness)
    client_state = state.clients.gather(index, [e.name for e in setup.decl.client])
    plan = algorithm.local_plan(start, client_state, clients, ctx)
    batches = block.batches(rows, cfg.run.seed, t, cfg.local.batch_size, cfg.local.steps, cfg.local.epochs,
                            cfg.local.shuffle)
    oracle, group_size = local_oracle(state.strategy, learner.model, learner.loss_fn, batches,
                                      rows + block.first, cfg.run.seed, t, reseed=learner.random_model)
    local: LocalResult = run_local(plan, oracle, batches.sizes > 0, ctx.lr, cfg.local, group_size=group_size)
    up, new_state = algorithm.client_finish(down, client_state, local, clients, ctx)
    if setup.corruption is not None:  # the runtime corrupts the chosen clients' deltas; the algorithm never knows
        up = setup.corruption.apply(up, rows + block.first, t)
    if setup.privacy is not None:  # clipped (and noised, in local mode) before they leave the clients
        up = setup.privacy.client_uploads(up, rows + block.first, t)
    return up, local.loss, new_state


def client_view(setup: Setup, state: RunState, rows: np.ndarray, t: int, staleness: np.ndarray | None) -> Clients:
    """What the rules may know about this rank's clients ``rows`` (block rows) in round t."""
    device, block = setup.world.device, setup.placement.block
    ids = rows + block.first
    probabilities = state.schedule.probabilities(t)
    return Clients(
        ids=torch.as_tensor(ids, device=device),
        num_examples=torch.as_tensor(block.num_examples[rows], dtype=setup.dtype, device=device),
        participations=torch.as_tensor(state.delay.participations[ids], device=device),
        last_active=torch.as_tensor(state.delay.last_active[ids], device=device),
        probability=None if probabilities is None else torch.as_tensor(probabilities[ids], dtype=setup.dtype,
                                                                       device=device),
        staleness=None if staleness is None else torch.as_tensor(staleness, dtype=torch.int64, device=device),
    )


def eval_due(cfg: Config, t: int) -> bool:
    """Evaluate after round t: every ``eval.every`` rounds and after the last one."""
    every = cfg.eval.every
    return t + 1 == cfg.run.rounds or (every > 0 and (t + 1) % every == 0)


def evaluate(setup: Setup, x: Tensor) -> dict[str, float]:
    """Test loss (and accuracy) of model ``x`` on the pooled test set, each rank evaluating its shard; the
    per-example losses and hits are summed exactly (the same bits on any number of ranks)."""
    learner = setup.learner
    examples = evaluate_examples(learner.model, learner.loss_fn, x, learner.test_x, learner.test_y,
                                 setup.cfg.eval.batch_size, learner.classification)
    count = learner.num_test
    loss, correct = (float(v) for v in all_reduce_exact_sum(setup.world, examples, max(count, 1)))
    out = {"test_loss": loss / count}
    if learner.classification:
        out["test_accuracy"] = correct / count
    return out


def evaluate_clients(setup: Setup, state: RunState, x: Tensor, t: int) -> dict[str, Any]:
    """The distribution over clients of their own test figures after round t (fedrun.metrics.per_client),
    with the per-client arrays under :data:`CLIENT_ARRAYS` (rank 0; collective)."""
    client_eval = setup.client_eval
    learner = setup.learner
    arrays = client_eval.evaluate(learner.model, learner.loss_fn, x, t, setup.placement.block, state.strategy,
                                  learner.random_model)
    if not arrays:
        return {}
    return {**summary(arrays, client_eval.counts), CLIENT_ARRAYS: arrays}


def account(setup: Setup, state: RunState, entry: dict[str, Any], uploads: int, downloads: int) -> None:
    """Communication of the round in floats, per round and cumulative (from the declaration)."""
    entry["uplink_floats"] = uploads * setup.exchange.up_floats
    entry["downlink_floats"] = downloads * setup.exchange.down_floats
    prev = state.metrics[-1] if state.metrics else {}
    entry["cum_uplink_floats"] = prev.get("cum_uplink_floats", 0) + entry["uplink_floats"]
    entry["cum_downlink_floats"] = prev.get("cum_downlink_floats", 0) + entry["downlink_floats"]
