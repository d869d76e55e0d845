"""Save and restore a whole run: the checkpoint is the :class:`fedrun.federation.build.RunState`.

Rank 0 writes one HDF5 file (fedrun.checkpoint). Every part of the run state saves and loads itself through
one contract (fedrun.checkpoint.stateful); this module names the parts (:func:`parts`), one group of the
file each, and fedrun.checkpoint.collective writes and reads them all alike:

    server/<entry>       the server state (rank 0's)
    schedule/<name>      the schedule's state (participation pattern, or the asynchronous event queue)
    history/<name>       the delay tracker (last participation of every client, running delay sums)
    random/seed          the run seed (every random stream is a function of seed, round and client)
    runtime/strategy     the local-training strategy
    metrics/jsonl        the metrics records so far
    privacy/<name>       with privacy.mode != none: sigma, the clip, the rounds' sampling probabilities and
                         every client's participations (the accountant's state, fedrun.privacy)
    clients/<entry>      every per-client entry of all N clients, the rows the schedule holds uploads in
                         included: a streaming part (fedrun.state.part), each rank's block streamed to rank 0
                         on saving and read back by its owner on resuming, so a run can resume on a
                         different number of ranks

An increment (``checkpoint.full_every``, fedrun.checkpoint.chain) links to the checkpoint it builds on
(:class:`~fedrun.checkpoint.chain.ChainTip`) and stores the vector rows changed since it.

All randomness is counter-based in (seed, round, client) (``fedrun.data.hashing.hash_keys``,
per-round generators of the participation patterns), so restoring the round number restores every
random stream: a resumed run is bit-identical to an uninterrupted one on the same number of ranks.

Finding the checkpoint to resume from (:func:`locate`) opens each candidate once, verifies it and its chain
against their manifests (a file written without one: the layout its config implies, :func:`old_parts`) and
checksums, and keeps what a resume asks of it (:class:`Resumable`); restoring opens it a second time, to
read it. What it passed over is data (:class:`Search`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrun.algorithms import get_algorithm
from fedrun.checkpoint import CheckpointReader, CheckpointWriter, checkpoint_name
from fedrun.checkpoint.chain import Chain, ChainTip, base_of
from fedrun.checkpoint.collective import Part, load_parts, save_parts
from fedrun.checkpoint.format import CLIENTS, HISTORY, METRICS, PRIVACY, RANDOM, RUNTIME, SCHEDULE, SERVER
from fedrun.checkpoint.legacy import OldParts, legacy
from fedrun.checkpoint.manifest import check_complete
from fedrun.checkpoint.reader import Skipped, newest
from fedrun.config import Config, config_from_dict
from fedrun.errors import BrokenChain, CheckpointError, ConfigError
from fedrun.federation.build import RunState, Setup
from fedrun.federation.client_trainer import Learner
from fedrun.federation.delay import DelayTracker
from fedrun.federation.participation import Participation
from fedrun.federation.schedule import Buffered, Synchronous
from fedrun.metrics.log import json_line
from fedrun.privacy.mechanism import layout as privacy_layout
from fedrun.protocol import Entry, Vector
from fedrun.state.part import ClientRowsPart
from fedrun.training.local_strategy import local_strategy

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


def parts(setup: Setup, state: RunState) -> dict[str, Part]:
    """The parts of ``state`` that save and load themselves, by checkpoint group (the server's on rank 0 only),
    the client rows last."""
    world = setup.world
    found: dict[str, Part] = {}
    if world.is_root:
        found[SERVER] = _Server(state, setup.decl.server, world.device, setup.dtype)
    found.update({SCHEDULE: state.schedule, HISTORY: state.delay, RANDOM: _Seed(setup.cfg.run.seed),
                  RUNTIME: _Strategy(state, setup.learner, world.device), METRICS: _Metrics(state)})
    if state.privacy is not None:
        found[PRIVACY] = state.privacy
    found[CLIENTS] = ClientRowsPart(state.clients, setup.placement.blocks[world.rank], world.device, setup.dtype)
    return found


def old_parts(num_clients: int, dim: int, rounds_done: int, config: dict[str, Any]) -> OldParts:
    """What each part held in a file written before the manifest, derived from its config as the run wrote it
    (fedrun.checkpoint.legacy lays it out in the file): the algorithm's declaration, the schedule the config
    runs (its state, the rows it holds uploads in), the delay tracker and, with privacy, the accountant."""
    cfg = _config(config)
    decl = get_algorithm(cfg.algorithm.name)(cfg.algorithm.hparams).declare()

    def shapes(entries: tuple[Entry, ...]) -> dict[str, tuple[int, ...]]:
        return {e.name: (dim,) if isinstance(e, Vector) else () for e in entries}

    # the schedule before its first step, from the config alone: its state holds the datasets every checkpoint
    # of the config holds (a stateful pattern adds its own, not checked here: building it may need its files)
    schedule = Buffered(cfg.asynchrony, num_clients, cfg.run.seed, torch.float64, torch.device("cpu")) \
        if cfg.asynchrony.enabled else Synchronous(Participation(num_clients, cfg.run.seed))
    return OldParts(server=shapes(decl.server), clients=shapes((*decl.client, *schedule.held_entries(decl.up))),
                    schedule={k: np.shape(v) for k, v in schedule.state_dict().items()},
                    history={k: np.shape(v) for k, v in DelayTracker(num_clients).state_dict().items()},
                    privacy=privacy_layout(num_clients, rounds_done) if cfg.privacy.mode != "none" else {})


_LEGACY = legacy(old_parts)  # the manifest of a file written without one


# ------------------------------------------------------------------------------------------------- saving


def save(setup: Setup, state: RunState) -> Path | None:
    """Write the checkpoint of ``state`` (its rounds ``< state.next_round`` are done; collective call): full, or
    an increment on ``state.chain`` holding the vector rows changed since it (``checkpoint.full_every``)."""
    world, cfg, next_round = setup.world, setup.cfg, state.next_round
    full_every = cfg.checkpoint.full_every or state.clients.default_full_every
    link = state.chain.next_link(full_every) if world.is_root else None
    depth = world.broadcast_object(0 if link is None else link["depth"])  # 0: a full checkpoint

    def open_writer() -> CheckpointWriter:
        return CheckpointWriter(setup.run_dir, next_round, algorithm=cfg.algorithm.name,
                                num_clients=setup.num_clients, dim=setup.dim, config=cfg.to_yaml(),
                                keep=cfg.checkpoint.keep, base=link)

    path = save_parts(world, open_writer, parts(setup, state), increment=depth > 0,
                      what=f"checkpoint after round {next_round}", where=setup.run_dir)
    state.chain = ChainTip(setup.run_dir / checkpoint_name(next_round), depth)
    return path


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
        chain.check(_LEGACY)
    return Resumable(ckpt.path, ckpt.round, config)


def _valid_config(ckpt: CheckpointReader) -> dict[str, Any]:
    """The checkpoint's resolved config (``meta/config``), which a resume compares with its own: it must be a
    valid config."""
    config = ckpt.config()
    try:
        _config(config)
    except CheckpointError as exc:
        raise CheckpointError(f"{ckpt.path}: {exc}") from None
    return config


def _config(config: dict[str, Any]) -> Config:
    """A checkpoint's ``meta/config`` as a :class:`Config` (:class:`CheckpointError` when it is not a valid one)."""
    try:
        return config_from_dict(config)
    except ConfigError as exc:
        raise CheckpointError(f"meta/config is not a valid config ({exc})") from None


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
    fedrun.checkpoint.legacy)."""
    _valid_config(ckpt)
    check_complete(ckpt, _LEGACY)


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
    """Load checkpoint ``found`` into ``state`` (every rank reads its own block's rows; the newest link storing
    a row wins, rows no link stores keep their initial value) and publish its downlink."""
    path = Path(os.fspath(found))
    with Chain(path) as chain:
        ckpt = chain.head
        ckpt.check_written_for(algorithm=setup.cfg.algorithm.name, num_clients=setup.num_clients, dim=setup.dim)
        load_parts(chain, parts(setup, state))
        link = base_of(ckpt)
        in_run = setup.run_dir is not None and path.resolve().parent == Path(setup.run_dir).resolve()
        state.chain = ChainTip(path, 0 if link is None else link["depth"]) if in_run else ChainTip()
        state.next_round = ckpt.round
    setup.exchange.publish(state.server)


def _tensor(value: np.ndarray, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(np.asarray(value), device=device).to(dtype)
