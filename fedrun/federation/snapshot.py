"""Save and restore a whole run: the checkpoint is the :class:`fedrun.federation.build.RunState`.

Rank 0 writes one HDF5 file (fedrun.checkpoint), one group per part of the run state:

    server/<entry>       the server state (rank 0's)
    clients/<entry>      every per-client entry of all N clients ([N, d] or [N]), the rows the schedule
                         holds uploads in included (the asynchronous mode's parked uploads)
    schedule/<name>      the schedule's state (participation pattern, or the asynchronous event queue)
    history/<name>       the delay tracker (last participation of every client, running delay sums)
    runtime/strategy     the local-training strategy
    metrics/jsonl        the metrics records so far
    random/seed          the run seed (every random stream is a function of seed, round and client)
    privacy/<name>       with privacy.mode != none: sigma, the clip, the rounds' sampling probabilities and
                         every client's participations (the accountant's state, fedrun.privacy)

plus the meta group (next round, resolved config, algorithm, N, d). Client rows are streamed from
their owner ranks in bounded chunks, so rank 0 never holds more than one chunk of another rank's state.
An increment (``checkpoint.full_every``, fedrun.checkpoint.chain) holds, of each per-client vector, only
the rows changed since the previous checkpoint (``clients/<entry>/rows`` and ``values``) and links to it.
On resume every rank reads only the rows of its own block, newest link first, so a run can resume on a
different number of ranks (the clients are re-blocked).

All randomness is counter-based in (seed, round, client) (``fedrun.data.hashing.hash_keys``,
per-round generators of the participation patterns), so restoring the round number restores every
random stream: a resumed run is bit-identical to an uninterrupted one on the same number of ranks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml

from fedrun.algorithms import get_algorithm
from fedrun.checkpoint import CheckpointReader, CheckpointWriter, checkpoint_name, find_latest_valid
from fedrun.checkpoint.chain import Chain, base_of, link_to
from fedrun.config import Config, config_from_dict
from fedrun.errors import BrokenChain, CheckpointError, CheckpointWriteError, ConfigError
from fedrun.federation.build import RunState, Setup
from fedrun.federation.delay import DelayTracker
from fedrun.federation.schedule import schedule_type
from fedrun.metrics.log import json_line
from fedrun.privacy.mechanism import layout as privacy_layout
from fedrun.protocol import Scalar, Vector

_CHUNK_BYTES = 8 << 20  # rows of client state sent to rank 0 at a time
_SPARSE_CHUNK_BYTES = 64 << 10  # rows per HDF5 chunk of a sparse (disk store) entry: one row of a large model


def save(setup: Setup, state: RunState) -> Path | None:
    """Write the checkpoint of ``state`` (its rounds ``< state.next_round`` are done; collective call): full, or
    an increment on ``state.base`` holding the vector rows changed since it (``checkpoint.full_every``)."""
    world, cfg, next_round, store = setup.world, setup.cfg, state.next_round, state.clients
    writer = None
    error: Exception | None = None
    link: dict[str, Any] | None = None

    def attempt(fn, *args, **kwargs) -> None:
        nonlocal error
        if error is None:
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # keep draining the other ranks' rows, then report
                error = exc

    if world.is_root:
        link = _next_link(state, full_every(cfg, store.kind))
        try:
            writer = CheckpointWriter(setup.run_dir, next_round, algorithm=cfg.algorithm.name,
                                      num_clients=setup.num_clients, dim=setup.dim, config=cfg.to_yaml(),
                                      keep=cfg.checkpoint.keep, base=link)
        except Exception as exc:
            error = exc
    depth = world.broadcast_object(0 if link is None else link["depth"])  # 0: a full checkpoint
    if writer is not None:
        for name, value in state.server.items():
            attempt(writer.write, f"server/{name}", value.detach().cpu().numpy())
        for name, value in state.schedule.state_dict().items():
            attempt(writer.write, f"schedule/{name}", value)
        for name, value in state.delay.state_dict().items():
            attempt(writer.write, f"history/{name}", value)
        attempt(writer.write, "random/seed", np.int64(cfg.run.seed))
        attempt(writer.write, "runtime/strategy", state.strategy)
        attempt(writer.write, "metrics/jsonl", "".join(map(json_line, state.metrics)))
        for name, value in (state.privacy.state_dict() if state.privacy is not None else {}).items():
            attempt(writer.write, f"privacy/{name}", value)
    for entry in store.entries:
        written = store.written(entry.name)
        if isinstance(entry, Vector) and depth:  # an increment: the rows changed since the base
            _send_row_list(setup, store, writer, entry.name, store.changed(entry.name), attempt)
        elif written is not None and store.fill(entry.name) is None:  # on disk, initialised to x^(0)
            _send_row_list(setup, store, writer, entry.name, written, attempt)
        else:
            _gather_rows(setup, state, writer, entry.name, isinstance(entry, Vector), attempt)
    path = None
    if writer is not None:
        if error is None:
            attempt(writer.commit)
            path = writer.path
        if error is not None:
            writer.abort()
    failed = torch.tensor([1.0 if error is not None else 0.0], device=world.device)
    if world.size > 1:
        dist.broadcast(failed, src=0)
    if error is not None:
        raise CheckpointWriteError(f"checkpoint after round {next_round} in {setup.run_dir} failed: {error}; "
                                   "the earlier checkpoints are intact") from None
    if failed.item():
        raise CheckpointWriteError(f"checkpoint after round {next_round} failed on rank 0")
    store.checkpointed()  # the file is in place: its rows are no longer changes
    state.base, state.depth = setup.run_dir / checkpoint_name(next_round), depth
    return path


FULL_EVERY_DISK = 10  # checkpoint.full_every=0 on the disk store: a resume reads at most 10 files


def full_every(cfg: Config, store_kind: str) -> int:
    """Every how many checkpoints one is full (``checkpoint.full_every``; 0: 1 in memory, 10 on disk)."""
    return cfg.checkpoint.full_every or (FULL_EVERY_DISK if store_kind == "disk" else 1)


def _next_link(state: RunState, every: int) -> dict[str, Any] | None:
    """The ``meta/base`` of the next checkpoint when it is an increment on ``state.base``, else None (full:
    the chain is ``every`` long, there is no base, or it no longer opens)."""
    if state.base is None or state.depth + 1 >= every or not state.base.is_file():
        return None
    try:
        with CheckpointReader(state.base) as base:
            return link_to(base, state.depth + 1)
    except CheckpointError:
        return None


def _send_row_list(setup: Setup, store, writer: CheckpointWriter | None, name: str, mask: np.ndarray,
                   attempt) -> None:
    """The rows form of entry ``name``: ``clients/<name>/rows`` (the sorted client ids of the block rows in
    ``mask`` on every rank) and ``clients/<name>/values``, streamed from their owners a chunk at a time."""
    world, path = setup.world, f"clients/{name}"
    mine = np.flatnonzero(mask)
    counts = world.allgather_object(len(mine))
    local = store.block(name, 0, 0)
    chunk = max(1, _CHUNK_BYTES // max(1, setup.dim * local.element_size()))
    if writer is not None:
        attempt(writer.create_rows, f"{path}/rows", sum(counts), (), np.int64)
        attempt(writer.create_rows, f"{path}/values", sum(counts), (setup.dim,), _numpy_dtype(local))
    done = 0
    for rank in sorted(range(world.size), key=lambda r: setup.placement.blocks[r][0]):  # ascending client ids
        first = setup.placement.blocks[rank][0]
        for start in range(0, counts[rank], chunk):
            k = min(chunk, counts[rank] - start)
            if rank == world.rank:
                ids = torch.as_tensor(mine[start:start + k], device=world.device)
                values = store.gather(ids, [name])[name].contiguous()
                ids = ids + first
                if not world.is_root:
                    dist.send(ids, dst=0)
                    dist.send(values, dst=0)
            elif world.is_root:
                ids = torch.empty(k, dtype=torch.int64, device=world.device)
                values = torch.empty((k, setup.dim), dtype=local.dtype, device=local.device)
                dist.recv(ids, src=rank)  # received even when the file failed: the sender must not block
                dist.recv(values, src=rank)
            if world.is_root:
                attempt(_write_rows, writer, f"{path}/rows", done, ids)
                attempt(_write_rows, writer, f"{path}/values", done, values)
                done += k


def _gather_rows(setup: Setup, state: RunState, writer: CheckpointWriter | None, name: str, vector: bool,
                 attempt) -> None:
    world, store = setup.world, state.clients
    local = store.block(name, 0, 0)  # no rows: the dtype and device
    row_shape = (setup.dim,) if vector else ()
    row_bytes = max(1, int(np.prod(row_shape, dtype=np.int64)) * local.element_size())
    chunk = max(1, _CHUNK_BYTES // row_bytes)
    path = f"clients/{name}"
    written = store.written(name)
    fill = 0.0
    if written is not None:  # small chunks, so that a chunk holding one written row costs about that row
        chunk, fill = max(1, _SPARSE_CHUNK_BYTES // row_bytes), store.fill(name)
    if writer is not None:
        attempt(writer.create_rows, path, setup.num_clients, row_shape, _numpy_dtype(local), rows_per_chunk=chunk,
                fill=fill)
    if written is None:  # every row, each rank's block in chunks
        for rank, (first, stop) in enumerate(setup.placement.blocks):
            for start in range(first, stop, chunk):
                _send_rows(setup, store, writer, name, rank, start, min(stop, start + chunk), row_shape, attempt)
        return
    # the chunks holding a row ever written, from their owners; the others are skipped (their rows are `fill`)
    chunk = max(1, min(chunk, setup.num_clients))
    first = setup.placement.first
    mine = np.unique((np.flatnonzero(written) + first) // chunk).tolist()
    done = 0
    for k in sorted(set().union(*world.allgather_object(mine))):
        lo, hi = k * chunk, min(setup.num_clients, (k + 1) * chunk)
        if lo > done and writer is not None:
            attempt(writer.skip_rows, path, done, lo)
        for rank, (first, stop) in enumerate(setup.placement.blocks):
            if max(lo, first) < min(hi, stop):
                _send_rows(setup, store, writer, name, rank, max(lo, first), min(hi, stop), row_shape, attempt)
        done = hi
    if done < setup.num_clients and writer is not None:
        attempt(writer.skip_rows, path, done, setup.num_clients)


def _send_rows(setup: Setup, store, writer: CheckpointWriter | None, name: str, rank: int, start: int, end: int,
               row_shape: tuple[int, ...], attempt) -> None:
    """Client rows ``start:end`` (global ids, all of block ``rank``) from their owner into the file on rank 0."""
    world, path = setup.world, f"clients/{name}"
    first = setup.placement.blocks[rank][0]
    if rank == world.rank:
        rows = store.block(name, start - first, end - first).contiguous()
        if world.is_root:
            attempt(_write_rows, writer, path, start, rows)
        else:
            dist.send(rows, dst=0)
    elif world.is_root:
        local = store.block(name, 0, 0)
        rows = torch.empty((end - start, *row_shape), dtype=local.dtype, device=local.device)
        dist.recv(rows, src=rank)  # received even when the file failed: the sender must not block
        attempt(_write_rows, writer, path, start, rows)


def _write_rows(writer: CheckpointWriter | None, path: str, start: int, rows: torch.Tensor) -> None:
    """Rows into the file; without a writer (its creation failed, the error is already recorded) nothing."""
    if writer is not None:
        writer.write_rows(path, start, rows.cpu().numpy())


def _numpy_dtype(t: torch.Tensor) -> np.dtype:
    return torch.empty(0, dtype=t.dtype).numpy().dtype


def locate(run_dir: Path | None, resume: str) -> Path | None:
    """The checkpoint to resume from (rank 0): a path, which must open, be complete and have a whole chain, or
    ``auto`` = the newest checkpoint of the run directory that verifies, is complete (:func:`check_layout`)
    and whose chain does (:func:`check_chain`), or None. ``auto`` says in one line which newer ones it
    skipped and why."""
    if resume != "auto":
        path = Path(resume)
        if path.is_dir():
            raise CheckpointError(f"--resume {path}: is a directory; expected a ckpt_*.h5 file or auto")
        if not path.is_file():
            raise CheckpointError(f"{path}: checkpoint file not found")
        with CheckpointReader(path) as ckpt:
            check_layout(ckpt)
            try:  # every checksum of every link, as --resume auto and inspect check them
                check_chain(ckpt)
            except BrokenChain as exc:
                raise CheckpointError(f"--resume {path}: cannot resume: its {exc}") from None
        return path
    if run_dir is None:
        return None
    skipped: dict[str, list[str]] = {}  # why -> the files skipped for it (a broken link: every file it breaks)

    def note(message: str) -> None:  # "skipping checkpoint <file>: <why>; falling back to the previous one"
        name, why = message.removeprefix("skipping checkpoint ").removesuffix(_FALLING_BACK).split(": ", 1)
        skipped.setdefault(why, []).append(name)

    found = find_latest_valid(run_dir, warn=note, check=check_chain)
    if skipped:
        whys = "; ".join(f"{', '.join(names)}: {why}" for why, names in skipped.items())
        then = f"resuming from {found.name}" if found is not None else "no complete checkpoint is left"
        print(f"fedrun: warning: skipping checkpoint {whys}; {then}", flush=True)
    return found


_FALLING_BACK = "; falling back to the previous one"  # the end of find_latest_valid's message


def check_chain(ckpt: CheckpointReader) -> None:
    """Raise :class:`CheckpointError` unless ``ckpt`` is complete and every link it builds on opens, is the file
    it was written on, is complete and passes its checksums; a broken link is a :class:`BrokenChain` naming
    it. ``--resume FILE``, ``--resume auto`` and ``inspect`` all call it: one meaning of a damaged chain."""
    check_layout(ckpt)
    with Chain(ckpt.path) as chain:
        for link in chain.links[1:]:
            try:
                check_layout(link)
            except CheckpointError as exc:
                raise BrokenChain(f"chain link {link.path.name} is incomplete ({exc})", link.path) from None
        chain.verify()


def rounds_done(path: Path) -> int:
    """The rounds a checkpoint has done (its ``meta/round``: the next round's 0-based index)."""
    with CheckpointReader(path) as ckpt:
        return int(ckpt.meta["round"])


def saved_config(path: Path) -> dict[str, Any]:
    """The resolved config a checkpoint was written with (``meta/config``), as a dict."""
    with CheckpointReader(path) as ckpt:
        text = ckpt.read("meta/config")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: meta/config is not a YAML mapping of config sections")
    return data


def expected_layout(meta: dict[str, Any], config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every dataset a checkpoint with ``meta`` (N, d) and resolved ``config`` must hold, with its shape.

    Derived, as :func:`save` writes it, from the algorithm's declaration (server entries [d] or scalars,
    client entries [N, d] or [N]), the schedule the config runs (its state, and the client rows it holds
    uploads in) and the delay tracker."""
    n, d = int(meta["num_clients"]), int(meta["dim"])
    try:
        cfg = config_from_dict(config)
    except ConfigError as exc:
        raise CheckpointError(f"meta/config is not a valid config ({exc})") from None
    decl = get_algorithm(cfg.algorithm.name)(cfg.algorithm.hparams).declare()

    def shape(entry: Vector | Scalar, rows: tuple[int, ...]) -> tuple[int, ...]:
        return (*rows, d) if isinstance(entry, Vector) else rows

    schedule = schedule_type(cfg)
    layout = {f"server/{e.name}": shape(e, ()) for e in decl.server}
    layout.update({f"schedule/{name}": want for name, want in schedule.layout(n).items()})
    clients = (*decl.client, *schedule.held_entries(decl.up))
    layout.update({f"clients/{e.name}": shape(e, (n,)) for e in clients})
    layout.update({f"history/{k}": np.shape(v) for k, v in DelayTracker(n).state_dict().items()})
    layout.update({"random/seed": (), "runtime/strategy": (), "metrics/jsonl": ()})
    if cfg.privacy.mode != "none":
        layout.update(privacy_layout(n, int(meta["round"])))
    return layout


def check_layout(ckpt: CheckpointReader) -> None:
    """Raise :class:`CheckpointError` naming the first dataset of :func:`expected_layout` that is missing or
    misshapen in ``ckpt`` (the layout follows from the checkpoint's own meta and config)."""
    try:
        config = yaml.safe_load(ckpt.read("meta/config"))
    except yaml.YAMLError:
        config = None
    if not isinstance(config, dict):
        raise CheckpointError(f"{ckpt.path}: meta/config is not a YAML mapping of config sections")
    try:
        layout = expected_layout(ckpt.meta, config)
    except CheckpointError as exc:
        raise CheckpointError(f"{ckpt.path}: {exc}") from None
    present = set(ckpt.datasets())
    for path, want in layout.items():
        if path.startswith("clients/") and f"{path}/rows" in present and f"{path}/values" in present:
            k = ckpt.shape(f"{path}/rows")  # the rows form (fedrun.checkpoint.chain): k rows of the entry
            if len(k) != 1 or ckpt.shape(f"{path}/values") != (*k, *want[1:]):
                raise CheckpointError(f"{ckpt.path}: {path}/rows and {path}/values have shapes {k} and "
                                      f"{ckpt.shape(f'{path}/values')}, expected (k,) and (k, *{want[1:]})")
            continue
        if path not in present:
            raise CheckpointError(f"{ckpt.path}: incomplete checkpoint: dataset {path} is missing (expected "
                                  f"shape {want} for algorithm {ckpt.meta['algorithm']})")
        if ckpt.shape(path) != want:
            raise CheckpointError(f"{ckpt.path}: dataset {path} has shape {ckpt.shape(path)}, expected {want}")


def restore(setup: Setup, state: RunState, path: Path) -> None:
    """Load ``path`` into ``state`` (every rank reads its own block's rows) and publish its downlink."""
    cfg = setup.cfg
    with CheckpointReader(path) as ckpt:
        meta = ckpt.meta
        expected = {"algorithm": cfg.algorithm.name, "num_clients": setup.num_clients, "dim": setup.dim}
        for key, value in expected.items():
            if meta[key] != value:
                raise CheckpointError(f"{path}: written for {key}={meta[key]!r}, but this run has {key}={value!r}")
        device, dtype = setup.world.device, setup.dtype
        if setup.world.is_root:
            state.server = {e.name: _tensor(ckpt.read(f"server/{e.name}"), device, dtype) for e in setup.decl.server}
        first, stop = setup.placement.blocks[setup.world.rank]
        with Chain(path) as chain:  # the newest link storing a row wins; rows no link stores keep their initial value
            for entry in state.clients.entries:
                name = f"clients/{entry.name}"
                row_bytes = (setup.dim if isinstance(entry, Vector) else 1) * torch.empty(0, dtype=dtype).element_size()
                chunk = max(1, _CHUNK_BYTES // row_bytes)
                for lo, hi in chain.windows(name, first, stop, chunk):  # checks the CRCs of the rows read
                    rows = state.clients.block(entry.name, lo - first, hi - first).cpu().numpy().copy()
                    chain.overlay(name, lo, hi, rows)
                    state.clients.load(entry.name, lo - first, _tensor(rows, device, dtype))
        state.clients.checkpointed()
        link = base_of(ckpt)
        in_run = setup.run_dir is not None and path.resolve().parent == Path(setup.run_dir).resolve()
        state.base, state.depth = (path, 0 if link is None else link["depth"]) if in_run else (None, 0)
        try:
            state.schedule.load_state_dict({n: ckpt.read(f"schedule/{n}") for n in ckpt.names("schedule")})
        except CheckpointError as err:  # the schedule's state does not fit this run's config
            raise CheckpointError(f"{path}: {err}") from None
        state.delay.load_state_dict({n: ckpt.read(f"history/{n}") for n in ckpt.names("history")})
        state.strategy = str(ckpt.read("runtime/strategy"))
        state.metrics = [json.loads(line) for line in ckpt.read("metrics/jsonl").splitlines() if line.strip()]
        if state.privacy is not None:
            state.privacy.load_state_dict({n: ckpt.read(f"privacy/{n}") for n in ckpt.names("privacy")})
        state.next_round = int(meta["round"])
    setup.exchange.publish(state.server)


def _tensor(value: np.ndarray, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(np.asarray(value), device=device).to(dtype)
