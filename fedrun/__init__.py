"""fedrun: an HPC-native runtime for federated-learning research.

``fedrun.run(config)`` is imported lazily, so that ``python -m fedrun`` can install its stop-signal
handlers before torch is imported (a SIGUSR1 during start-up then still leads to a checkpoint).
"""

from __future__ import annotations

from typing import Any

from fedrun.config import Config, ConfigError, load_config

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "load_config", "run", "__version__"]


def run(*args: Any, **kwargs: Any) -> Any:
    """See :func:`fedrun.api.run`."""
    from fedrun.api import run as _run

    return _run(*args, **kwargs)
