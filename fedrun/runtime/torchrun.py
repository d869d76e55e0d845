"""``python -m fedrun torchrun ARGS``: torchrun (``torch.distributed.run``, the same arguments) ending with
fedrun's exit statuses and lines instead of torchrun's own.

torchrun's agent takes a Ctrl-C, SIGTERM or SIGHUP for itself: it passes the signal to its workers (which
finish the round, write a checkpoint and exit 75, fedrun.runtime.signals) and then raises
``SignalException``, ending with a 10-frame traceback and status 1. A worker that ends non-zero (75 after a
closed stdout, 2 for bad input) makes it print a failure banner and exit 1. Here the same agent runs in
this process; when it ends on a signal the status is 75 (the workers' line says where the checkpoint is,
or what failed), and when a worker failed, the first failed worker's status, fedrun's line above being
the only one. A worker killed by a signal is named in one line, status 1. torchrun's log lines (up to
its ERROR level: "Received 2 death signal", "failed (exitcode: 75)") are left out (``FEDRUN_DEBUG=1`` keeps
them).
"""

from __future__ import annotations

import logging
import os
import signal

from fedrun.errors import EXIT_FAILURE, EXIT_REQUEUE, report


def main(argv: list[str]) -> int:
    """Run torchrun with ``argv``; fedrun's exit status (see the module docstring)."""
    from torch.distributed import run as torch_run
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if not os.environ.get("FEDRUN_DEBUG"):
        logging.disable(logging.ERROR)  # this process is only the agent; torch sets each of its loggers' levels
    try:
        torch_run.main(argv)
    except SignalException:
        return EXIT_REQUEUE  # the workers had the signal too: they stopped after the round with a checkpoint
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode > 0:
            return failure.exitcode  # fedrun's own line (or the worker's traceback) is above
        name = signal.Signals(-failure.exitcode).name if -failure.exitcode in signal.valid_signals() else "a signal"
        report(f"fedrun: error: torchrun's worker of rank {rank} (pid {failure.pid}) was killed by {name}")
        return EXIT_FAILURE
    return 0
