"""Buffered asynchronous server steps (FADAS / FedBuff; ALGORITHMS-BASELINES.md 1.4), selected by the
config section ``asynchrony: {enabled: true, buffer_size: M, concurrency: C, durations: ...}``.

The simulation of the official FADAS code, made deterministic and rank-independent:

* ``C`` clients are in flight at any time. A client dispatched with model version ``t`` (the global model
  after t server steps) trains at the start of server step t, from x_t, exactly as a synchronous round t
  would (same minibatches, keyed by (seed, t, client); same local lr eta_l(t)); it gets a simulated
  duration and hence a finish time ``clock + duration``.
* Server step t consumes the ``M`` in-flight updates with the smallest finish times (ties: smaller client
  id), in one reduce of their summed uploads; the algorithm's server rule sees ``num_active = M`` and the
  staleness ``tau_i = t - t_i^start`` of each of them (``RoundContext.staleness``, ``max_staleness``).
* The clock advances to the M-th smallest finish time; M new clients are dispatched, uniformly from those
  not in flight, with version t + 1.

Determinism: dispatch draws come from ``round_rng(seed, t)`` (the same generator as the uniform
participation pattern, so with C = M and equal durations the run IS the synchronous uniform run), the
durations from ``round_rng(seed, t, DURATION_STREAM)`` in client-id order, the speed classes from
``round_rng(seed, 0, CLASS_STREAM)``. The scheduler state (start version and finish time of every client,
the clock) is replicated on every rank, so nothing depends on the number of ranks.

In-flight state in checkpoints: an update is computed when its client is dispatched, so an in-flight
client is checkpointed as its COMPUTED UPLOAD (per-client rows ``_pending_<entry>`` next to the
algorithm's client state, streamed like any client entry) plus its start version and finish time
(``runtime_state/``). Client state (SCAFFOLD's c_i, ...) is updated when the client computes.
A client owns at most one task, so one row per client suffices; the memory cost is that of one more
per-client vector per uploaded vector.

Communication accounting per step: uplink = M uploads, downlink = the downlinks of the clients that
started training this step.

``asynchrony.replicate_dispatch_quirk`` (default off) reproduces the official FADAS code's dispatch
(ALGORITHMS-BASELINES.md 1.4): at every step t >= 1, the clients dispatched with version t train from
x_{t-1}, except the last one drawn, yet the client rule takes their change against x_t and their recorded
staleness stays t - t_i^start. The previous model and the last drawn client are then part of the
replicated scheduler state (and of checkpoints).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrun.algorithms.base import Declaration, RoundContext, Scalar
from fedrun.config import ConfigError, ParticipationConfig
from fedrun.errors import CheckpointError
from fedrun.federation.loop import Federation
from fedrun.federation.participation import round_rng
from fedrun.state.store import ClientStore
from fedrun.training.schedule import local_lr

DURATION_STREAM = 0x44555241  # "DURA"
CLASS_STREAM = 0x434C4153  # "CLAS"
PENDING = "_pending_"


def speed_classes(num_clients: int, seed: int, num_classes: int, scale: float) -> np.ndarray:
    """One speed class per client: class shares ~ Dirichlet(L s, (L-1) s, ..., s), then a categorical draw
    per client (FADAS code's generate_class_assignments(3, N, [3s, 2s, s], seed), re-derived)."""
    rng = round_rng(seed, 0, CLASS_STREAM)
    shares = rng.dirichlet(scale * np.arange(num_classes, 0, -1, dtype=np.float64))
    return rng.choice(num_classes, size=num_clients, p=shares).astype(np.int64)


class AsyncFederation(Federation):
    """A Federation whose ``round(t)`` is one buffered asynchronous server step."""

    def __init__(self, cfg, world, run_dir) -> None:
        # the participation section is not used: the scheduler below decides who trains; in-flight uploads
        # are per-client rows on their owner rank, so clients stay in their blocks
        if cfg.run.placement == "work":
            raise ConfigError("run.placement=work: the asynchronous mode keeps in-flight uploads on the clients' "
                              "owner ranks; expected blocks or auto")
        cfg = dataclasses.replace(cfg, participation=ParticipationConfig(pattern="full"),
                                  run=dataclasses.replace(cfg.run, placement="blocks"))
        super().__init__(cfg, world, run_dir)
        a = cfg.asynchrony
        if a.concurrency > self.num_clients:
            raise ConfigError(f"asynchrony.concurrency: expected at most the number of clients "
                              f"({self.num_clients}), got {a.concurrency}")
        self.buffer_size, self.concurrency = a.buffer_size, a.concurrency
        self.quirk = a.replicate_dispatch_quirk  # every downlink holds x (Federation checks it)
        self.previous_x: Tensor | None = None  # x_{t-1}, kept for the quirk only
        self.last_drawn = -1  # the last client drawn by the latest dispatch (the quirk exempts it)
        # the algorithm's client entries plus one pending-upload row per uploaded entry (and its loss)
        self.algo_client = tuple(e.name for e in self.decl.client)
        pending = tuple(type(e)(PENDING + e.name) for e in (*self.decl.up, Scalar("loss")))
        self.decl = Declaration(server=self.decl.server, client=(*self.decl.client, *pending), down=self.decl.down,
                                up=self.decl.up)
        old = self.store.tensors
        self.store = ClientStore(self.decl.client, self.block.num_clients, self.global_model())
        self.store.tensors.update({k: v for k, v in old.items()})
        self.classes = speed_classes(self.num_clients, cfg.run.seed, len(a.class_ranges), a.class_scale)
        self.start = np.full(self.num_clients, -1, dtype=np.int64)  # start version, -1: not in flight
        self.finish = np.zeros(self.num_clients, dtype=np.float64)
        self.clock = 0.0
        self._dispatch(0, self.concurrency)

    # ------------------------------------------------------------------------------------ scheduler

    def durations(self, t: int, ids: np.ndarray) -> np.ndarray:
        a = self.cfg.asynchrony
        if a.durations == "constant":
            return np.full(len(ids), a.constant_duration)
        u = round_rng(self.cfg.run.seed, t, DURATION_STREAM).random(len(ids))
        ranges = np.asarray(a.class_ranges, dtype=np.float64)[self.classes[ids]]
        return ranges[:, 0] + u * (ranges[:, 1] - ranges[:, 0])

    def _dispatch(self, t: int, count: int) -> None:
        avail = np.flatnonzero(self.start < 0)
        drawn = avail[round_rng(self.cfg.run.seed, t).choice(len(avail), count, replace=False)]
        self.last_drawn = int(drawn[-1])
        chosen = np.sort(drawn)
        self.start[chosen] = t
        self.finish[chosen] = self.clock + self.durations(t, chosen)

    def buffer(self) -> np.ndarray:
        """The M in-flight clients with the smallest finish times (ties: smaller id), sorted by id."""
        inflight = np.flatnonzero(self.start >= 0)
        order = np.lexsort((inflight, self.finish[inflight]))
        return np.sort(inflight[order[:self.buffer_size]])

    def runtime_state(self) -> dict[str, np.ndarray]:
        state = {"start": self.start.copy(), "finish": self.finish.copy(), "clock": np.float64(self.clock)}
        if self.quirk:
            state["last_drawn"] = np.int64(self.last_drawn)
            if self.previous_x is not None:
                state["previous_x"] = self.previous_x.cpu().numpy()
        return state

    def load_runtime_state(self, state: dict[str, np.ndarray]) -> None:
        self.start = np.asarray(state["start"], dtype=np.int64).copy()
        self.finish = np.asarray(state["finish"], dtype=np.float64).copy()
        self.clock = float(state["clock"])
        if self.quirk:
            if "last_drawn" not in state:
                raise CheckpointError("checkpoint written without asynchrony.replicate_dispatch_quirk; resume "
                                      "with the same setting")
            self.last_drawn = int(state["last_drawn"])
            if "previous_x" in state:
                self.previous_x = torch.as_tensor(state["previous_x"], dtype=self.dtype, device=self.world.device)

    # ------------------------------------------------------------------------------------ one step

    def _ctx(self, t: int, num_active: int, staleness: Tensor | None = None) -> RoundContext:
        max_tau = int(staleness.max()) if staleness is not None and len(staleness) else 0
        return RoundContext(round=t, lr=local_lr(self.cfg.local, t), num_clients=self.num_clients,
                            num_active=num_active, local_steps=self.cfg.local.steps, dim=self.dim,
                            total_examples=self.total_examples, total_rounds=self.cfg.run.rounds,
                            staleness=staleness, max_staleness=max_tau)

    def round(self, t: int, stop_requested: bool = False) -> dict[str, Any]:
        world, device = self.world, self.world.device
        wall = time.perf_counter()
        first, stop = self.blocks[world.rank]
        down = self.down_layout.unpack(self.down_buf, self.down_scalars)
        down = {k: v for k, v in down.items() if not k.startswith("_")}
        # 1. clients dispatched with version t train now, from x_t; their uploads wait in the pending rows
        trainees = np.flatnonzero(self.start == t)
        local_train = trainees[(trainees >= first) & (trainees < stop)] - first
        ctx = self._ctx(t, len(trainees))
        if self.quirk and t >= 1:  # all but the last drawn start from x_{t-1}
            stale = local_train + first != self.last_drawn
            if stale.any():
                self._train_pending(local_train[stale], down, t, ctx, {**down, "x": self.previous_x})
            local_train = local_train[~stale]
        if len(local_train):
            self._train_pending(local_train, down, t, ctx)
        if self.quirk:
            self.previous_x = down["x"].clone()
        # 2. the buffer: M earliest finishers; their staleness
        buf = self.buffer()
        tau = t - self.start[buf]
        staleness = torch.as_tensor(tau, dtype=torch.int64, device=device)
        ctx = self._ctx(t, len(buf), staleness)
        local_buf = buf[(buf >= first) & (buf < stop)] - first
        sums, loss_sum, bad_rows = None, None, np.zeros(0, dtype=np.int64)
        if len(local_buf):
            rows = torch.as_tensor(local_buf, device=device)
            got = {e.name: self.store.tensors[PENDING + e.name].index_select(0, rows) for e in self.decl.up}
            finite = torch.stack([torch.isfinite(v.reshape(len(rows), -1)).all(dim=1) for v in got.values()])
            bad_rows = local_buf[(~finite.all(dim=0)).cpu().numpy()]
            sums = {k: v.sum(dim=0) for k, v in got.items()}
            loss_sum = self.store.tensors[PENDING + "loss"].index_select(0, rows).sum()
        # 3. one reduce, the server rule on rank 0, one broadcast
        down_next, train_loss, _ = self.exchange(f"server step {t}", ctx, sums, loss_sum, bad_rows,
                                                 stop_requested, skip=False)
        # 4. bookkeeping: consumed tasks leave, the clock advances, M new clients are dispatched
        mask = torch.zeros(self.block.num_clients, dtype=torch.bool, device=device)
        mask[torch.as_tensor(local_buf, device=device)] = True
        algo_state = {k: self.store.tensors[k] for k in self.algo_client}
        self.store.tensors.update(self.algorithm.after_round(down_next, algo_state, mask, ctx))
        for e in (*self.decl.up, Scalar("loss")):
            if len(local_buf):
                self.store.tensors[PENDING + e.name][torch.as_tensor(local_buf, device=device)] = 0
        arrived = np.zeros(self.num_clients, dtype=bool)
        arrived[buf] = True
        delays = self.delay.update(arrived)
        self.clock = float(self.finish[buf].max())
        self.start[buf] = -1
        self._dispatch(t + 1, len(buf))
        entry: dict[str, Any] = {"round": t, "train_loss": train_loss, "active_clients": len(buf),
                                 "local_lr": ctx.lr, **delays, "staleness": [int(v) for v in tau],
                                 "staleness_max": int(tau.max()), "staleness_mean": float(tau.mean()),
                                 "clock": self.clock, "clients": [int(i) for i in buf],
                                 "started": len(trainees)}
        if self._eval_due(t):
            entry.update(self.evaluate(down_next["x"]))
        self.account(entry, len(buf), len(trainees))
        entry["wall_s"] = time.perf_counter() - wall
        return entry

    def _train_pending(self, local_rows: np.ndarray, down: dict[str, Tensor], t: int, ctx: RoundContext,
                       start_down: dict[str, Tensor] | None = None) -> None:
        """Train this rank's clients ``local_rows`` from ``down`` (or ``start_down``) and park their uploads
        (same arithmetic as a synchronous round's block)."""
        rows = torch.as_tensor(local_rows, device=self.world.device)
        staleness = torch.zeros(len(local_rows), dtype=torch.int64, device=self.world.device)
        up, local, new_state = self.train_clients(local_rows, self.clients(local_rows, t, staleness), down, t, ctx,
                                                  start_down)
        self.store.scatter(rows, new_state)
        for name, value in {**up, "loss": local.loss}.items():
            target = self.store.tensors[PENDING + name]
            target.index_copy_(0, rows, value.to(target.dtype))
