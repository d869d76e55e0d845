"""Run several configs in one launch (one rank or an ``mpiexec -n R`` job) and save the final models.

usage: [mpiexec -n R] python tests/mpi_run_model.py OUT.npz SPEC.json

SPEC.json maps a name to a config dict (the form ``fedrun.run`` takes). Every config runs in turn on
the same world (MPI and torch.distributed are initialised once); rank 0 writes OUT.npz with one flat
float64 array per name, the final global model ``RunResult.x``. One launch for many configs keeps the
MPI start-up cost out of each comparison.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the fedrun of this tree

import fedrun  # noqa: E402
from fedrun.runtime.world import init_world  # noqa: E402


def main() -> None:
    out, spec = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
    world = init_world("cpu")
    try:
        models = {name: fedrun.run(cfg, world=world, write_files=False).x for name, cfg in spec.items()}
        if world.is_root:
            np.savez(out, **{name: np.asarray(x, dtype=np.float64) for name, x in models.items()})
    finally:
        world.close()


if __name__ == "__main__":
    main()
