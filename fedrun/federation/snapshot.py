"""Save and restore a whole run: the checkpoint is the :class:`fedrun.federation.build.RunState`.

Rank 0 writes one HDF5 file (fedrun.checkpoint), one group per part of the run state:

    server/<entry>       the server state (rank 0's)
    clients/<entry>      every per-client entry of all N clients, parked uploads included ([N, d] or [N])
    schedule/<name>      the schedule's state (participation pattern, or the asynchronous event queue)
    history/<name>       the delay tracker (last participation of every client, running delay sums)
    runtime/strategy     the local-training strategy
    metrics/jsonl        the metrics records so far
    random/seed          the run seed (every random stream is a function of seed, round and client)
    plugins/<field>      "package.module:Attr@<sha256>" of every field naming a plugin (fedrun.plugins)

plus the meta group (next round, resolved config, algorithm, N, d). Client rows are streamed from
their owner ranks in bounded chunks, so rank 0 never holds more than one chunk of another rank's state.
On resume every rank reads only the rows of its own block, so a run can resume on a different number of
ranks (the clients are re-blocked).

All randomness is counter-based in (seed, round, client) (``fedrun.data.client_block.hash_keys``,
per-round generators of the participation patterns), so restoring the round number restores every
random stream: a resumed run is bit-identical to an uninterrupted one on the same number of ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from fedrun.checkpoint import CheckpointReader, CheckpointWriter, find_latest_valid
from fedrun.errors import CheckpointError, CheckpointWriteError
from fedrun.federation.build import RunState, Setup
from fedrun.protocol import Vector

_CHUNK_BYTES = 8 << 20  # rows of client state sent to rank 0 at a time


def save(setup: Setup, state: RunState) -> Path | None:
    """Write the checkpoint of ``state`` (its rounds ``< state.next_round`` are done; collective call)."""
    world, cfg, next_round = setup.world, setup.cfg, state.next_round
    writer = None
    error: Exception | None = None

    def attempt(fn, *args, **kwargs) -> None:
        nonlocal error
        if error is None:
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # keep draining the other ranks' rows, then report
                error = exc

    if world.is_root:
        try:
            writer = CheckpointWriter(setup.run_dir, next_round, algorithm=cfg.algorithm.name,
                                      num_clients=setup.num_clients, dim=setup.dim, config=cfg.to_yaml(),
                                      keep=cfg.checkpoint.keep)
        except Exception as exc:
            error = exc
    if writer is not None:
        for name, value in state.server.items():
            attempt(writer.write, f"server/{name}", value.detach().cpu().numpy())
        for name, value in state.schedule.state_dict().items():
            attempt(writer.write, f"schedule/{name}", value)
        for name, value in state.delay.state_dict().items():
            attempt(writer.write, f"history/{name}", value)
        attempt(writer.write, "random/seed", np.int64(cfg.run.seed))
        for field, digest in setup.plugins.items():
            attempt(writer.write, f"plugins/{field}", digest)
        attempt(writer.write, "runtime/strategy", state.strategy)
        attempt(writer.write, "metrics/jsonl", "".join(json.dumps(r) + "\n" for r in state.metrics))
    for entry in state.clients.entries:
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
        raise CheckpointWriteError(f"checkpoint of round {next_round} in {setup.run_dir} failed: {error}; "
                                   "the earlier checkpoints are intact") from None
    if failed.item():
        raise CheckpointWriteError(f"checkpoint of round {next_round} failed on rank 0")
    return path


def _gather_rows(setup: Setup, state: RunState, writer: CheckpointWriter | None, name: str, vector: bool,
                 attempt) -> None:
    world = setup.world
    local = state.clients.tensors[name]
    row_shape = (setup.dim,) if vector else ()
    row_bytes = max(1, int(np.prod(row_shape, dtype=np.int64)) * local.element_size())
    chunk = max(1, _CHUNK_BYTES // row_bytes)
    path = f"clients/{name}"
    if writer is not None:
        attempt(writer.create_rows, path, setup.num_clients, row_shape, _numpy_dtype(local), rows_per_chunk=chunk)
    for rank, (first, stop) in enumerate(setup.blocks):
        for start in range(first, stop, chunk):
            end = min(stop, start + chunk)
            if rank == world.rank:
                rows = local[start - first:end - first].contiguous()
                if world.is_root:
                    attempt(writer.write_rows, path, start, rows.cpu().numpy())
                else:
                    dist.send(rows, dst=0)
            elif world.is_root:
                rows = torch.empty((end - start, *row_shape), dtype=local.dtype, device=local.device)
                dist.recv(rows, src=rank)
                attempt(writer.write_rows, path, start, rows.cpu().numpy())


def _numpy_dtype(t: torch.Tensor) -> np.dtype:
    return torch.empty(0, dtype=t.dtype).numpy().dtype


def locate(setup: Setup, resume: str) -> Path | None:
    """The checkpoint to resume from: ``auto`` = newest valid one in the run directory (or None)."""
    if resume != "auto":
        path = Path(resume)
        if not path.is_file():
            raise CheckpointError(f"{path}: checkpoint file not found")
        return path
    if setup.run_dir is None:
        return None
    if setup.world.is_root:
        found = find_latest_valid(setup.run_dir, warn=lambda msg: print(f"fedrun: warning: {msg}", flush=True))
    else:
        found = None
    found = setup.world.broadcast_object(None if found is None else str(found))
    return None if found is None else Path(found)


def restore(setup: Setup, state: RunState, path: Path) -> None:
    """Load ``path`` into ``state`` (every rank reads its own block's rows) and publish its downlink."""
    cfg = setup.cfg
    with CheckpointReader(path) as ckpt:
        meta = ckpt.meta
        expected = {"algorithm": cfg.algorithm.name, "num_clients": setup.num_clients, "dim": setup.dim}
        for key, value in expected.items():
            if meta[key] != value:
                raise CheckpointError(f"{path}: written for {key}={meta[key]!r}, but this run has {key}={value!r}")
        _check_plugins(path, recorded_plugins(ckpt), setup.plugins)
        device, dtype = setup.world.device, setup.dtype
        if setup.world.is_root:
            state.server = {e.name: _tensor(ckpt.read(f"server/{e.name}"), device, dtype) for e in setup.decl.server}
        first, stop = setup.blocks[setup.world.rank]
        for entry in state.clients.entries:
            rows = ckpt.read_rows(f"clients/{entry.name}", first, stop)  # checks the CRCs of these rows
            state.clients.tensors[entry.name] = _tensor(rows, device, dtype)
        try:
            state.schedule.load_state_dict({n: ckpt.read(f"schedule/{n}") for n in ckpt.names("schedule")})
        except CheckpointError as err:  # the schedule's state does not fit this run's config
            raise CheckpointError(f"{path}: {err}") from None
        state.delay.load_state_dict({n: ckpt.read(f"history/{n}") for n in ckpt.names("history")})
        state.strategy = str(ckpt.read("runtime/strategy"))
        state.metrics = [json.loads(line) for line in ckpt.read("metrics/jsonl").splitlines() if line.strip()]
        state.next_round = int(meta["round"])
    setup.exchange.publish(state.server)


def recorded_plugins(ckpt: CheckpointReader) -> dict[str, str]:
    """``{field: "module:Attr@sha256"}`` as the checkpoint recorded it (empty before plugins existed)."""
    if "plugins" not in ckpt.names():
        return {}
    return {field: str(ckpt.read(f"plugins/{field}")) for field in ckpt.names("plugins")}


def _check_plugins(path: Path, recorded: dict[str, str], current: dict[str, str]) -> None:
    """Refuse to resume when a plugin's source changed since the checkpoint (or a plugin field changed):
    the resumed run would not continue the recorded one."""
    for field in sorted(set(recorded) | set(current)):
        was, now = recorded.get(field, "(no plugin)"), current.get(field, "(no plugin)")
        if was != now:
            raise CheckpointError(f"{path}: {field} was {was} when the checkpoint was written, now {now}; "
                                  "restore that code, or start a new run.dir")


def _tensor(value: np.ndarray, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(np.asarray(value), device=device).to(dtype)
