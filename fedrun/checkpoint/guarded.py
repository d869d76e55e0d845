"""The writer's file object: write errors are recorded instead of reaching HDF5."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class GuardedFile:
    """The writer's file, handed to HDF5 as a Python file object.

    A failed write(2) (full disk, quota, EFBIG) is recorded here and hidden from HDF5, which then
    finishes and closes normally; the writer raises the recorded error and deletes the file. This
    matters: after a write error inside HDF5, closing the file can crash the process (seen with
    h5py 3.16 / HDF5 2.0), and an error could otherwise surface only at close, rounds later.
    """

    def __init__(self, path: Path) -> None:
        self._f = open(path, "w+b", buffering=0)  # closed by close()
        self.error: OSError | None = None

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._f.seek(pos, whence)

    def tell(self) -> int:
        return self._f.tell()

    def read(self, n: int = -1) -> bytes:
        return self._f.read(n)

    def readinto(self, buf: Any) -> int:
        return self._f.readinto(buf)

    def write(self, buf: Any) -> int:
        view = memoryview(buf).cast("B")
        if self.error is None:
            try:
                done = 0
                while done < len(view):
                    done += self._f.write(view[done:])
            except OSError as e:
                self.error = e
        return len(view)

    def truncate(self, size: int | None = None) -> int:
        if self.error is None:
            try:
                return self._f.truncate(size)
            except OSError as e:
                self.error = e
        return self._f.tell() if size is None else size

    def flush(self) -> None:
        pass

    def fsync(self) -> None:
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()
