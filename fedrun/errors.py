"""Exit statuses and one-line error messages shared by the CLI and the API.

Exit status: 0 success; 1 runtime failure (one line naming the rank and cause); 2 bad input (config,
data file, checkpoint); 3 numerical failure (NaN/Inf; the last checkpoint is kept); 75 stopped by
SIGTERM/SIGUSR1 after writing a checkpoint (the scheduler may requeue the job).
"""

from __future__ import annotations

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_NUMERICAL, EXIT_REQUEUE = 0, 1, 2, 3, 75


class NumericalError(RuntimeError):
    """The global model or a client's upload became NaN or Inf."""


class RunFailure(RuntimeError):
    """A runtime failure that its one-line message explains fully (exit status 1, no traceback)."""


class CheckpointWriteError(RunFailure):
    """Rank 0 could not write a checkpoint (full disk, quota, unwritable run directory).

    Every rank raises it after the same broadcast; the checkpoints written before are left intact.
    """


class RunInterrupted(Exception):
    """A stop signal arrived; the run wrote a checkpoint and can be resumed (exit status 75)."""


def exit_code(exc: BaseException) -> int:
    from fedrun.checkpoint import CheckpointError
    from fedrun.config import ConfigError
    from fedrun.data.errors import DataError

    if isinstance(exc, RunInterrupted):
        return EXIT_REQUEUE
    if isinstance(exc, (ConfigError, DataError, CheckpointError)):
        return EXIT_BAD_INPUT
    if isinstance(exc, NumericalError):
        return EXIT_NUMERICAL
    return EXIT_FAILURE


def one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
