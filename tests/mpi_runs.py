"""Run several training runs, files written and resumes included, in one launch; record what each printed.

usage: [mpiexec -n R] python tests/mpi_runs.py SPEC.json OUT_DIR

SPEC.json is a list of ``{"name": ..., "overrides": [...], "resume": null | "auto" | PATH}``; the runs go one
after another on the same world (each launch costs seconds of imports, so batch them), each as
``fedrun.run(overrides, resume=...)`` with its files written. Rank 0 writes ``OUT_DIR/<name>.out``: the run's
stdout, and a last line ``error: <message>`` when it raised a fedrun error (a refused resume).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import fedrun
from fedrun.errors import CheckpointError, ConfigError
from fedrun.runtime.world import init_world


def main(spec_path: str, out_dir: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    world = init_world("cpu")
    try:
        for run in spec:
            text = io.StringIO()
            with contextlib.redirect_stdout(text):
                try:
                    fedrun.run({}, run["overrides"], world=world, progress=True, resume=run["resume"])
                except (CheckpointError, ConfigError) as exc:
                    print(f"error: {exc}")
            if world.is_root:
                (Path(out_dir) / f"{run['name']}.out").write_text(text.getvalue())
    finally:
        world.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
