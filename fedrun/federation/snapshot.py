"""Save and restore a whole run (ARCHITECTURE.md seam 6: the checkpoint is the run).

Rank 0 writes one HDF5 file (fedrun.checkpoint) with the server state, every per-client entry of all
N clients, the participation pattern's state, the delay history, the metrics so far and the resolved
config. Client rows are streamed from their owner ranks in bounded chunks, so rank 0 never holds
more than one chunk of another rank's state. On resume every rank reads only the rows of its own
block, so a run can resume on a different number of ranks (the clients are re-blocked).

All randomness is counter-based in (seed, round, client) (``fedrun.data.client_block.hash_keys``,
per-round generators of the participation patterns), so restoring the round number restores every
random stream: a resumed run is bit-identical to an uninterrupted one on the same number of ranks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from fedrun.algorithms.base import Vector
from fedrun.checkpoint import CheckpointError, CheckpointReader, CheckpointWriter, find_latest_valid
from fedrun.errors import CheckpointWriteError

if TYPE_CHECKING:
    from fedrun.federation.loop import Federation

_CHUNK_BYTES = 8 << 20  # rows of client state sent to rank 0 at a time


def save(fed: Federation, next_round: int) -> Path | None:
    """Write the checkpoint of a run whose rounds ``< next_round`` are done (collective call)."""
    world, cfg = fed.world, fed.cfg
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
            writer = CheckpointWriter(fed.run_dir, next_round, algorithm=cfg.algorithm.name,
                                      num_clients=fed.num_clients, dim=fed.dim, config=cfg.to_yaml(),
                                      keep=cfg.checkpoint.keep)
        except Exception as exc:
            error = exc
    if writer is not None:
        for name, value in fed.server.items():
            attempt(writer.write, f"server/{name}", value.detach().cpu().numpy())
        for name, value in fed.participation.state_dict().items():
            attempt(writer.write, f"participation/{name}", value)
        for name, value in fed.delay.state_dict().items():
            attempt(writer.write, f"history/{name}", value)
        for name, value in fed.runtime_state().items():  # e.g. the asynchronous mode's in-flight tasks
            attempt(writer.write, f"runtime_state/{name}", value)
        attempt(writer.write, "random/seed", np.int64(cfg.run.seed))
        attempt(writer.write, "runtime/strategy", fed.strategy)
        attempt(writer.write, "metrics/jsonl", "".join(json.dumps(r) + "\n" for r in fed.metrics.records))
    for entry in fed.decl.client:
        _gather_rows(fed, writer, entry.name, isinstance(entry, Vector), attempt)
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
        raise CheckpointWriteError(f"checkpoint of round {next_round} in {fed.run_dir} failed: {error}; "
                                   "the earlier checkpoints are intact") from None
    if failed.item():
        raise CheckpointWriteError(f"checkpoint of round {next_round} failed on rank 0")
    return path


def _gather_rows(fed: Federation, writer: CheckpointWriter | None, name: str, vector: bool, attempt) -> None:
    world = fed.world
    local = fed.store.tensors[name]
    row_shape = (fed.dim,) if vector else ()
    row_bytes = max(1, int(np.prod(row_shape, dtype=np.int64)) * local.element_size())
    chunk = max(1, _CHUNK_BYTES // row_bytes)
    path = f"clients/{name}"
    if writer is not None:
        attempt(writer.create_rows, path, fed.num_clients, row_shape, _numpy_dtype(local), rows_per_chunk=chunk)
    for rank, (first, stop) in enumerate(fed.blocks):
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


def locate(fed: Federation, resume: str) -> Path | None:
    """The checkpoint to resume from: ``auto`` = newest valid one in the run directory (or None)."""
    if resume != "auto":
        path = Path(resume)
        if not path.is_file():
            raise CheckpointError(f"{path}: checkpoint file not found")
        return path
    if fed.run_dir is None:
        return None
    if fed.world.is_root:
        found = find_latest_valid(fed.run_dir, warn=lambda msg: print(f"fedrun: warning: {msg}", flush=True))
    else:
        found = None
    found = fed.world.broadcast_object(None if found is None else str(found))
    return None if found is None else Path(found)


def restore(fed: Federation, path: Path) -> int:
    """Load ``path`` into ``fed`` (every rank reads its own block) and return the next round."""
    cfg = fed.cfg
    with CheckpointReader(path) as ckpt:
        meta = ckpt.meta
        expected = {"algorithm": cfg.algorithm.name, "num_clients": fed.num_clients, "dim": fed.dim}
        for key, value in expected.items():
            if meta[key] != value:
                raise CheckpointError(f"{path}: written for {key}={meta[key]!r}, but this run has {key}={value!r}")
        device, dtype = fed.world.device, fed.dtype
        if fed.world.is_root:
            fed.server = {e.name: _tensor(ckpt.read(f"server/{e.name}"), device, dtype) for e in fed.decl.server}
        first, stop = fed.blocks[fed.world.rank]
        for entry in fed.decl.client:
            rows = ckpt.read_rows(f"clients/{entry.name}", first, stop)  # checks the CRCs of these rows
            fed.store.tensors[entry.name] = _tensor(rows, device, dtype)
        fed.participation.load_state_dict({n: ckpt.read(f"participation/{n}") for n in ckpt.names("participation")})
        fed.delay.load_state_dict({n: ckpt.read(f"history/{n}") for n in ckpt.names("history")})
        fed.strategy = str(ckpt.read("runtime/strategy"))
        if "runtime_state" in ckpt.names():
            try:
                fed.load_runtime_state({n: ckpt.read(f"runtime_state/{n}") for n in ckpt.names("runtime_state")})
            except CheckpointError as err:  # the runtime's own state does not fit this run's config
                raise CheckpointError(f"{path}: {err}") from None
        records = [json.loads(line) for line in ckpt.read("metrics/jsonl").splitlines() if line.strip()]
        next_round = int(meta["round"])
    if fed.world.is_root:
        fed.metrics.reset(records)
        fed.pack_downlink()
    fed.broadcast_downlink()
    return next_round


def _tensor(value: np.ndarray, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(np.asarray(value), device=device).to(dtype)
