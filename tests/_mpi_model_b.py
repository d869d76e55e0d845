"""Run several configs in one (possibly multi-rank) launch; rank 0 saves every final model.

    mpiexec -n 2 python tests/_mpi_model_b.py configs.json out.npz

``configs.json`` maps a name to a config dict; ``out.npz`` gets one flat array ``result.x`` per name.
(The algos-a branch writes tests/mpi_run_model.py for the same purpose; the two can be merged.)
"""

from __future__ import annotations

import json
import sys

import numpy as np

import fedrun
from fedrun.runtime.world import init_world


def main(config_path: str, out_path: str) -> None:
    with open(config_path) as fh:
        configs = json.load(fh)
    world = init_world("cpu")
    results = {name: fedrun.run(cfg, world=world, write_files=False).x for name, cfg in configs.items()}
    if world.is_root:
        np.savez(out_path, **results)
    world.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
