"""Typed run configuration: a dataclass tree loaded from YAML plus dotted overrides.

Every field has a type and a default; loading checks types, rejects unknown keys and runs each
section's ``check`` so that a bad value fails before any rank starts training, with one line that
names the field (``local.lr: expected a number > 0, got -1``).

The ``algorithm`` section is open-ended: ``name`` selects an algorithm (a registered name or a plugin's
``package.module:Class``) and the remaining keys are validated against that algorithm's own ``Hparams``
dataclass (see ``fedrun.algorithms``). The algorithm is resolved only then, inside
:func:`config_from_dict`: importing this package imports neither torch nor any algorithm.

One concept a module; the names below are the package's interface (``from fedrun.config import Config,
load_config``):

* :mod:`fedrun.config.sections`: the sections (``run``, ``model``, ``local``, ``participation``, ...);
  :mod:`fedrun.config.data` the ``data`` section; :mod:`fedrun.privacy.config` the ``privacy`` section;
* :mod:`fedrun.config.tree`: :class:`Config`, every section together, and its resolved dict;
* :mod:`fedrun.config.loading`: :func:`load_config` and :func:`config_from_dict`;
* :mod:`fedrun.config.yaml12`: the YAML 1.2 reading, bounded; :mod:`fedrun.config.overrides`: dotted
  overrides; :mod:`fedrun.config.coerce`: a dataclass built from a mapping, type by type;
* :mod:`fedrun.config.client_count`: ``data.num_clients`` of a ``federated_h5`` file;
  :mod:`fedrun.config.help`: ``fedrun config --defaults``.
"""

from __future__ import annotations

from fedrun.config.coerce import build_dataclass
from fedrun.config.data import (
    DataConfig,
    FederatedH5Config,
    LeastSquaresConfig,
    SyntheticConfig,
    SyntheticFedproxConfig,
)
from fedrun.config.loading import config_from_dict, load_config, read_config_file
from fedrun.config.overrides import apply_override, apply_overrides, repeated_settings
from fedrun.config.sections import (
    AlgorithmConfig,
    AsyncConfig,
    CheckpointConfig,
    CorruptionConfig,
    EvalConfig,
    LocalConfig,
    MetricsConfig,
    ModelConfig,
    ParticipationConfig,
    RunConfig,
    StateConfig,
)
from fedrun.config.tree import Config
from fedrun.privacy.config import PrivacyConfig

__all__ = ["AlgorithmConfig", "AsyncConfig", "CheckpointConfig", "Config", "CorruptionConfig", "DataConfig",
           "EvalConfig", "FederatedH5Config", "LeastSquaresConfig", "LocalConfig", "MetricsConfig", "ModelConfig",
           "ParticipationConfig", "PrivacyConfig", "RunConfig", "StateConfig", "SyntheticConfig",
           "SyntheticFedproxConfig", "apply_override", "apply_overrides", "build_dataclass", "config_from_dict",
           "load_config", "read_config_file", "repeated_settings"]
