"""Command line: ``python -m fedrun <command> ...``. Argument parsing and error reporting only.

Exit status: 0 success; 1 runtime failure (one line naming the rank and cause); 2 bad input (config,
data file, checkpoint); 3 numerical failure (NaN/Inf; the last checkpoint is kept); 75 stopped by
SIGTERM/SIGUSR1 after writing a checkpoint (the scheduler may requeue the job).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_NUMERICAL, EXIT_REQUEUE = 0, 1, 2, 3, 75


def _launcher_rank() -> int:
    """This process's rank from the launcher's environment, before MPI is initialised."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


def _say(message: str, rank: int | None = None) -> None:
    prefix = "fedrun" if rank is None else f"fedrun[rank {rank}]"
    print(f"{prefix}: error: {message}", file=sys.stderr, flush=True)


def cmd_train(args: argparse.Namespace) -> int:
    from fedrun.config import load_config
    from fedrun.federation.loop import train
    from fedrun.runtime.world import init_world

    cfg = load_config(args.config, args.overrides)
    world = init_world(cfg.run.device, cfg.run.timeout_s)
    try:
        run_dir = cfg.run_dir()
        if world.is_root:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.yaml").write_text(cfg.to_yaml())
            print(f"fedrun: {cfg.algorithm.name} on {cfg.data.name}, {cfg.data.num_clients} clients, "
                  f"{world.size} rank(s) on {world.device}, run dir {run_dir}", flush=True)
        result = train(cfg, world, run_dir, progress=not args.quiet)
        if world.is_root:
            _write_result(run_dir, result.metrics)
        return EXIT_OK
    except BaseException as exc:
        if world.size > 1 and not isinstance(exc, SystemExit):
            code = _exit_code(exc)
            _say(_one_line(exc), world.rank)
            sys.stderr.flush()
            world.abort(code)
        raise
    finally:
        world.close()


def _write_result(run_dir, metrics: list[dict]) -> None:
    import json

    final = dict(metrics[-1]) if metrics else {}
    for entry in reversed(metrics):
        if "test_loss" in entry:
            final.update({k: v for k, v in entry.items() if k.startswith("test_")})
            break
    (run_dir / "result.json").write_text(json.dumps(final, indent=1) + "\n")


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {"train": cmd_train}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedrun", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="run one federated training job (under mpiexec/srun for several ranks)")
    p.add_argument("--config", help="YAML config file (defaults apply to missing keys)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. local.lr=0.01")
    return parser


def _exit_code(exc: BaseException) -> int:
    from fedrun.config import ConfigError
    from fedrun.data.errors import DataError
    from fedrun.federation.loop import NumericalError

    if isinstance(exc, (ConfigError, DataError)):
        return EXIT_BAD_INPUT
    if isinstance(exc, NumericalError):
        return EXIT_NUMERICAL
    return EXIT_FAILURE


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{text[0] if text else type(exc).__name__}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        code = _exit_code(exc)
        if _launcher_rank() == 0:
            _say(_one_line(exc))
            if code == EXIT_FAILURE or os.environ.get("FEDRUN_DEBUG"):
                traceback.print_exc()
        return code


if __name__ == "__main__":
    sys.exit(main())
