"""fedrun: an HPC-native runtime for federated-learning research."""

from fedrun.api import run
from fedrun.config import Config, ConfigError, load_config

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "load_config", "run", "__version__"]
