"""Loading a config: the YAML file read (:mod:`fedrun.config.yaml12`), the overrides applied
(:mod:`fedrun.config.overrides`), the sections built and type-checked (:mod:`fedrun.config.coerce`), the
algorithm's and plugins' own settings resolved and every section's ``check`` run.

Reading a config imports no torch: a built-in algorithm's hyperparameters are in
:mod:`fedrun.config.hparams`; only a plugin algorithm (``package.module:Class``) is imported, for its own.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

from fedrun.config.coerce import build_dataclass
from fedrun.config.hparams import HPARAMS
from fedrun.config.overrides import apply_overrides
from fedrun.config.sections import AlgorithmConfig
from fedrun.config.tree import PLUGIN_SETTINGS, Config
from fedrun.config.yaml12 import MAX_BYTES, YAMLError, parse_yaml
from fedrun.errors import ConfigError, brief
from fedrun.plugins import is_import_path, load


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML file (or start from defaults), apply ``section.key=value`` overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        data = read_config_file(Path(path))
    apply_overrides(data, overrides)
    return config_from_dict(data)


def read_config_file(path: Path) -> dict[str, Any]:
    """The sections of config file ``path`` (YAML 1.2, fedrun.config.yaml12); ConfigError naming the file."""
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, expected a YAML config file")
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        if path.stat().st_size > 4 * MAX_BYTES:  # before reading: at most 4 bytes per character
            raise ConfigError(f"{path.stat().st_size} bytes, more than a config may have ({MAX_BYTES} characters)")
        loaded = parse_yaml(path.read_text())
    except YAMLError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{path}: not valid YAML ({brief(first)[1:-1]})") from None
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config file ({brief(str(exc))[1:-1]})") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    return loaded or {}


def config_from_dict(data: dict[str, Any]) -> Config:
    """Build and validate a :class:`Config`; raises :class:`ConfigError` naming the first bad field.

    Types, ranges and the algorithm's hyperparameters are checked here; the names of the model, dataset,
    partitioner and participation pattern are checked by their registries when the run is built."""
    data = dict(data)
    data.pop("plugins", None)  # derived from the code on the Python path (Config.to_dict), never a setting
    extras = {}
    for section in PLUGIN_SETTINGS:
        if isinstance(data.get(section), dict):
            data[section], extras[section] = _split_settings(section, data[section])
    from fedrun.config.client_count import with_client_count  # h5py only: reading a config needs no torch

    data.update({"data": with_client_count(data["data"])} if "data" in data else {})
    algo_raw = data.pop("algorithm", None) or {}
    if not isinstance(algo_raw, dict):
        raise ConfigError(f"algorithm: expected a mapping, got {brief(algo_raw)}")
    cfg = build_dataclass(Config, data, "")
    algo_raw = dict(algo_raw)
    name = algo_raw.pop("name", "fedavg")
    if not isinstance(name, str) or "\x00" in name:
        raise ConfigError(f"algorithm.name: expected a string, got {brief(name)}")
    hparams = build_dataclass(algorithm_hparams(name), algo_raw, "algorithm")
    cfg.algorithm = AlgorithmConfig(name=name, hparams=hparams)
    for section, key in PLUGIN_SETTINGS.items():
        settings_cls = plugin_settings(getattr(getattr(cfg, section), key), f"{section}.{key}")
        if settings_cls is not None:
            getattr(cfg, section).settings = build_dataclass(settings_cls, extras.get(section, {}), section)
        elif extras.get(section):
            allowed = ", ".join(sorted(f.name for f in dataclasses.fields(getattr(cfg, section)) if f.init))
            raise ConfigError(f"{section}.{sorted(extras[section])[0]}: unknown key (allowed: {allowed})")
    check_all(cfg)
    return cfg


def algorithm_hparams(name: str) -> type:
    """The hyperparameter dataclass of ``algorithm.name``: a built-in's from :data:`HPARAMS` (no torch), a
    plugin's own ``Hparams`` (importing the plugin)."""
    if is_import_path(name):  # its Algorithm base class is checked where the run builds it (fedrun.algorithms)
        def accept(obj: Any) -> bool:
            return isinstance(obj, type) and dataclasses.is_dataclass(getattr(obj, "Hparams", None))

        expected = "a subclass of fedrun.algorithms.base.Algorithm with an Hparams dataclass"
        return load(name, "algorithm.name", expected, accept).Hparams
    if name not in HPARAMS:
        raise ConfigError(f"algorithm.name: unknown algorithm {brief(name)} (known: {', '.join(sorted(HPARAMS))})")
    return HPARAMS[name]


def _split_settings(section: str, raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A model/participation section's own keys, and the others (a plugin's settings, or unknown keys)."""
    own = {f.name for f in dataclasses.fields(typing.get_type_hints(Config)[section]) if f.init}
    return {k: v for k, v in raw.items() if k in own}, {k: v for k, v in raw.items() if k not in own}


def plugin_settings(value: str, field_name: str) -> type | None:
    """The ``Settings`` dataclass of the plugin that config field ``field_name`` names, or None (a built-in
    name, or a plugin without settings)."""
    if not is_import_path(value):
        return None
    settings = getattr(load(value, field_name, "an importable plugin", lambda obj: True), "Settings", None)
    if settings is not None and not (isinstance(settings, type) and dataclasses.is_dataclass(settings)):
        raise ConfigError(f"{field_name}: {value}.Settings is {settings!r}; expected a dataclass of settings")
    return settings


def check_all(obj: Any) -> None:
    """Run ``check()`` of every section, depth first."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            check_all(value)
        elif isinstance(value, AlgorithmConfig) and dataclasses.is_dataclass(value.hparams):
            check_all(value.hparams)
    if hasattr(obj, "check"):
        obj.check()
