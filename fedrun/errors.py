"""The ground floor: every error type, the exit statuses and the validation helper. Imports nothing of fedrun.

Exit status: 0 success; 1 runtime failure (one line naming the rank and cause); 2 bad input (config,
data file, checkpoint); 3 numerical failure (NaN/Inf; the last checkpoint is kept); 75 stopped by
SIGTERM/SIGUSR1/SIGINT (Ctrl-C) after writing a checkpoint (the scheduler may requeue the job); 130 stopped
at once by a second Ctrl-C (no new checkpoint).

Every message is meant to be read as one line: it names the field or file and what was expected.
"""

from __future__ import annotations

import errno
import os
import pickle
import reprlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_NUMERICAL, EXIT_REQUEUE = 0, 1, 2, 3, 75
EXIT_INTERRUPTED = 130  # a second Ctrl-C: stopped at once, no new checkpoint (the shell's 128 + SIGINT)


class _OneLine:
    """Mixin: line breaks in the message (for instance from a wrapped library error) become spaces."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))  # type: ignore[call-arg]


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and what was expected."""


class RuleContractError(ConfigError):
    """An algorithm rule's result does not match its declaration (fedrun.algorithms.contract; exit status 2:
    the plugin, or the built-in, is bad input)."""


class DataError(_OneLine, ValueError):
    """A dataset file or directory is missing, corrupt or not in the expected format.

    The message names the file (or the expected paths) and what was expected, so that a user can fix
    the data root without reading a traceback.
    """


class NotUnderstood(Exception):
    """Bytes of an HDF5 file in a layout fedrun's own header reader (fedrun/hdf5/headers.py) does not fully
    understand: not an error the user sees, the caller asks HDF5 instead, whose path gives any line."""


class CheckpointError(_OneLine, Exception):
    """Any problem writing, opening, reading or verifying a checkpoint."""


class BrokenChain(CheckpointError):
    """A link an incremental checkpoint builds on is missing, unreadable, damaged or replaced; ``link`` is its
    path (fedrun.checkpoint.chain)."""

    def __init__(self, message: str, link: Path | None = None) -> None:
        super().__init__(message)
        self.link = link


class SweepError(ValueError):
    """The sweep file is invalid; the message names the key."""


class SweepTaskError(SweepError):
    """One or more tasks of a sweep are invalid; ``lines`` holds one line per bad task."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


class UnsafePickleError(pickle.UnpicklingError):
    """A pickled dataset file asked for a global outside the allow-list."""


class LaunchError(RuntimeError):
    """The launcher environment is inconsistent (one line naming the variable)."""


class NumericalError(RuntimeError):
    """The global model or a client's upload became NaN or Inf."""


class RunFailure(RuntimeError):
    """A runtime failure that its one-line message explains fully (exit status 1, no traceback)."""


class StorageFailure(RunFailure):
    """A file system failed the run under a rank's own files (its client state on a full disk, a quota, an I/O
    error). Ranks that share the disk meet it alike at the same point, so, as with bad input, the job reports it
    once (fedrun.runtime.failures.FailureGuard)."""


class CheckpointWriteError(RunFailure):
    """Rank 0 could not write a checkpoint (full disk, quota, unwritable run directory).

    Every rank raises it after the same broadcast; the checkpoints written before are left intact.
    """


# OS errors of a file system that fails the run, not of a path the user chose: exit status 1
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS)


@contextmanager
def writing(path: Any) -> Iterator[None]:
    """Turn an OS error while writing the run-directory file ``path`` (full disk, quota, read-only or removed
    directory) into a one-line :class:`RunFailure` naming the file and the error (exit status 1)."""
    try:
        yield
    except OSError as exc:
        raise RunFailure(f"cannot write {path}: {exc.strerror or exc}; the checkpoints written before are "
                         "intact") from None


_COMMAND_LINE = [False]  # inside ``fedrun train``: messages spell arguments as its flags


@contextmanager
def command_line_spelling() -> Iterator[None]:
    """While inside, :func:`argument` spells arguments as ``fedrun train``'s flags (the CLI's train command
    runs in it; a notebook calling the CLI's main and then ``fedrun.run`` gets each its own spelling)."""
    before, _COMMAND_LINE[0] = _COMMAND_LINE[0], True
    try:
        yield
    finally:
        _COMMAND_LINE[0] = before


def argument(name: str, value: str | tuple[str, ...] | None = None) -> str:
    """How the user gives argument ``name`` (``resume``, ``accept_changes``) with ``value`` where they called
    fedrun: ``--resume auto`` on the command line, ``resume="auto"`` to ``fedrun.run`` (the Python API)."""
    if _COMMAND_LINE[0]:
        flag = "--" + name.replace("_", "-")
        return flag if value is None else f"{flag} {value if isinstance(value, str) else ','.join(value)}"
    if value is None:
        return name
    if isinstance(value, str):
        return f'{name}="{value}"'
    return f"{name}=({', '.join(f'{v!r}'.replace(chr(39), chr(34)) for v in value)},)"


class RunInterrupted(Exception):
    """A stop signal arrived; the run wrote a checkpoint and can be resumed (exit status 75)."""


class EvaluationStopped(Exception):
    """A stop request reached a rank during an evaluation; every rank raises it between the same windows of
    clients (fedrun.federation.client_eval), and the run stops after the round with its checkpoint."""


class StartupInterrupted(Exception):
    """A stop signal arrived during start-up, before round 1: nothing was written (exit status 75). Raised
    where one rank is, so the ranks do not leave together: the job is ended from the rank that has it."""


def on_every_rank(exc: BaseException) -> BaseException:
    """Mark ``exc`` as raised by every rank at the same point (after a broadcast of the same decision):
    the ranks then leave together and rank 0 reports it once, instead of each rank aborting the job."""
    exc.on_every_rank = True  # type: ignore[attr-defined]
    return exc


def raised_on_every_rank(exc: BaseException) -> bool:
    return isinstance(exc, (RunInterrupted, NumericalError, CheckpointWriteError)) or getattr(
        exc, "on_every_rank", False)


def report(line: str) -> None:
    """Write one line to stderr in one write and flush it: lines of several ranks sharing the launcher's pipe
    never run together."""
    try:
        # a library's message cut inside a UTF-8 sequence decodes to lone surrogates: dropped. Anything else
        # beyond ASCII is written as a backslash escape: mpiexec.gforker cuts a line at its first non-ASCII
        # byte, newline included (gloo's "GLHF! \U0001f596" lost the rest of the line and its end)
        text = " ".join(line.split()).encode("utf-8", "ignore").decode("utf-8")
        sys.stderr.write(text.encode("ascii", "backslashreplace").decode("ascii") + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed: nothing left to tell
        pass


def report_error(exc: BaseException) -> None:
    """fedrun's one line for ``exc`` (``fedrun: error: ...``), written once however many places try: an
    error every rank raised is reported by rank 0 before the ranks leave together, and again nowhere."""
    if getattr(exc, "reported", False):
        return
    stopped = isinstance(exc, (RunInterrupted, StartupInterrupted))  # asked for: not an error
    report(f"fedrun: {'' if stopped else 'error: '}{one_line(exc)}")
    exc.reported = True  # type: ignore[attr-defined]


def exit_code(exc: BaseException) -> int:
    if isinstance(exc, (RunInterrupted, StartupInterrupted)):
        return EXIT_REQUEUE
    if isinstance(exc, (ConfigError, DataError, CheckpointError, LaunchError)):
        return EXIT_BAD_INPUT
    if isinstance(exc, NumericalError):
        return EXIT_NUMERICAL
    return EXIT_FAILURE


def one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


_BRIEF = reprlib.Repr()
_BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlong = 80, 80, 40
_BRIEF.maxlist = _BRIEF.maxtuple = _BRIEF.maxdict = _BRIEF.maxset = 6
_BRIEF.maxlevel = 2
BRIEF_CHARS = 100


def brief(value: Any) -> str:
    """``repr(value)`` cut to about 80 characters, computed without rendering the whole value: an error
    message about a huge or deeply aliased config value (``run.name: [[...]] x 10^9``) costs what its
    first few items cost, never the value's size (reprlib: at most 6 items per level, 2 levels, then
    cut to BRIEF_CHARS characters)."""
    text = _BRIEF.repr(value)
    return text if len(text) <= BRIEF_CHARS else text[:BRIEF_CHARS - 3] + "..."


def require(ok: bool, name: str, expected: str, got: Any) -> None:
    """Raise ``ConfigError("name: expected ..., got ...")`` unless ``ok``; used by every ``check``."""
    if not ok:
        raise ConfigError(f"{name}: expected {expected}, got {brief(got)}")


PATH_MAX, NAME_MAX = 4096, 255  # Linux's bounds on a path and on one of its names, in bytes


def require_path(name: str, value: str) -> None:
    """Refuse a path the operating system would refuse later with a traceback (``File name too long``):
    more than PATH_MAX bytes in all, or a name between slashes over NAME_MAX bytes; and a leading ``~user``
    of no user here, which ``expanduser`` leaves as it is (a folder ``~user`` made in the working directory)."""
    head = value.split("/", 1)[0]
    require(not head.startswith("~") or os.path.expanduser(head) != head, name, f"a path whose leading {head} "
            "expands (~ or ~user of a user of this machine)", value)
    raw = value.encode("utf-8", "surrogateescape")
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    require(len(raw) < PATH_MAX and longest <= NAME_MAX, name, f"a path of at most {PATH_MAX - 1} bytes whose "
            f"names are at most {NAME_MAX} bytes each ({len(raw)} bytes, longest name {longest})", value)


def require_file(path: str | Path, expected: str, error: type[Exception] = DataError) -> Path:
    """``path`` as a Path if it is a regular file; else ``error`` naming it: a directory and a missing file
    each get their own line (``expected`` says what the file should be, e.g. "a .npz archive")."""
    p = Path(path)
    if p.is_dir():
        raise error(f"{p}: is a directory, expected {expected}")
    if not p.is_file():
        raise error(f"{p}: file not found (expected {expected})")
    return p
