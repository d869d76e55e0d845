"""Train in this process and SIGKILL it in the middle of writing one checkpoint (its ``.tmp`` half written).

usage: python tests/kill_in_write.py ROUND OVERRIDES...

The checkpoint of ROUND dies at its first write of client rows: the moment the writer has created the
temporary file and streams the rows into it. A real SIGKILL, at a fixed point, so the test is deterministic.
"""

from __future__ import annotations

import os
import signal
import sys

import fedrun
from fedrun.checkpoint.writer import CheckpointWriter

ROUND = int(sys.argv[1])
_write_rows = CheckpointWriter.write_rows


def write_rows_then_die(self: CheckpointWriter, path: str, start: int, rows) -> None:
    _write_rows(self, path, start, rows)
    if self.round == ROUND and path.startswith("clients/"):
        os.kill(os.getpid(), signal.SIGKILL)


CheckpointWriter.write_rows = write_rows_then_die
fedrun.run({}, sys.argv[2:])
