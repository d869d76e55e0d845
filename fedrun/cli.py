"""Command line: ``python -m fedrun <command> ...``. Argument parsing and error reporting only.

Exit statuses are listed in :mod:`fedrun.errors` (0 ok, 1 failure, 2 bad input, 3 NaN/Inf,
75 stopped by a signal after a checkpoint: requeue; 130 stopped at once by a second Ctrl-C).
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from fedrun.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    ConfigError,
    RunFailure,
    exit_code,
    report,
    report_error,
)


def _launcher_rank() -> int:
    """This process's rank from the launcher's environment, readable before MPI is initialised."""
    if os.environ.get("RANK", "").isdigit() and os.environ.get("WORLD_SIZE"):  # torchrun (fedrun.runtime.launcher)
        return int(os.environ["RANK"])
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    return 0


def _note_repeats(overrides: list[str]) -> None:
    """Print (rank 0, stdout) every setting the command line gives twice: the last value counts."""
    from fedrun.config import repeated_settings

    if _launcher_rank() == 0:
        for note in repeated_settings(overrides):
            print(f"fedrun: set twice on the command line: {note}", flush=True)


def cmd_train(args: argparse.Namespace) -> int:
    from fedrun.errors import command_line_spelling
    from fedrun.runtime.signals import StopSignals

    # messages name --resume auto, not the API's resume="auto"; before torch is imported: a signal during
    # start-up ends it at once (exit status 75, nothing written)
    with command_line_spelling(), StopSignals(announce=_launcher_rank() == 0, starting=True) as signals:
        from fedrun.api import run
        from fedrun.config import load_config

        accept = tuple(k.strip() for k in (args.accept_changes or "").split(",") if k.strip())
        if accept and args.resume is None:
            raise ConfigError("--accept-changes: only with --resume (it accepts changed settings of a resumed run)")
        cfg = load_config(args.config, args.overrides)
        _note_repeats(args.overrides)
        try:
            run(cfg, progress=not args.quiet, resume=args.resume, signals=signals, accept_changes=accept)
        except KeyboardInterrupt:
            if _launcher_rank() == 0:
                report("fedrun: stopped at once by a second Ctrl-C, without a checkpoint of the rounds since the "
                       "last one (the checkpoints written before are intact; resume with --resume auto)")
            return EXIT_INTERRUPTED
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    from fedrun.checkpoint import CheckpointReader, describe_checkpoint, list_checkpoints
    from fedrun.checkpoint.chain import base_of, dependents
    from fedrun.errors import BrokenChain, CheckpointError
    from fedrun.federation.snapshot import check_chain, check_layout, saved_config

    path = Path(args.checkpoint)
    if path.is_dir():  # a run directory: its newest checkpoint, valid or not (a damaged one is what to see)
        found = list_checkpoints(path)
        if not found:
            raise CheckpointError(f"{path}: no checkpoint in this run directory (expected ckpt_*.h5)")
        path = found[-1]
        print(f"{path}: the newest checkpoint of {args.checkpoint}")

    def breaks(link: Path) -> str:  # the checkpoints a damaged file takes down with it
        names = [p.name for p in dependents(link)]
        return f"; it breaks {', '.join(names)}" if names else ""

    try:
        print(describe_checkpoint(path))
    except CheckpointError as exc:
        raise CheckpointError(f"{exc}{breaks(path) if path.is_file() else ''}") from None
    for field, digest in saved_config(path).get("plugins", {}).items():
        print(f"  plugins/{field}: {digest}")  # module:Attr@sha256 of the plugin's source file
    with CheckpointReader(path) as reader:  # a checksum failure is an error (exit status 2)
        try:
            reader.verify()
        except CheckpointError as exc:
            raise CheckpointError(f"{exc} (the listing above marks every failed dataset){breaks(path)}") from None
        check_layout(reader)  # so is a missing or misshapen dataset
        print("  layout: complete (every dataset its manifest lists, with its shape)")
        link = base_of(reader)
        try:
            check_chain(reader)
        except BrokenChain as exc:
            raise CheckpointError(f"{path}: {exc}{breaks(exc.link) if exc.link else ''}") from None
    if link is not None:
        print(f"  chain: an increment, {link['depth']} after a full checkpoint; builds on {link['file']} "
              "(every link opens, is the file it was written on, is complete and verifies)")
    return EXIT_OK


def cmd_checkpoint(args: argparse.Namespace) -> int:
    from fedrun.checkpoint.consolidate import consolidate
    from fedrun.federation.snapshot import check_chain

    out, done, whole = consolidate(args.checkpoint, args.out, check_chain)
    if not whole:
        print(f"wrote {out}: the state after round {done} of {args.checkpoint} as one self-contained checkpoint")
    elif out is None:
        print(f"{args.checkpoint}: already whole (a full checkpoint of round {done}, verified); nothing to "
              "consolidate")
    else:
        print(f"{args.checkpoint}: already whole (a full checkpoint of round {done}); copied to {out}, verified")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    from fedrun.export import export_model

    checkpoint, out, done = export_model(args.run, args.out)
    print(f"saved the global model after round {done} ({checkpoint}) as a state_dict to {out}")
    return EXIT_OK


def cmd_flatness(args: argparse.Namespace) -> int:
    import json

    from fedrun.flatness import format_flatness, measure_flatness

    result = measure_flatness(args.run, examples=args.examples, rho=args.rho, directions=args.directions,
                              max_hvps=args.max_hvps, seed=args.seed)
    print(json.dumps(result.as_dict()) if args.json else format_flatness(result))
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    from fedrun.catalog import format_catalog

    print(format_catalog())
    return EXIT_OK


def cmd_config(args: argparse.Namespace) -> int:
    from fedrun.config import load_config

    cfg = load_config(args.config, args.overrides)
    if args.defaults:
        from fedrun.config.help import format_keys

        print(format_keys(cfg))
    else:
        print(cfg.to_yaml(), end="")
    return EXIT_OK


def cmd_participation(args: argparse.Namespace) -> int:
    from fedrun.config import load_config
    from fedrun.federation.participation import make_participation
    from fedrun.federation.participation_stats import describe, format_description, save_participation_png

    cfg = load_config(args.config, args.overrides)
    _note_repeats(args.overrides)
    rounds = args.rounds or cfg.run.rounds
    pattern = make_participation(cfg.participation, cfg.data.num_clients, cfg.run.seed, rounds)
    print(format_description(describe(pattern, rounds)))
    if args.png:
        print(f"saved {save_participation_png(pattern, rounds, args.png)}")
    return EXIT_OK


def cmd_data(args: argparse.Namespace) -> int:
    from fedrun.config import load_config
    from fedrun.data.stats import describe_data, format_partition_stats, save_partition_png
    from fedrun.errors import DataError

    cfg = load_config(args.config, args.overrides)
    _note_repeats(args.overrides)
    stats, _, counts = describe_data(cfg)
    print(format_partition_stats(stats))
    if args.png:
        if counts is None:
            raise DataError(f"--png: dataset {stats['dataset']} has no class labels to draw")
        title = (f"{stats['dataset']}, {cfg.data.partition}, {stats['clients']} clients "
                 f"(seed {cfg.run.seed})")
        print(f"saved {save_partition_png(counts, args.png, title)}")
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from fedrun.compare import compare_runs

    lines, identical = compare_runs(Path(args.run_a), Path(args.run_b))
    print("\n".join(lines))
    return EXIT_OK if identical else EXIT_FAILURE


def cmd_reproduce(args: argparse.Namespace) -> int:
    from fedrun.reproduce import reproduce

    return reproduce(args)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "reproduce": cmd_reproduce,
    "compare": cmd_compare,
    "train": cmd_train,
    "participation": cmd_participation,
    "data": cmd_data,
    "inspect": cmd_inspect,
    "export": cmd_export,
    "checkpoint": cmd_checkpoint,
    "flatness": cmd_flatness,
    "list": cmd_list,
    "config": cmd_config,
}


class _Parser(argparse.ArgumentParser):
    """argparse with the one-line error of every other bad input (no usage block), exit status 2."""

    def error(self, message: str):
        if _launcher_rank() == 0:
            report(f"{self.prog}: error: {message} (see {self.prog} --help)")
        sys.exit(EXIT_BAD_INPUT)


DESCRIPTION = """\
fedrun runs federated-learning experiments: simulated clients on MPI ranks (or one process), an algorithm
from `fedrun list` or your own plugin, checkpoints you can resume bit for bit.

  fedrun train --config configs/quickstart.yaml local.lr=0.02     one run (mpiexec -n 2 ... for 2 ranks)
  fedrun train --config ... --resume auto                         continue a stopped run
  fedrun list                                                     algorithms, patterns, models, datasets
  fedrun config --defaults                                        every config key, its default, its meaning
  fedrun export runs/quickstart --out model.pt                    the trained model as a state_dict
  fedrun flatness runs/quickstart                                 top Hessian eigenvalue, loss under perturbation
  fedrun reproduce fig1a-faster-r25/P1/FedSUM-vs-FedAvg --print   the commands behind a row of the results

Ctrl-C (like SIGTERM) stops after the current round with a checkpoint (exit status 75); a second Ctrl-C
stops at once (130). Exit statuses: 0 ok, 1 failure, 2 bad input, 3 NaN/Inf."""


def _count(text: str) -> int:
    """An integer >= 1 (argparse type: a bad value is the parser's one-line error)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def _seed(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


def _radius(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


class _Once(argparse.Action):
    """An option that may be given once: a second ``--config`` would silently replace the first."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string} given twice ({getattr(namespace, self.dest)} and {values}); "
                         "expected one")
        setattr(namespace, self.dest, values)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fedrun", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("train", help="run one federated training job (under mpiexec/srun/torchrun for several ranks)")
    p.add_argument("--config", action=_Once, help="YAML config file (defaults apply to missing keys)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--resume", metavar="auto|PATH", action=_Once,
                   help="continue from the newest valid checkpoint of run.dir (auto; a fresh run when there is "
                        "none) or from PATH; a finished run says so and exits 0")
    p.add_argument("--accept-changes", metavar="KEY[,KEY...]",
                   help="with --resume: accept these changed settings that define the trajectory "
                        "(e.g. local.lr); recorded in config_history.jsonl")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. local.lr=0.01")
    p = sub.add_parser("participation", help="statistics of a participation pattern, without training")
    p.add_argument("--config", action=_Once, help="YAML config file")
    p.add_argument("--rounds", type=int, help="rounds to simulate (default run.rounds)")
    p.add_argument("--png", help="save a clients x rounds picture of who participated when")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. participation.pattern=p3")
    sub.add_parser("sweep", help="run a sweep file as a Slurm job array via submitit (fedrun sweep --help)")
    sub.add_parser("report", help="tables and plots of a sweep directory or one run directory (fedrun report --help)")
    sub.add_parser("torchrun", help="torchrun's arguments, ending with fedrun's exit statuses: 75 after Ctrl-C, no "
                   "torchrun traceback (docs/reliability.md)")
    p = sub.add_parser("data", help="per-client statistics of the data partition, without training")
    p.add_argument("--config", action=_Once, help="YAML config file")
    p.add_argument("--png", help="save the per-client label distribution (stacked bars and a bubble chart)")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. data.partition=shards")
    p = sub.add_parser("inspect", help="describe a checkpoint file and verify its checksums")
    p.add_argument("checkpoint", help="a ckpt_*.h5 file, or a run directory (its newest checkpoint)")
    p = sub.add_parser("checkpoint", help="work on checkpoint files: consolidate a chain of incremental "
                                          "checkpoints into one self-contained file",
                       description="fedrun checkpoint consolidate CKPT --out FILE: write the state of CKPT, an "
                                   "incremental checkpoint and the files it builds on, as one self-contained full "
                                   "checkpoint FILE, for archiving or moving a run; FILE resumes with --resume "
                                   "FILE from any directory. A full CKPT is whole already: one line says so, and "
                                   "--out FILE is a verified copy. Every link is verified; on bad input one "
                                   "line, exit status 2, and no FILE.")
    p.add_argument("action", choices=["consolidate"], help="consolidate: one self-contained checkpoint")
    p.add_argument("checkpoint", help="a ckpt_*.h5 file (an increment: its links must be in the same directory)")
    p.add_argument("--out", help="the checkpoint file to write (must not exist; needed for an increment)")
    p = sub.add_parser("compare", help="where two runs part: the first differing round and entries, the configs' "
                                       "differences (exit 0: identical, 1: they differ)")
    p.add_argument("run_a", help="a run directory")
    p.add_argument("run_b", help="another run directory")
    p = sub.add_parser("export", help="write a run's trained global model as a PyTorch state_dict file")
    p.add_argument("run", help="a run directory (its newest valid checkpoint) or a ckpt_*.h5 file")
    p.add_argument("--out", required=True, help="the state_dict file to write, e.g. model.pt "
                                                "(load it with module.load_state_dict(torch.load(path)))")
    p = sub.add_parser("flatness", help="sharpness of a run's trained model: top Hessian eigenvalue of the training "
                                        "loss, loss increase under random perturbations, train and test accuracy")
    p.add_argument("run", help="a run directory (its newest valid checkpoint) or a ckpt_*.h5 file")
    p.add_argument("--examples", type=_count, default=2000, metavar="N",
                   help="training examples drawn uniformly across all clients (default 2000)")
    p.add_argument("--rho", type=_radius, nargs="+", default=[0.01, 0.05, 0.1], metavar="RHO",
                   help="radii of the antithetic perturbations x +- rho d, d a filter-normalized random direction "
                        "(default 0.01 0.05 0.1)")
    p.add_argument("--directions", type=_count, default=10, metavar="M",
                   help="random directions d per radius (default 10)")
    p.add_argument("--max-hvps", "--iterations", dest="max_hvps", type=_count, default=200, metavar="K",
                   help="about the most Hessian-vector products Lanczos may use for the top eigenvalue (default "
                        "200); its residual is checked against 1e-3 and reported")
    p.add_argument("--seed", type=_seed, default=0, metavar="S", help="seed of the sample, the start vector "
                                                                       "and the directions (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    from fedrun.reproduce import add_arguments

    add_arguments(sub.add_parser("reproduce", help="rerun the runs behind one row of docs/results/claims.json "
                                                   "and compare them with their records, or --print the commands"))
    sub.add_parser("list", help="the built-in algorithms, participation patterns, models and datasets")
    p = sub.add_parser("config", help="print the resolved config, or with --defaults every key and what it means")
    p.add_argument("--config", help="YAML config file (default: the defaults)")
    p.add_argument("--defaults", action="store_true",
                   help="one line per key: key, value (the default unless --config/overrides change it), meaning")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. algorithm.name=fedadam "
                                                "(shows that algorithm's own keys)")
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse the command line; ``section.key=value`` overrides may stand anywhere after the command (also
    after options such as ``--quiet``), anything else unknown is an error."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    misplaced = [a for a in extra if "=" in a and not a.startswith("-")]
    unknown = [a for a in extra if a not in misplaced]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if misplaced:
        if not hasattr(args, "overrides"):
            parser.error(f"fedrun {args.command} takes no section.key=value overrides: {' '.join(misplaced)}")
        args.overrides = [*args.overrides, *misplaced]
    return args


def _delegated(name: str) -> Callable[[list[str]], int]:
    """Commands with their own argument parsers (fedrun.sweep; torchrun's, fedrun.runtime.torchrun)."""
    if name == "torchrun":
        from fedrun.runtime import torchrun

        return torchrun.main
    from fedrun.sweep import report_main, sweep_main

    return {"sweep": sweep_main, "report": report_main}[name]


DELEGATED = ("sweep", "report", "torchrun")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # torch's C++ log lines (a refused rendezvous connection prints a 30-line stack per retry) would bury
    # fedrun's one line; the failures they describe reach fedrun as exceptions. TORCH_CPP_LOG_LEVEL=INFO
    # shows them again (read when torch is first imported, below)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    try:
        if argv[:1] and argv[0] in DELEGATED:
            code = _delegated(argv[0])(argv[1:])
        else:
            code = COMMANDS[(args := parse(argv)).command](args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
        return code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (fedrun inspect ... | head -1): nothing more to say
        _quiet_stdout()
        return EXIT_OK
    except Exception as exc:
        code = exit_code(exc)
        if _launcher_rank() == 0:
            report_error(exc)
            if (code == EXIT_FAILURE and not isinstance(exc, RunFailure)) or os.environ.get("FEDRUN_DEBUG"):
                traceback.print_exc()
        return code


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that Python's flush at exit does not raise into a closed pipe again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError as exc:
        if exc.errno != errno.EBADF:
            raise


if __name__ == "__main__":
    sys.exit(main())
