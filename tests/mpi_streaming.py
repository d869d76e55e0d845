"""Run on real ranks by tests/test_persistence.py: a streaming part (fedrun.checkpoint.stateful.StreamingStateful)
saved by fedrun.checkpoint.collective into a real file, a few rows a block, then loaded back with the rows
spread over the ranks another way. ``python tests/mpi_streaming.py DIR``; rank 0 writes DIR/loaded.npz: every
table as the ranks loaded it (gathered), and how often each rank heard ``checkpointed``.

Rows are split so that rank 0 holds the later rows when saving (the file is in row order, not rank order).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from fedrun.checkpoint import CheckpointWriter, collective
from fedrun.checkpoint.chain import Chain
from fedrun.runtime.world import init_world

N, D = 11, 3
SAVE_SPANS = [(6, 11), (0, 6)]  # rank 0 holds rows 6..10 when saving
LOAD_SPANS = [(0, 4), (4, 11)]
TABLES = {"v": None, "w": 2.0, "s": 0.0}  # v: no constant initial value (the rows form); w, s: constants


def initial(name: str, n: int) -> np.ndarray:
    """What table ``name`` holds before anything is written: ``w`` 2.0, ``s`` 0, ``v`` its row number."""
    if name == "s":
        return np.zeros(n)
    return np.full((n, D), 2.0) if name == "w" else np.repeat(np.arange(n, dtype=np.float64)[:, None], D, axis=1)


def written(name: str, n: int) -> np.ndarray:
    """Every table's value after the rows the test writes: rows 1, 2, 3, 7 and 10 of ``v`` and ``w`` get
    ``100 * row + column``, ``s`` gets ``row + 0.5`` everywhere."""
    out = initial(name, n)
    if name == "s":
        return np.arange(n) + 0.5
    for r in (1, 2, 3, 7, 10):
        out[r] = 100.0 * r + np.arange(D)
    return out


class Table:
    """Rows ``span`` of the three tables, in memory: a :class:`StreamingStateful` of the simplest kind."""

    def __init__(self, span: tuple[int, int], values: dict[str, np.ndarray]) -> None:
        self.span = span
        self.values = {name: torch.as_tensor(v[span[0]:span[1]].copy()) for name, v in values.items()}
        self.saved = 0

    def tables(self) -> dict[str, float | None]:
        return dict(TABLES)

    def stored(self, name: str, increment: bool) -> np.ndarray:
        first, stop = self.span
        if name == "s":
            return np.arange(stop - first)
        return np.array([r - first for r in (1, 2, 3, 7, 10) if first <= r < stop], dtype=np.int64)

    def rows(self, name: str, rows: np.ndarray) -> torch.Tensor:
        return self.values[name][torch.as_tensor(rows, dtype=torch.int64)]

    def load(self, name: str, start: int, values: np.ndarray) -> None:
        self.values[name][start:start + len(values)] = torch.as_tensor(values)

    def checkpointed(self) -> None:
        self.saved += 1


class Counts:
    """A :class:`Stateful` part next to the streaming one."""

    def __init__(self, value: np.ndarray) -> None:
        self.value = value

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"k": self.value}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.value = state["k"]


def main(out: Path) -> None:
    world = init_world("cpu")
    collective.BLOCK_BYTES = 2 * D * 8  # two vector rows a block: several blocks from every rank
    saving = Table(SAVE_SPANS[world.rank], {name: written(name, N) for name in TABLES})
    path = collective.save_parts(
        world, lambda: CheckpointWriter(out, 1, algorithm="t", num_clients=N, dim=D, config="", keep=None),
        {"counts": Counts(np.arange(4)), "clients": saving}, increment=False, what="test checkpoint", where=out)
    loading = Table(LOAD_SPANS[world.rank], {name: initial(name, N) for name in TABLES})
    counts = Counts(np.zeros(0))
    with Chain(out / "ckpt_00000001.h5") as chain:
        collective.load_parts(chain, {"counts": counts, "clients": loading})
    pieces = world.allgather_object(({k: v.numpy() for k, v in loading.values.items()},
                                     saving.saved, loading.saved, counts.value))
    if world.is_root:
        assert path == out / "ckpt_00000001.h5", path
        np.savez(out / "loaded.npz", **{name: np.concatenate([p[0][name] for p in pieces]) for name in TABLES},
                 saved=[p[1] for p in pieces], loaded=[p[2] for p in pieces], counts=np.stack([p[3] for p in pieces]))
    world.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
