"""Run fedrun in this process (or as one rank of an mpiexec launch) and save the final model.

usage: python tests/run_model.py OUT.npy [--config FILE] [section.key=value ...]
"""

import sys

import numpy as np

import fedrun


def main() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    config = None
    if args[:1] == ["--config"]:
        config, args = args[1], args[2:]
    result = fedrun.run(config if config else {}, overrides=args, write_files=False)
    if result.rank == 0:
        np.save(out, result.x)


if __name__ == "__main__":
    main()
