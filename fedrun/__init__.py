"""fedrun: an HPC-native runtime for federated-learning research.

``fedrun.run(config, overrides=(), progress=False, callback=None, ...) -> RunResult`` runs one experiment
(:func:`fedrun.api.run`). The package imports nothing heavy at first: ``fedrun.run`` and the config names
are loaded on first use, so that ``python -m fedrun`` installs its stop-signal handlers before torch is
imported (a SIGUSR1 during start-up then still leads to a checkpoint), and ``fedrun.models`` imports with
torch alone.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "RunResult", "load_config", "run", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("run", "RunResult"):  # the real function and class, with their signatures and docstrings
        from fedrun import api

        return getattr(api, name)
    if name == "ConfigError":
        from fedrun.errors import ConfigError

        return ConfigError
    if name in ("Config", "load_config"):
        from fedrun import config

        return getattr(config, name)
    raise AttributeError(f"module 'fedrun' has no attribute {name!r}")
