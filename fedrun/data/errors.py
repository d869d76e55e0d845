"""The one exception type of the dataset readers."""

from __future__ import annotations


class DataError(ValueError):
    """A dataset file or directory is missing, corrupt or not in the expected format.

    The message is one line naming the file (or the expected paths) and what was expected, so that a
    user can fix the data root without reading a traceback. Line breaks in the message (for instance
    from a wrapped library error) are replaced by spaces.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).splitlines()))
