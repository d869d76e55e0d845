"""The round loop. It never knows which algorithm runs: it executes the declaration and the rules.

One round t, on every rank (ARCHITECTURE.md, "the one-sentence shape"):

1. decide S_t from (seed, t) and the pattern's state: identical on every rank;
2. read this round's downlink (received by the broadcast that ended the previous round);
3. train this rank's participating clients as one block and sum their uploads into one flat buffer;
4. one reduce of that buffer to rank 0;
5. rank 0 applies the server rule and packs the next downlink; one broadcast of it;
6. block-wide client bookkeeping (``after_round``), delay metrics, evaluation, metrics, checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrun.algorithms import get_algorithm
from fedrun.algorithms.base import Algorithm, Clients, Declaration, LocalResult, RoundContext, Scalar
from fedrun.checkpoint import list_checkpoints
from fedrun.config import Config, ConfigError
from fedrun.data import load_task
from fedrun.data.builtin import least_squares_x0
from fedrun.data.client_block import ClientBlock
from fedrun.data.partition import partition
from fedrun.errors import NumericalError, RunInterrupted
from fedrun.federation import snapshot
from fedrun.federation.blocks import assign_blocks, round_work, split_by_work
from fedrun.federation.delay import DelayTracker
from fedrun.federation.participation import make_participation
from fedrun.metrics.log import MetricsLog, Progress
from fedrun.models import build_model, uses_randomness
from fedrun.runtime.flat import FlatLayout, all_reduce_sum, broadcast_from_root, reduce_to_root
from fedrun.runtime.signals import StopSignals
from fedrun.runtime.world import World
from fedrun.state.store import ClientStore, init_server
from fedrun.training.evaluate import evaluate_shard
from fedrun.training.flat_model import FlatModel
from fedrun.training.gradients import local_oracle
from fedrun.training.local import run_local
from fedrun.training.losses import loss_for
from fedrun.training.schedule import local_lr
from fedrun.training.strategy import applicable_strategies, check_strategy, time_strategies

# runtime entries appended to the algorithm's uplink: training-loss sum, number of non-finite uploads,
# stop signals, and one slot per rank for (smallest client id with a non-finite upload) + 1, 0 if none
_UP_EXTRAS = (("_loss", 1), ("_nonfinite", 1), ("_signal", 1))
_BAD_CLIENT = "_bad_client"
# runtime entries appended to the downlink: what every rank does after this round, how many uploads were
# not finite (dropped from the round with run.skip_nonfinite_clients) and the smallest such client id
_DOWN_EXTRAS = (("_stop", 1), ("_nonfinite", 1), ("_bad_client", 1))
CONTINUE, STOP_SIGNAL, STOP_NONFINITE = 0.0, 1.0, 2.0


@dataclass
class RunResult:
    x: np.ndarray  # final global model, flat, in the model's parameter order
    metrics: list[dict[str, Any]] = field(default_factory=list)  # per-round records (rank 0)
    config: Config | None = None
    rank: int = 0


class Federation:
    """Everything a rank holds for one run: data block, model, state, layouts."""

    def __init__(self, cfg: Config, world: World, run_dir: Path | None) -> None:
        self.cfg, self.world, self.run_dir = cfg, world, run_dir
        self.dtype = torch.float64 if cfg.run.dtype == "float64" else torch.float32
        seed = cfg.run.seed
        task = load_task(cfg.data, seed)
        parts = partition(task, cfg.data, seed)
        self.num_clients = len(parts)
        sizes = np.array([len(p) for p in parts], dtype=np.int64)
        self.total_examples = float(sizes.sum())
        self.blocks = assign_blocks(sizes, world.size)
        self.algorithm: Algorithm = get_algorithm(cfg.algorithm.name)(cfg.algorithm.hparams)
        self.decl: Declaration = self.algorithm.declare()
        if "x" not in self.decl.down:
            raise ValueError(f"algorithm {cfg.algorithm.name}: the downlink must contain 'x'")
        self.placement = self._placement()
        if self.placement == "work":  # every rank can train every client: its block is all of them
            self.first, stop = 0, self.num_clients
            self.work = round_work(sizes, cfg.local.batch_size, cfg.local.steps, cfg.local.epochs)
        else:
            self.first, stop = self.blocks[world.rank]
        self.block = ClientBlock(task, parts[self.first:stop], self.first, world.device, self.dtype)

        torch.manual_seed(seed)
        module = build_model(cfg.model.name, task.input_shape, task.num_classes)
        self.model = FlatModel(module.to(device=world.device, dtype=self.dtype))
        self.random_model = uses_randomness(module)
        x0 = self.model.initial_vector(self.dtype, world.device)
        ls_x0 = least_squares_x0(cfg.data)
        if ls_x0 is not None:
            x0 = torch.as_tensor(ls_x0, dtype=self.dtype, device=world.device)
        self.dim = self.model.dim
        self.loss_fn = loss_for(task.task)
        self.classification = task.task == "classification"
        test_rows = np.arange(world.rank, len(task.y_test), world.size)
        self.test_x = _to_device(task.x_test[test_rows], world.device, self.dtype)
        self.test_y = _to_device(task.y_test[test_rows], world.device, self.dtype)

        self.store = ClientStore(self.decl.client, self.block.num_clients, x0)
        self.server = init_server(self.decl.server, x0) if world.is_root else {}
        down_entries = self.decl.down_entries()
        self.down_layout = FlatLayout([(e.name, self._numel(e)) for e in down_entries] + list(_DOWN_EXTRAS))
        self.down_scalars = {e.name for e in down_entries if isinstance(e, Scalar)} | {n for n, _ in _DOWN_EXTRAS}
        self.up_layout = FlatLayout([(e.name, self._numel(e)) for e in self.decl.up] + list(_UP_EXTRAS)
                                    + [(_BAD_CLIENT, world.size)])
        self.up_scalars = {e.name for e in self.decl.up if isinstance(e, Scalar)} | {n for n, _ in _UP_EXTRAS}
        self.up_floats = self.decl.floats(self.decl.up, self.dim)
        self.down_floats = self.decl.floats(tuple(down_entries), self.dim)
        self.down_buf = self.down_layout.empty(self.dtype, world.device)
        self.pack_downlink()
        self.broadcast_downlink()

        self.participation = make_participation(cfg.participation, self.num_clients, seed, cfg.run.rounds)
        self.delay = DelayTracker(self.num_clients)
        self.strategy, self.strategy_timings = self._choose_strategy(x0)
        self.start_round = 0
        self.metrics = MetricsLog(run_dir if world.is_root else None)

    def pack_downlink(self, stop: float = CONTINUE, nonfinite: float = 0.0, bad_client: float = -1.0) -> None:
        """Rank 0: the server's downlink entries and the runtime entries into the broadcast buffer."""
        if self.world.is_root:
            extras = {"_stop": torch.tensor([stop]), "_nonfinite": torch.tensor([nonfinite]),
                      "_bad_client": torch.tensor([bad_client])}
            self.down_layout.pack({**self.server, **extras}, self.down_buf)

    def broadcast_downlink(self) -> dict[str, Tensor]:
        broadcast_from_root(self.world, self.down_buf)
        return self.down_layout.unpack(self.down_buf, self.down_scalars)

    @property
    def stop_code(self) -> float:
        return float(self.down_layout.unpack(self.down_buf, self.down_scalars)["_stop"])

    def _numel(self, entry: Any) -> int:
        return 1 if isinstance(entry, Scalar) else self.dim

    def _placement(self) -> str:
        """``run.placement`` resolved: ``work`` needs an algorithm without per-client state (that state lives
        on its owner rank); ``auto`` takes it on CPU with more than one rank (on a GPU every rank would
        hold all clients' data in device memory)."""
        requested, stateful = self.cfg.run.placement, bool(self.decl.client)
        if requested == "work" and stateful:
            names = ", ".join(e.name for e in self.decl.client)
            raise ConfigError(f"run.placement=work: algorithm {self.cfg.algorithm.name} keeps per-client state "
                              f"({names}) on its owner rank; expected blocks or auto")
        if requested == "auto":
            return "work" if not stateful and self.world.size > 1 and self.world.device.type == "cpu" else "blocks"
        return requested

    def local_participants(self, active: np.ndarray) -> np.ndarray:
        """This rank's share of the round's participants (bool [N]), as block rows."""
        if self.placement == "work":
            ids = np.flatnonzero(active)
            return split_by_work(ids, self.work[ids], self.world.size)[self.world.rank]
        first, stop = self.blocks[self.world.rank]
        return np.flatnonzero(active[first:stop])

    def _choose_strategy(self, x0: Tensor) -> tuple[str, dict[str, float]]:
        """``local.strategy``, or for ``auto`` the fastest on rank 0's timing (the same on every rank)."""
        requested = self.cfg.local.strategy
        check_strategy(requested, self.model, self.block, self.random_model, self.cfg.model.name)
        if requested != "auto":
            return requested, {}
        timings: dict[str, float] = {}
        if self.world.is_root:
            cohort = self.cfg.participation.clients_per_round
            if self.cfg.participation.pattern == "full":
                cohort = self.num_clients
            timings = time_strategies(self.model, self.loss_fn, self.block, x0, self.cfg.local,
                                      -(-cohort // self.world.size), self.cfg.run.seed,
                                      applicable_strategies(self.model, self.block, self.random_model))
        timings = self.world.broadcast_object(timings)
        return min(timings, key=timings.get), timings

    # ------------------------------------------------------------------------------------ one round

    def round(self, t: int, stop_requested: bool = False) -> dict[str, Any]:
        """Run round t (collective over all ranks) and return its metrics record."""
        cfg, world = self.cfg, self.world
        wall = time.perf_counter()
        # 1. participants, identical on every rank
        active = self.participation.active(t)
        num_active = int(active.sum())
        lr = local_lr(cfg.local, t)
        ctx = RoundContext(round=t, lr=lr, num_clients=self.num_clients, num_active=num_active,
                           local_steps=cfg.local.steps, dim=self.dim, total_examples=self.total_examples,
                           total_rounds=cfg.run.rounds)
        # 2. this round's downlink
        down = self.down_layout.unpack(self.down_buf, self.down_scalars)
        down = {k: v for k, v in down.items() if not k.startswith("_")}
        # 3. local training of this rank's participants, uploads summed into one buffer
        local_active = self.local_participants(active)
        skip = cfg.run.skip_nonfinite_clients
        sums, loss_sum, bad_rows = None, None, np.zeros(0, dtype=np.int64)
        if len(local_active):
            sums, loss_sum, bad_rows = self._train_block(local_active, down, t, ctx, drop_nonfinite=skip)
        dropped_local = bad_rows if skip else np.zeros(0, dtype=np.int64)  # block rows whose upload was dropped
        # 4. one reduce to rank 0; 5. the server rule there, one broadcast of the next downlink
        down_next, train_loss, nonfinite = self.exchange(f"round {t}", ctx, sums, loss_sum, bad_rows,
                                                         stop_requested, skip)
        if skip and nonfinite:  # the dropped clients count as absent from this round, on every rank
            ctx = dataclasses.replace(ctx, num_active=num_active - nonfinite)
            active = active.copy()
            for ids in self.world.allgather_object((dropped_local + self.first).tolist()):
                active[ids] = False
            local_active = np.setdiff1d(local_active, dropped_local)
        # 6. bookkeeping for every client of the block, delay metrics, evaluation
        mask = torch.zeros(self.block.num_clients, dtype=torch.bool, device=world.device)
        mask[torch.as_tensor(local_active, device=world.device, dtype=torch.long)] = True
        self.store.replace(self.algorithm.after_round(down_next, dict(self.store.tensors), mask, ctx))
        delays = self.delay.update(active)
        num_active = ctx.num_active
        entry: dict[str, Any] = {"round": t, "train_loss": train_loss, "active_clients": num_active,
                                 "local_lr": lr, **delays}
        if skip:
            entry["dropped_clients"] = nonfinite
        if self._eval_due(t):
            entry.update(self.evaluate(down_next["x"]))
        self.account(entry, num_active, num_active)
        entry["wall_s"] = time.perf_counter() - wall
        return entry

    def exchange(self, label: str, ctx: RoundContext, sums: dict[str, Tensor] | None, loss_sum: Tensor | None,
                 bad_rows: np.ndarray, stop_requested: bool, skip: bool) -> tuple[dict[str, Tensor], float, int]:
        """One reduce of this rank's summed uploads and the runtime extras to rank 0, the server rule there,
        one broadcast of the next downlink (steps 4 and 5 of a round; also a server step of the
        asynchronous mode). ``bad_rows``: block rows whose upload is not finite; with ``skip`` they were
        left out of ``sums`` and the server rule sees |S_t| minus them, else the run stops.

        Returns the next downlink, the mean training loss of the kept uploads (rank 0; NaN elsewhere) and
        the number of non-finite uploads over all ranks.
        """
        world = self.world
        up_buf = self.up_layout.empty(self.dtype, world.device)
        if sums is not None:
            self.up_layout.pack({**sums, "_loss": loss_sum, "_nonfinite": torch.tensor(float(len(bad_rows))),
                                 "_signal": torch.zeros(()), _BAD_CLIENT: torch.zeros(world.size)}, up_buf)
            if len(bad_rows):
                up_buf[self.up_layout.slices[_BAD_CLIENT].start + world.rank] = float(self.first + bad_rows.min() + 1)
        up_buf[self.up_layout.slices["_signal"]] = 1.0 if stop_requested else 0.0
        reduce_to_root(world, up_buf)
        train_loss = float("nan")
        if world.is_root:
            up = self.up_layout.unpack(up_buf, self.up_scalars)
            nonfinite = float(up.pop("_nonfinite"))
            signals = float(up.pop("_signal"))
            loss_total = float(up.pop("_loss"))
            slots = up.pop(_BAD_CLIENT)
            bad_client = float(slots[slots > 0].min()) - 1 if bool((slots > 0).any()) else -1.0
            kept = ctx.num_active - (int(nonfinite) if skip else 0)  # |S_t| the server rule sees
            train_loss = loss_total / kept if kept else float("nan")
            stop = CONTINUE
            if nonfinite > 0 and not skip:
                stop = STOP_NONFINITE
            else:
                new_server = self.algorithm.server_update(self.server, up, dataclasses.replace(ctx, num_active=kept))
                if all(bool(torch.isfinite(v).all()) for v in new_server.values()):
                    self.server = new_server  # a non-finite round is not applied: the last good state stays
                    stop = STOP_SIGNAL if signals > 0 else CONTINUE
                else:
                    stop = STOP_NONFINITE
            self.pack_downlink(stop, nonfinite, bad_client)
        down_next = self.broadcast_downlink()
        nonfinite_all = int(down_next.pop("_nonfinite"))
        bad_client_id = int(down_next.pop("_bad_client"))
        if float(down_next["_stop"]) == STOP_NONFINITE:
            if nonfinite_all and not skip:
                others = f" (and {nonfinite_all - 1} other client(s))" if nonfinite_all > 1 else ""
                raise NumericalError(f"{label}: client {bad_client_id} uploaded a non-finite update (NaN/Inf)"
                                     f"{others}; lower the learning rates or set run.skip_nonfinite_clients=true")
            raise NumericalError(f"{label}: the global model became non-finite (NaN/Inf); lower the learning rates")
        return down_next, train_loss, nonfinite_all

    def _train_block(self, local_active: np.ndarray, down: dict[str, Tensor], t: int, ctx: RoundContext,
                     drop_nonfinite: bool = False) -> tuple[dict[str, Tensor], Tensor, np.ndarray]:
        """Train the block's participants; the summed uploads, the loss sum and the block rows (indices
        into ``local_active``'s values) whose upload is not finite. With ``drop_nonfinite`` those rows
        are left out of the sums and their client state is left as it was before the round."""
        rows = torch.as_tensor(local_active, device=self.world.device)
        up, local, new_state = self.train_clients(local_active, self.clients(local_active, t), down, t, ctx)
        sums = {name: value.sum(dim=0) for name, value in up.items()}
        bad_rows = local_active[:0]
        if not all(bool(torch.isfinite(value).all()) for value in sums.values()):
            # a non-finite upload makes its sum non-finite: only then look at single clients
            finite = torch.stack([torch.isfinite(v.reshape(len(local_active), -1)).all(dim=1)
                                  for v in up.values()]).all(dim=0)
            bad_rows = local_active[(~finite).cpu().numpy()]
            if drop_nonfinite and len(bad_rows):
                self.store.scatter(rows[finite], {name: value[finite] for name, value in new_state.items()})
                sums = {name: value[finite].sum(dim=0) for name, value in up.items()}
                return sums, local.loss[finite].sum(), bad_rows
        self.store.scatter(rows, new_state)
        return sums, local.loss.sum(), bad_rows

    def clients(self, local_rows: np.ndarray, t: int, staleness: Tensor | None = None) -> Clients:
        """What the rules may know about this rank's clients ``local_rows`` (block-relative) in round t."""
        device = self.world.device
        ids = local_rows + self.first
        return Clients(
            ids=torch.as_tensor(ids, device=device),
            num_examples=torch.as_tensor(self.block.num_examples[local_rows], dtype=self.dtype, device=device),
            participations=torch.as_tensor(self.delay.participations[ids], device=device),
            last_active=torch.as_tensor(self.delay.last_active[ids], device=device),
            probability=self._probabilities(t, ids),
            staleness=staleness,
        )

    def train_clients(self, local_rows: np.ndarray, clients: Clients, down: dict[str, Tensor], t: int,
                      ctx: RoundContext, start_down: dict[str, Tensor] | None = None,
                      ) -> tuple[dict[str, Tensor], LocalResult, dict[str, Tensor]]:
        """Local training of block clients ``local_rows`` from ``down``: the plan, the K steps, the
        client rule. Returns their uploads, the local result and their new state ``[C, ...]`` (the
        caller stores it). ``start_down``, when given, is what the local plan starts from instead of
        ``down`` (the asynchronous mode's dispatch quirk); the client rule still sees ``down``."""
        cfg = self.cfg
        rows = torch.as_tensor(local_rows, device=self.world.device)
        state = self.store.gather(rows, [e.name for e in self.decl.client])
        plan = self.algorithm.local_plan(down if start_down is None else start_down, state, clients, ctx)
        batches = self.block.batches(local_rows, cfg.run.seed, t, cfg.local.batch_size, cfg.local.steps,
                                     cfg.local.epochs, cfg.local.shuffle)
        oracle, group_size = local_oracle(self.strategy, self.model, self.loss_fn, self.block, batches,
                                          local_rows + self.first, cfg.run.seed, t, reseed=self.random_model)
        local = run_local(plan, oracle, batches.sizes > 0, ctx.lr, cfg.local, group_size=group_size)
        up, new_state = self.algorithm.client_finish(down, state, local, clients, ctx)
        return up, local, new_state

    def account(self, entry: dict[str, Any], uploads: int, downloads: int) -> None:
        """Communication of the round in floats, per round and cumulative (from the declaration)."""
        entry["uplink_floats"] = uploads * self.up_floats
        entry["downlink_floats"] = downloads * self.down_floats
        prev = self.metrics.records[-1] if self.metrics.records else {}
        entry["cum_uplink_floats"] = prev.get("cum_uplink_floats", 0) + entry["uplink_floats"]
        entry["cum_downlink_floats"] = prev.get("cum_downlink_floats", 0) + entry["downlink_floats"]

    def _probabilities(self, t: int, ids: np.ndarray) -> Tensor | None:
        p = self.participation.probabilities(t)
        return None if p is None else torch.as_tensor(p[ids], dtype=self.dtype, device=self.world.device)

    def _eval_due(self, t: int) -> bool:
        every = self.cfg.eval.every
        return t + 1 == self.cfg.run.rounds or (every > 0 and (t + 1) % every == 0)

    def evaluate(self, x: Tensor) -> dict[str, float]:
        sums = evaluate_shard(self.model, self.loss_fn, x, self.test_x, self.test_y, self.cfg.eval.batch_size,
                              self.classification)
        all_reduce_sum(self.world, sums)
        loss, correct, count = (float(v) for v in sums)
        out = {"test_loss": loss / count}
        if self.classification:
            out["test_accuracy"] = correct / count
        return out

    def runtime_state(self) -> dict[str, np.ndarray]:
        """Extra run state for the checkpoint (replicated on every rank); none in synchronous rounds."""
        return {}

    def load_runtime_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore what :meth:`runtime_state` returned (called on every rank)."""

    def global_model(self) -> Tensor:
        down = self.down_layout.unpack(self.down_buf, self.down_scalars)
        return down["x"]


def train(cfg: Config, world: World, run_dir: Path | None, progress: bool = True,
          resume: str | None = None, signals: StopSignals | None = None) -> RunResult:
    """Run rounds ``start .. cfg.run.rounds - 1`` and return the final model and metrics.

    With a run directory, a checkpoint is written every ``checkpoint.every`` rounds, at the end, and
    when a stop signal arrives (then :class:`RunInterrupted` is raised after the checkpoint).
    ``resume``: ``"auto"`` (newest valid checkpoint of the run directory, if any) or a file path.
    ``signals``: stop-signal handlers installed by the caller (else installed for the rounds only).
    """
    torch.set_num_threads(cfg.run.threads)
    # nothing in the run directory changes before the inputs are checked: a run that is refused, or that
    # fails to load its data or checkpoint, leaves an earlier run's files as they were
    if resume is None and run_dir is not None and list_checkpoints(run_dir):
        raise ConfigError(f"run.dir={run_dir}: holds checkpoints of an earlier run; resume it with "
                          "--resume auto or choose another run.dir")
    if cfg.asynchrony.enabled:  # buffered asynchronous server steps (fedrun.federation.async_rounds)
        from fedrun.federation.async_rounds import AsyncFederation

        fed: Federation = AsyncFederation(cfg, world, run_dir)
    else:
        fed = Federation(cfg, world, run_dir)
    resume_s = None
    if resume is not None:
        started = time.perf_counter()
        path = snapshot.locate(fed, resume)
        if path is not None:
            fed.start_round = snapshot.restore(fed, path)
            resume_s = time.perf_counter() - started
            if world.is_root and progress:
                print(f"fedrun: resumed from {path} at round {fed.start_round}", flush=True)
    if run_dir is not None and world.is_root:
        (run_dir / "config.yaml").write_text(cfg.to_yaml())
    runtime = RuntimeLog(fed, run_dir, resume_s)
    if world.is_root and progress:
        timings = ", ".join(f"{k} {v:.4f} s" for k, v in fed.strategy_timings.items())
        print(f"fedrun: local strategy {fed.strategy}" + (f" (timed: {timings})" if timings else ""), flush=True)
    bar = Progress(cfg.run.rounds, cfg.run.log_every) if (progress and world.is_root) else None
    every = cfg.checkpoint.every
    with signals or StopSignals() as signals:
        for t in range(fed.start_round, cfg.run.rounds):
            entry = fed.round(t, stop_requested=signals.requested)
            if world.is_root:
                fed.metrics.record(entry)
                if bar is not None:
                    bar.update(entry)
            stop = fed.stop_code == STOP_SIGNAL
            last = t + 1 == cfg.run.rounds
            if run_dir is not None and (stop or last or (every > 0 and (t + 1) % every == 0)):
                started = time.perf_counter()
                path = snapshot.save(fed, t + 1)
                runtime.checkpoint_written(t + 1, path, time.perf_counter() - started)
                if stop:
                    raise RunInterrupted(f"stopped by a signal after round {t}; checkpoint {path}; "
                                         "resume with --resume auto")
    runtime.finish()
    x = fed.global_model().detach().cpu().numpy().copy()
    return RunResult(x=x, metrics=fed.metrics.records, config=cfg, rank=world.rank)


class RuntimeLog:
    """``runtime.json`` in the run directory: ranks, device, placement and blocks, the local strategy and its
    timings, checkpoint write times and sizes, and every rank's peak resident memory at the end."""

    def __init__(self, fed: Federation, run_dir: Path | None, resume_s: float | None) -> None:
        self.fed, self.world = fed, fed.world
        self.path = None if run_dir is None or not fed.world.is_root else run_dir / "runtime.json"
        self.data: dict[str, Any] = {
            "ranks": fed.world.size, "device": str(fed.world.device), "backend": fed.world.backend,
            "placement": fed.placement, "blocks": fed.blocks, "dim": fed.dim,
            "client_state_bytes_per_rank": fed.store.nbytes,
            "local_strategy": fed.strategy, "strategy_timings_s": fed.strategy_timings,
            "start_round": fed.start_round, "resume_read_s": resume_s, "checkpoints": [],
        }
        self._write()

    def checkpoint_written(self, next_round: int, path: Path | None, seconds: float) -> None:
        size = path.stat().st_size if path is not None and path.exists() else None
        self.data["checkpoints"].append({"round": next_round, "write_s": round(seconds, 4), "bytes": size})
        self._write()

    def finish(self) -> None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB -> MiB on Linux
        self.data["peak_rss_mib_per_rank"] = self.world.allgather_object(round(peak, 1))
        self._write()

    def _write(self) -> None:
        if self.path is not None:
            self.path.write_text(json.dumps(self.data, indent=1) + "\n")


def _to_device(array: np.ndarray, device: torch.device, dtype: torch.dtype) -> Tensor:
    """Floating arrays in the run's dtype, integer labels unchanged."""
    t = torch.from_numpy(np.ascontiguousarray(array))
    return (t.to(dtype) if t.is_floating_point() else t).to(device)
