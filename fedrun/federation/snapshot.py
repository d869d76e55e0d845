"""Save and restore a whole run: the checkpoint is the :class:`fedrun.federation.build.RunState`.

Rank 0 writes one HDF5 file (fedrun.checkpoint). Every part of the run state saves and loads itself through
one interface, :class:`fedrun.checkpoint.stateful.Stateful` (:func:`parts`), one group of the file each:

    server/<entry>       the server state (rank 0's)
    schedule/<name>      the schedule's state (participation pattern, or the asynchronous event queue)
    history/<name>       the delay tracker (last participation of every client, running delay sums)
    random/seed          the run seed (every random stream is a function of seed, round and client)
    runtime/strategy     the local-training strategy
    metrics/jsonl        the metrics records so far
    privacy/<name>       with privacy.mode != none: sigma, the clip, the rounds' sampling probabilities and
                         every client's participations (the accountant's state, fedrun.privacy)

and the client rows, ``clients/<entry>``: every per-client entry of all N clients, the rows the schedule
holds uploads in included. They live on their owner ranks, in a store of either kind behind one interface
(:class:`fedrun.state.rows.ClientRows`), and are streamed to rank 0 in bounded chunks, one path for every
entry and store: each rank sends the rows the checkpoint stores (those that may differ from the initial
value, or in an increment the vector rows changed since its base), and fedrun.checkpoint.entries decides
how the file holds them. An increment (``checkpoint.full_every``, fedrun.checkpoint.chain) links to the
checkpoint it builds on (:class:`~fedrun.checkpoint.chain.ChainTip`). On resume every rank reads only the
rows of its own block, newest link first, so a run can resume on a different number of ranks.

All randomness is counter-based in (seed, round, client) (``fedrun.data.hashing.hash_keys``,
per-round generators of the participation patterns), so restoring the round number restores every
random stream: a resumed run is bit-identical to an uninterrupted one on the same number of ranks.

Finding the checkpoint to resume from (:func:`locate`) opens each candidate once, verifies it and its chain
against their manifests and checksums, and keeps what a resume asks of it (:class:`Resumable`); restoring
opens it a second time, to read it. What it passed over is data (:class:`Search`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrun.checkpoint import CheckpointReader, CheckpointWriter, checkpoint_name
from fedrun.checkpoint.chain import Chain, ChainTip, base_of
from fedrun.checkpoint.entries import EntryWriter
from fedrun.checkpoint.manifest import check_complete
from fedrun.checkpoint.reader import Skipped, newest
from fedrun.checkpoint.stateful import Stateful, read_parts, write_parts
from fedrun.config import config_from_dict
from fedrun.errors import BrokenChain, CheckpointError, CheckpointWriteError, ConfigError
from fedrun.federation.build import RunState, Setup
from fedrun.federation.client_trainer import Learner
from fedrun.federation.legacy import legacy_manifest
from fedrun.metrics.log import json_line
from fedrun.protocol import Entry, Vector
from fedrun.runtime.flat import broadcast_from_root, recv, send
from fedrun.state.store import constant_init
from fedrun.training.local_strategy import local_strategy

_CHUNK_BYTES = 8 << 20  # rows of client state sent to rank 0 (and read back on resume) at a time


# ----------------------------------------------------------------------------------- the parts of the state


@dataclass
class _Server:
    """``server/``: the server state, on rank 0."""

    state: RunState
    entries: tuple[Entry, ...]
    device: torch.device
    dtype: torch.dtype

    def state_dict(self) -> dict[str, Any]:
        return {name: value.detach().cpu().numpy() for name, value in self.state.server.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.server = {e.name: _tensor(state[e.name], self.device, self.dtype) for e in self.entries}


@dataclass
class _Strategy:
    """``runtime/strategy``: the local-training strategy's name (a resumed run keeps its checkpoint's, built for
    this run's model, loss and device)."""

    state: RunState
    learner: Learner
    device: torch.device

    def state_dict(self) -> dict[str, Any]:
        return {"strategy": self.state.strategy.name}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        name = str(state["strategy"])
        if name != self.state.strategy.name:
            self.state.strategy = local_strategy(name, self.learner.model, self.learner.loss_fn, self.device)


@dataclass
class _Metrics:
    """``metrics/jsonl``: one JSON line per finished round."""

    state: RunState

    def state_dict(self) -> dict[str, Any]:
        return {"jsonl": "".join(map(json_line, self.state.metrics))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.metrics = [json.loads(line) for line in state["jsonl"].splitlines() if line.strip()]


@dataclass
class _Seed:
    """``random/seed``: stored for readers of the file; a resumed run's seed is its config's, which the resume
    policy (fedrun.federation.resume) holds to the checkpoint's, so loading takes nothing."""

    seed: int

    def state_dict(self) -> dict[str, Any]:
        return {"seed": np.int64(self.seed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def parts(setup: Setup, state: RunState) -> dict[str, Stateful]:
    """The parts of ``state`` that save and load themselves, by checkpoint group (the server's on rank 0 only)."""
    found: dict[str, Stateful] = {}
    if setup.world.is_root:
        found["server"] = _Server(state, setup.decl.server, setup.world.device, setup.dtype)
    found.update({"schedule": state.schedule, "history": state.delay, "random": _Seed(setup.cfg.run.seed),
                  "runtime": _Strategy(state, setup.learner, setup.world.device), "metrics": _Metrics(state)})
    if state.privacy is not None:
        found["privacy"] = state.privacy
    return found


# ------------------------------------------------------------------------------------------------- saving


def save(setup: Setup, state: RunState) -> Path | None:
    """Write the checkpoint of ``state`` (its rounds ``< state.next_round`` are done; collective call): full, or
    an increment on ``state.chain`` holding the vector rows changed since it (``checkpoint.full_every``)."""
    world, cfg, next_round, store = setup.world, setup.cfg, state.next_round, state.clients
    writer = None
    error: Exception | None = None
    link: dict[str, Any] | None = None

    def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(...)``'s value, or None once an error is recorded (the first one, reported after the rows)."""
        nonlocal error
        if error is None:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # keep draining the other ranks' rows, then report
                error = exc
        return None

    if world.is_root:
        link = state.chain.next_link(cfg.checkpoint.full_every or store.default_full_every)
        try:
            writer = CheckpointWriter(setup.run_dir, next_round, algorithm=cfg.algorithm.name,
                                      num_clients=setup.num_clients, dim=setup.dim, config=cfg.to_yaml(),
                                      keep=cfg.checkpoint.keep, base=link)
        except Exception as exc:
            error = exc
    depth = world.broadcast_object(0 if link is None else link["depth"])  # 0: a full checkpoint
    if writer is not None:
        attempt(write_parts, writer, parts(setup, state))
    for entry in store.entries:
        _save_entry(setup, state, writer, entry, depth > 0, attempt)
    path = None
    if writer is not None:
        if error is None:
            attempt(writer.commit)
            path = writer.path
        if error is not None:
            writer.abort()
    failed = torch.tensor([1.0 if error is not None else 0.0], device=world.device)
    broadcast_from_root(world, failed)
    if error is not None:
        raise CheckpointWriteError(f"checkpoint after round {next_round} in {setup.run_dir} failed: {error}; "
                                   "the earlier checkpoints are intact") from None
    if failed.item():
        raise CheckpointWriteError(f"checkpoint after round {next_round} failed on rank 0")
    store.checkpointed()  # the file is in place: its rows are no longer changes
    state.chain = ChainTip(setup.run_dir / checkpoint_name(next_round), depth)
    return path


def _save_entry(setup: Setup, state: RunState, writer: CheckpointWriter | None, entry: Entry, increment: bool,
                attempt: Callable[..., Any]) -> None:
    """Client entry ``entry`` into ``writer`` (rank 0): the rows each rank stores (an increment's vector entry:
    those changed since the base; else those that may differ from the initial value), streamed from their
    owners in ascending client order, a bounded chunk at a time."""
    world, store, blocks = setup.world, state.clients, setup.placement.blocks
    vector = isinstance(entry, Vector)
    mine = np.flatnonzero(store.changed(entry.name) if increment and vector else store.written(entry.name))
    counts = world.allgather_object(len(mine))
    local = store.block(entry.name, 0, 0)  # no rows: the dtype, device and row shape
    row_shape = tuple(local.shape[1:])
    sink = None if writer is None else attempt(EntryWriter, writer, f"clients/{entry.name}", sum(counts), row_shape,
                                               _numpy_dtype(local), increment=increment, fill=constant_init(entry))
    chunk = max(1, _CHUNK_BYTES // max(1, int(np.prod(row_shape, dtype=np.int64)) * local.element_size()))
    for rank in sorted(range(world.size), key=lambda r: blocks[r][0]):  # ascending client ids
        for lo in range(0, counts[rank], chunk):
            k = min(chunk, counts[rank] - lo)
            if rank == world.rank:
                rows = mine[lo:lo + k]
                if rows[-1] - rows[0] == k - 1:  # consecutive rows (every row, in memory): a slice, not a copy
                    values = store.block(entry.name, int(rows[0]), int(rows[-1]) + 1).contiguous()
                else:
                    values = store.gather(torch.as_tensor(rows, device=world.device), [entry.name])[entry.name]
                ids = torch.as_tensor(rows + blocks[rank][0], device=world.device)
                if not world.is_root:
                    send(world, ids, 0)
                    send(world, values, 0)
            elif world.is_root:
                ids = torch.empty(k, dtype=torch.int64, device=world.device)
                values = torch.empty((k, *row_shape), dtype=local.dtype, device=local.device)
                recv(world, ids, rank)  # received even when the file failed: the sender must not block
                recv(world, values, rank)
            if sink is not None:  # rank 0, the file still being written
                attempt(sink.put, ids.cpu().numpy(), values.cpu().numpy())
    if sink is not None:
        attempt(sink.finish)


def _numpy_dtype(t: torch.Tensor) -> np.dtype:
    return torch.empty(0, dtype=t.dtype).numpy().dtype


# ---------------------------------------------------------------------------------------------- resuming


@dataclass(frozen=True)
class Resumable:
    """A checkpoint to resume from, verified with its chain, and what a resume asks of it, read while verifying
    (so nobody opens it again to ask). A path-like object: ``os.fspath`` gives the file."""

    path: Path
    round: int  # meta/round: the rounds it has done
    config: dict[str, Any]  # meta/config: the resolved config it was written with

    @property
    def name(self) -> str:
        return self.path.name

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)


@dataclass(frozen=True)
class Search:
    """What ``--resume auto`` found in a run directory: the newest checkpoint it can resume from (None: none is
    left) and every newer one it passed over, newest first, with why."""

    found: Resumable | None
    skipped: list[Skipped]


def resumable(ckpt: CheckpointReader) -> Resumable:
    """Raise :class:`CheckpointError` unless ``ckpt``'s config is a valid config and ``ckpt`` and every link it
    builds on open, are the files they were written on, are complete and pass their checksums, each checked
    once (a broken link: a :class:`BrokenChain` naming it); the open file's :class:`Resumable`."""
    config = _valid_config(ckpt)
    with Chain(ckpt) as chain:  # ckpt stays open: it is the caller's
        chain.check(legacy_manifest)
    return Resumable(ckpt.path, int(ckpt.meta["round"]), config)


def _valid_config(ckpt: CheckpointReader) -> dict[str, Any]:
    """The checkpoint's resolved config (``meta/config``), which a resume compares with its own: it must be a
    valid config."""
    config = ckpt.config()
    try:
        config_from_dict(config)
    except ConfigError as exc:
        raise CheckpointError(f"{ckpt.path}: meta/config is not a valid config ({exc})") from None
    return config


def scan(run_dir: Path) -> Search:
    """The newest checkpoint of ``run_dir`` that is :func:`resumable`, each candidate opened once."""
    _, found, skipped = newest(run_dir, resumable)
    return Search(found, skipped)


def locate(run_dir: Path | None, resume: str) -> Resumable | None:
    """The checkpoint to resume from (rank 0): a path, which must be :func:`resumable`, or ``auto`` = the
    newest checkpoint of the run directory that is (:func:`scan`), or None. ``auto`` says in one line which
    newer ones it skipped and why."""
    if resume != "auto":
        path = Path(resume)
        if path.is_dir():
            raise CheckpointError(f"--resume {path}: is a directory; expected a ckpt_*.h5 file or auto")
        if not path.is_file():
            raise CheckpointError(f"{path}: checkpoint file not found")
        with CheckpointReader(path) as ckpt:
            try:
                return resumable(ckpt)
            except BrokenChain as exc:
                raise CheckpointError(f"--resume {path}: cannot resume: its {exc}") from None
    if run_dir is None:
        return None
    search = scan(run_dir)
    if search.skipped:
        skipped: dict[str, list[str]] = {}  # why -> the files skipped for it (a broken link: every file it breaks)
        for passed in search.skipped:
            skipped.setdefault(passed.why, []).append(passed.file)
        whys = "; ".join(f"{', '.join(names)}: {why}" for why, names in skipped.items())
        then = f"resuming from {search.found.name}" if search.found is not None else "no complete checkpoint is left"
        print(f"fedrun: warning: skipping checkpoint {whys}; {then}", flush=True)
    return search.found


def check_layout(ckpt: CheckpointReader) -> None:
    """Raise :class:`CheckpointError` unless ``ckpt``'s config is valid, naming the first dataset of the file's
    manifest that is missing or misshapen (a file written without one: its derived manifest,
    fedrun.federation.legacy)."""
    _valid_config(ckpt)
    check_complete(ckpt, legacy_manifest)


def check_chain(ckpt: CheckpointReader) -> None:
    """Raise :class:`CheckpointError` unless ``ckpt`` is :func:`resumable`. ``--resume FILE``, ``--resume auto``,
    ``inspect`` and ``consolidate`` all ask this: one meaning of a damaged chain."""
    resumable(ckpt)


def rounds_done(found: Resumable) -> int:
    """The rounds a checkpoint found by :func:`locate` has done (its ``meta/round``)."""
    return found.round


def saved_config(path: Resumable | Path) -> dict[str, Any]:
    """The resolved config a checkpoint was written with (``meta/config``), as a dict (a :class:`Resumable`
    has it already)."""
    if isinstance(path, Resumable):
        return path.config
    with CheckpointReader(path) as ckpt:
        return ckpt.config()


def restore(setup: Setup, state: RunState, found: Resumable | Path) -> None:
    """Load checkpoint ``found`` into ``state`` (every rank reads its own block's rows) and publish its downlink."""
    path, cfg = Path(os.fspath(found)), setup.cfg
    with Chain(path) as chain:  # the newest link storing a row wins; rows no link stores keep their initial value
        ckpt = chain.head
        meta = ckpt.meta
        expected = {"algorithm": cfg.algorithm.name, "num_clients": setup.num_clients, "dim": setup.dim}
        for key, value in expected.items():
            if meta[key] != value:
                raise CheckpointError(f"{path}: written for {key}={meta[key]!r}, but this run has {key}={value!r}")
        read_parts(ckpt, parts(setup, state))
        first, stop = setup.placement.blocks[setup.world.rank]
        device, dtype = setup.world.device, setup.dtype
        for entry in state.clients.entries:
            name = f"clients/{entry.name}"
            row_bytes = (setup.dim if isinstance(entry, Vector) else 1) * torch.empty(0, dtype=dtype).element_size()
            for lo, hi in chain.windows(name, first, stop, max(1, _CHUNK_BYTES // row_bytes)):  # verifies them
                rows = state.clients.block(entry.name, lo - first, hi - first).cpu().numpy().copy()
                chain.overlay(name, lo, hi, rows)
                state.clients.load(entry.name, lo - first, _tensor(rows, device, dtype))
        state.clients.checkpointed()
        link = base_of(ckpt)
        in_run = setup.run_dir is not None and path.resolve().parent == Path(setup.run_dir).resolve()
        state.chain = ChainTip(path, 0 if link is None else link["depth"]) if in_run else ChainTip()
        state.next_round = int(meta["round"])
    setup.exchange.publish(state.server)


def _tensor(value: np.ndarray, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(np.asarray(value), device=device).to(dtype)
