"""Run several configs in one launch (one process, or every rank of ``mpiexec -n R``); save the final models.

usage: [mpiexec -n R] python tests/mpi_models.py SPEC.json OUT.npz

SPEC.json maps a name to a config dict (the form ``fedrun.run`` takes). Every config runs in turn on the
same world: MPI and torch.distributed start once, and each launch costs seconds of imports, so batch the
configs. The world's device is the configs' ``run.device`` (they must agree). Rank 0 writes OUT.npz with
one array per name: the final global model ``RunResult.x``, in the run's dtype.
Tests call it through ``helpers.final_models``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import fedrun
from fedrun.config import config_from_dict
from fedrun.runtime.world import init_world


def main(spec_path: str, out_path: str) -> None:
    configs = {name: config_from_dict(c) for name, c in json.loads(Path(spec_path).read_text()).items()}
    devices = {c.run.device for c in configs.values()}
    if len(devices) != 1:
        raise SystemExit(f"mpi_models.py: one launch needs one run.device, got {sorted(devices)}")
    world = init_world(devices.pop())
    try:
        models = {name: fedrun.run(c, world=world, write_files=False).x for name, c in configs.items()}
        if world.is_root:
            np.savez(out_path, **models)
    finally:
        world.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
