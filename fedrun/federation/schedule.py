"""Schedules: which clients start training at step t, which finished uploads the server consumes, how
the uploads wait in between, and what of this the checkpoint holds.

The round engine (``fedrun.federation.rounds``) asks the schedule once per step. A :class:`Step` names

* ``start``: the clients that train now, from the current global model x_t (a subset may start from the
  previous model ``previous_x`` instead: ``from_previous``, the asynchronous dispatch quirk);
* ``consume``: the clients whose uploads the server rule takes now, and their ``staleness``.

Between training and consumption an upload is *held* by the schedule (:meth:`Schedule.hold`) and
*released* when consumed (:meth:`Schedule.release`); uploads held across steps live in per-client rows
the schedule declares (:meth:`Schedule.held_entries`), which sit next to the client state on the owner
rank and are saved with it. The schedule's own state is ``state_dict`` / ``load_state_dict`` (it is a
:class:`fedrun.checkpoint.stateful.Stateful` part of the run state). So the round function and the
checkpoint code have one path for every schedule.

Two schedules exist:

* :class:`Synchronous` (participation patterns, docs/participation.md): ``start == consume == S_t``,
  staleness 0. It holds the uploads just trained and releases them in the same step (no rows).
* :class:`Buffered` (the buffered asynchronous mode, ``asynchrony.enabled``): an event queue of simulated
  arrivals. ``C`` clients are in flight; a client dispatched with version t trains at step t from x_t
  (same minibatches as a synchronous round t) and finishes at ``clock + duration``. Step t consumes the M
  in-flight uploads with the smallest finish times (ties: smaller id), whose staleness is
  ``tau_i = t - t_i^start``; the clock moves to the M-th finish time and M new clients, drawn uniformly
  from the idle ones, are dispatched with version t + 1. Uploads wait ("park") in per-client rows
  (``_pending_<entry>``) between their training and their consumption.

Everything is a function of (seed, t) and of the schedule's replicated state, so every rank computes the
same steps whatever the number of ranks, and ``state_dict`` / ``load_state_dict`` resume it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from torch import Tensor

from fedrun.config import AsyncConfig, Config
from fedrun.errors import CheckpointError, ConfigError
from fedrun.federation.participation import Participation, make_participation, round_rng
from fedrun.protocol import Entry, Scalar
from fedrun.state.store import ClientStore

DURATION_STREAM = 0x44555241  # "DURA": per-step durations of the dispatched clients
CLASS_STREAM = 0x434C4153  # "CLAS": the speed class of every client
PENDING = "_pending_"  # per-client rows of parked uploads: PENDING + upload entry name, and PENDING + "loss"


@dataclass
class Step:
    """What step t does. Client ids are global and sorted."""

    start: np.ndarray  # int64: clients that train now
    consume: np.ndarray  # int64: clients whose uploads the server rule takes now
    staleness: np.ndarray | None = None  # int64 per consumed client; None: synchronous (all 0)
    from_previous: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # subset of start
    previous_x: Tensor | None = None  # the model the ``from_previous`` clients start from

    def training_staleness(self, count: int, device: torch.device) -> Tensor | None:
        """The staleness the rules see while ``count`` starting clients train: zeros in a schedule with
        staleness (an upload's staleness counts from its start), None in synchronous rounds."""
        return None if self.staleness is None else torch.zeros(count, dtype=torch.int64, device=device)

    def consumed_staleness(self, device: torch.device) -> tuple[Tensor | None, int]:
        """tau_i of the consumed uploads as the server rule sees it (None in synchronous rounds) and its
        maximum (0 when none is consumed)."""
        if self.staleness is None:
            return None, 0
        tau = torch.as_tensor(self.staleness, dtype=torch.int64, device=device)
        return tau, int(self.staleness.max()) if len(self.staleness) else 0


class Schedule(Protocol):
    """The interface the round engine and the checkpoint use. The replicated state (``state_dict``) is
    numpy arrays (and tensors), the same on every rank; held uploads (``hold``/``release``) are this rank's
    own, in memory within a step or in its client rows (``held_entries``) across steps.

    Uploads are dicts ``{entry name: [C, ...]}`` with the training losses under ``"loss"``."""

    step_name: ClassVar[str]  # what one step is called in messages ("round", "server step")
    description: ClassVar[str]  # what the schedule is called in messages
    cohort: int  # how many clients a step typically trains (sizes the timing of the local strategies)
    participation: Participation | None  # the pattern that draws S_t (what privacy accounts); None: no pattern

    def begin(self, t: int) -> Step: ...

    def end(self, t: int, step: Step, x_t: Tensor) -> dict[str, Any]:
        """Advance past step t (``x_t``: the model this step's clients started from); the metrics of
        the step that only the schedule knows."""

    def max_consumed(self) -> int:
        """The most uploads one step can consume."""

    def probabilities(self, t: int) -> np.ndarray | None: ...

    @staticmethod
    def held_entries(up: tuple[Entry, ...]) -> tuple[Entry, ...]:
        """The per-client rows the schedule keeps next to the client state for uploads ``up`` (saved in
        the checkpoint's ``clients/`` group with it)."""

    def hold(self, store: ClientStore, rows: Tensor, uploads: dict[str, Tensor]) -> None:
        """Keep the uploads of block rows ``rows``, just trained, until they are consumed."""

    def release(self, store: ClientStore, rows: Tensor) -> dict[str, Tensor]:
        """The held uploads of block rows ``rows``, consumed now (they leave the schedule)."""

    def state_dict(self) -> dict[str, np.ndarray]: ...

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None: ...


def schedule_type(cfg: Config) -> type[Synchronous] | type[Buffered]:
    """The schedule a config runs: :class:`Buffered` with ``asynchrony.enabled``, else :class:`Synchronous`."""
    return Buffered if cfg.asynchrony.enabled else Synchronous


def make_schedule(cfg: Config, num_clients: int, dtype: torch.dtype, device: torch.device) -> Schedule:
    """The configured schedule for N = ``num_clients`` clients."""
    seed = cfg.run.seed
    if cfg.asynchrony.enabled:
        return Buffered(cfg.asynchrony, num_clients, seed, dtype, device)
    participation = make_participation(cfg.participation, num_clients, seed, cfg.run.rounds)
    full = cfg.participation.pattern == "full"
    return Synchronous(participation, num_clients if full else cfg.participation.clients_per_round)


class Synchronous:
    """Rounds of a participation pattern: S_t trains and is consumed in the same step, so the uploads
    just trained are held in memory only until the same step releases them."""

    step_name = "round"
    description = "synchronous mode"

    def __init__(self, participation: Participation, cohort: int | None = None) -> None:
        self.participation = participation
        self.cohort = participation.max_active() if cohort is None else cohort
        self._held: dict[str, Tensor] = {}

    def begin(self, t: int) -> Step:
        ids = np.flatnonzero(self.participation.active(t)).astype(np.int64)
        return Step(start=ids, consume=ids)

    def end(self, t: int, step: Step, x_t: Tensor) -> dict[str, Any]:
        return {}

    def max_consumed(self) -> int:
        return self.participation.max_active()

    def probabilities(self, t: int) -> np.ndarray | None:
        return self.participation.probabilities(t)

    @staticmethod
    def held_entries(up: tuple[Entry, ...]) -> tuple[Entry, ...]:
        return ()

    def hold(self, store: ClientStore, rows: Tensor, uploads: dict[str, Tensor]) -> None:
        self._held = uploads  # the step's only starting group: exactly the clients it consumes

    def release(self, store: ClientStore, rows: Tensor) -> dict[str, Tensor]:
        uploads, self._held = self._held, {}
        return uploads

    def state_dict(self) -> dict[str, np.ndarray]:
        return self.participation.state_dict()

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.participation.load_state_dict(state)


def speed_classes(num_clients: int, seed: int, num_classes: int, scale: float) -> np.ndarray:
    """One speed class per client: class shares ~ Dirichlet(L s, (L-1) s, ..., s), then a categorical
    draw per client (the FADAS code's class assignment, re-derived)."""
    rng = round_rng(seed, 0, CLASS_STREAM)
    shares = rng.dirichlet(scale * np.arange(num_classes, 0, -1, dtype=np.float64))
    return rng.choice(num_classes, size=num_clients, p=shares).astype(np.int64)


class Buffered:
    """The buffered asynchronous mode (FADAS / FedBuff) as an event queue of simulated arrivals.

    Determinism: dispatch draws come from ``round_rng(seed, t)`` (the generator of the uniform
    participation pattern, so with C = M and equal durations the run IS the synchronous uniform run),
    the durations from ``round_rng(seed, t, DURATION_STREAM)`` in client-id order, the speed classes from
    ``round_rng(seed, 0, CLASS_STREAM)``.

    ``replicate_dispatch_quirk`` reproduces the official FADAS code's dispatch: at every step t >= 1,
    the clients dispatched with version t train from x_{t-1}, except the last one drawn; the client rule
    still takes their change against x_t and their staleness stays t - t_i^start.
    """

    step_name = "server step"
    description = "asynchronous mode"
    participation = None  # it dispatches clients from its event queue, not from a participation pattern

    def __init__(self, cfg: AsyncConfig, num_clients: int, seed: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        if cfg.concurrency > num_clients:
            raise ConfigError(f"asynchrony.concurrency: expected at most the number of clients "
                              f"({num_clients}), got {cfg.concurrency}")
        self.cfg, self.num_clients, self.seed = cfg, num_clients, seed
        self.cohort = cfg.buffer_size
        self.dtype, self.device = dtype, device
        self.classes = speed_classes(num_clients, seed, len(cfg.class_ranges), cfg.class_scale)
        self.start_version = np.full(num_clients, -1, dtype=np.int64)  # -1: not in flight
        self.finish = np.zeros(num_clients, dtype=np.float64)
        self.clock = 0.0
        self.previous_model: Tensor | None = None  # x_{t-1}, kept for the quirk only
        self.last_drawn = -1  # the last client drawn by the latest dispatch (the quirk exempts it)
        self._dispatch(0, cfg.concurrency)

    def durations(self, t: int, ids: np.ndarray) -> np.ndarray:
        if self.cfg.durations == "constant":
            return np.full(len(ids), self.cfg.constant_duration)
        u = round_rng(self.seed, t, DURATION_STREAM).random(len(ids))
        ranges = np.asarray(self.cfg.class_ranges, dtype=np.float64)[self.classes[ids]]
        return ranges[:, 0] + u * (ranges[:, 1] - ranges[:, 0])

    def _dispatch(self, t: int, count: int) -> None:
        idle = np.flatnonzero(self.start_version < 0)
        drawn = idle[round_rng(self.seed, t).choice(len(idle), count, replace=False)]
        self.last_drawn = int(drawn[-1])
        chosen = np.sort(drawn)
        self.start_version[chosen] = t
        self.finish[chosen] = self.clock + self.durations(t, chosen)

    def buffer(self) -> np.ndarray:
        """The M in-flight clients with the smallest finish times (ties: smaller id), sorted by id."""
        inflight = np.flatnonzero(self.start_version >= 0)
        order = np.lexsort((inflight, self.finish[inflight]))
        return np.sort(inflight[order[:self.cfg.buffer_size]])

    def begin(self, t: int) -> Step:
        start = np.flatnonzero(self.start_version == t).astype(np.int64)
        from_previous = start[start != self.last_drawn] if self.cfg.replicate_dispatch_quirk and t >= 1 \
            else start[:0]
        consume = self.buffer().astype(np.int64)
        return Step(start=start, consume=consume, staleness=t - self.start_version[consume],
                    from_previous=from_previous, previous_x=self.previous_model)

    def end(self, t: int, step: Step, x_t: Tensor) -> dict[str, Any]:
        if self.cfg.replicate_dispatch_quirk:
            self.previous_model = x_t.clone()
        self.clock = float(self.finish[step.consume].max())
        self.start_version[step.consume] = -1
        self._dispatch(t + 1, len(step.consume))
        tau = step.staleness
        return {"staleness": [int(v) for v in tau], "staleness_max": int(tau.max()),
                "staleness_mean": float(tau.mean()), "clock": self.clock,
                "clients": [int(i) for i in step.consume], "started": len(step.start)}

    def max_consumed(self) -> int:
        return self.cfg.buffer_size

    def probabilities(self, t: int) -> np.ndarray:
        return np.ones(self.num_clients)  # every client is available to be dispatched

    @staticmethod
    def held_entries(up: tuple[Entry, ...]) -> tuple[Entry, ...]:
        """One parked row per uploaded entry, and one for the training loss."""
        return tuple(type(e)(PENDING + e.name) for e in (*up, Scalar("loss")))

    def hold(self, store: ClientStore, rows: Tensor, uploads: dict[str, Tensor]) -> None:
        store.scatter(rows, {PENDING + name: value for name, value in uploads.items()})

    def release(self, store: ClientStore, rows: Tensor) -> dict[str, Tensor]:
        parked = [e.name for e in store.entries if e.name.startswith(PENDING)]
        held = store.gather(rows, parked)
        store.scatter(rows, {name: torch.zeros_like(value) for name, value in held.items()})  # they leave
        return {name.removeprefix(PENDING): value for name, value in held.items()}

    def state_dict(self) -> dict[str, np.ndarray]:
        state = {"start": self.start_version.copy(), "finish": self.finish.copy(), "clock": np.float64(self.clock)}
        if self.cfg.replicate_dispatch_quirk:
            state["last_drawn"] = np.int64(self.last_drawn)
            if self.previous_model is not None:
                state["previous_x"] = self.previous_model.cpu().numpy()
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        if self.cfg.replicate_dispatch_quirk and "last_drawn" not in state:
            raise CheckpointError("checkpoint written without asynchrony.replicate_dispatch_quirk; resume "
                                  "with the same setting")
        if not self.cfg.replicate_dispatch_quirk and "last_drawn" in state:
            raise CheckpointError("checkpoint written with asynchrony.replicate_dispatch_quirk; resume "
                                  "with the same setting")
        self.start_version = np.asarray(state["start"], dtype=np.int64).copy()
        self.finish = np.asarray(state["finish"], dtype=np.float64).copy()
        self.clock = float(state["clock"])
        if self.cfg.replicate_dispatch_quirk:
            self.last_drawn = int(state["last_drawn"])
            if "previous_x" in state:
                self.previous_model = torch.as_tensor(state["previous_x"], dtype=self.dtype, device=self.device)
