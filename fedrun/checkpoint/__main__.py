"""``python -m fedrun.checkpoint CKPT.h5``: print a checkpoint's summary (the body of ``fedrun inspect``)."""

import sys

from fedrun.checkpoint import describe_checkpoint
from fedrun.errors import CheckpointError

if len(sys.argv) != 2:
    sys.exit("usage: python -m fedrun.checkpoint CKPT.h5")
try:
    print(describe_checkpoint(sys.argv[1]))
except CheckpointError as e:
    sys.exit(f"error: {e}")
