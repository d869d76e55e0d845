"""A config dataclass built from the mapping read from YAML: unknown keys refused, every value checked
against its field's type (``int``, ``float``, ``str``, ``bool``, ``Literal``, ``list``, ``X | None``, a
nested dataclass), with one line naming the dotted field and what was expected."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal

from fedrun.errors import ConfigError, brief

# Beyond this bound an integer setting is a typo (docs/reliability.md lists the bounds of the settings).
MAX_INT = 2**63 - 1  # every integer setting: it must fit the int64 arrays it ends up in


def build_dataclass(cls: type, data: Any, where: str) -> Any:
    """Recursively build dataclass ``cls`` from a dict, checking keys and value types."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {brief(data)}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"{where or 'config'}: key {brief(key)} is not a name; expected one of "
                              f"{', '.join(sorted(names))}")
    unknown = sorted(set(data) - names)
    if unknown:
        allowed = ", ".join(sorted(names))
        raise ConfigError(f"{_join(where, brief(unknown[0])[1:-1])}: unknown key (allowed: {allowed})")
    kwargs = {}
    for name in names:
        if name in data:
            kwargs[name] = _coerce(hints[name], data[name], _join(where, name))
    obj = cls(**kwargs)
    return obj


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return build_dataclass(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        if type(None) in args and isinstance(value, str) and not value.strip():  # `mlflow: ""`: a value left out
            raise ConfigError(f"{where}: expected {' or '.join(_describe(a) for a in args if a is not type(None))}"
                              f" or null for none, got an empty string")
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, where)
            except ConfigError as exc:
                errors.append(exc)
        expected = " or ".join(_describe(a) for a in args)
        raise ConfigError(f"{where}: expected {expected}, got {brief(value)}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where}: expected one of {', '.join(map(str, args))}, got {brief(value)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {brief(value)}")
        return [_coerce(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {brief(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {brief(value)}")
        if not -MAX_INT - 1 <= value <= MAX_INT:  # beyond int64: every array it reaches would overflow
            raise ConfigError(f"{where}: expected an integer in [-2^63, 2^63), got {brief(value)}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-2" as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {brief(value)}")
        if not math.isfinite(value):  # .inf / .nan / 1e999 would pass every range check below
            raise ConfigError(f"{where}: expected a finite number, got {brief(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {brief(value)}")
        if "\x00" in value:  # no file name, format or registry name holds one; os calls refuse it
            raise ConfigError(f"{where}: expected a string without NUL characters, got {brief(value)}")
        return value
    raise TypeError(f"{where}: unsupported config type {tp!r}")


def _describe(tp: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name
