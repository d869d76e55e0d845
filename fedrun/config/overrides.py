"""Dotted overrides (``section.key=value``, the value read as YAML) applied to the mapping of a config file,
and the settings a command line gives twice."""

from __future__ import annotations

from typing import Any

from fedrun.config.tree import SECTIONS
from fedrun.config.yaml12 import YAMLError, parse_yaml
from fedrun.errors import ConfigError, brief


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> None:
    """Apply ``overrides`` in order (:func:`apply_override`): a setting given twice takes the last value,
    as in a shell's repeated assignments (:func:`repeated_settings` lists them for the command line to
    print)."""
    for item in overrides:
        apply_override(data, item)


def repeated_settings(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """One note per setting that ``overrides`` give more than once, also when one of them sets its whole
    section (``local={steps: 5}`` and ``local.steps=3``): ``local.steps: 'local.steps=3' then
    'local={steps: 5}', the last one counts``."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, item in enumerate(overrides):
        for key in _leaf_keys(item):
            first.setdefault(key, i)
            last[key] = i
    return [f"{key}: {brief(overrides[first[key]])} then {brief(overrides[last[key]])}, the last one counts"
            for key in first if first[key] != last[key]]


def _leaf_keys(item: str) -> list[str]:
    """The dotted settings override ``item`` sets: its key, or every key below it for a mapping value."""
    if "=" not in item:
        return []
    key, raw = item.split("=", 1)
    try:
        value = parse_yaml(raw) if raw.strip() else None
    except (YAMLError, ConfigError):
        value = None
    out, stack = [], [(key.strip(), value)]
    while stack:
        prefix, node = stack.pop()
        if isinstance(node, dict) and node:
            stack.extend((f"{prefix}.{k}", v) for k, v in node.items())
        else:
            out.append(prefix)
    return out


def apply_override(data: dict[str, Any], item: str) -> None:
    """Set ``a.b.c=value`` in a nested dict; the value is parsed as YAML (numbers, lists, null). A mapping
    given to a section (``local={steps: 5}``) is merged into it: the section's other keys stay."""
    if "=" not in item:
        raise ConfigError(f"override {brief(item)}: expected section.key=value")
    key, raw = item.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {brief(item)}: expected section.key=value")
    if not raw.strip():  # `state.dir=` is a path left out, not a request for the default
        raise ConfigError(f"override {brief(item)}: no value; expected {key.strip()}=VALUE ({key.strip()}=null "
                          "for none)")
    try:
        value = parse_yaml(raw)
    except YAMLError:
        value = raw
    except ConfigError as exc:
        raise ConfigError(f"override {brief(item)}: {exc}") from None
    if len(parts) == 1 and parts[0] in SECTIONS and not isinstance(value, dict):
        raise ConfigError(f"override {brief(item)}: {parts[0]} is a section; expected {parts[0]}.KEY=VALUE")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {brief(item)}: {part} is not a section")
        node = child
    old = node.get(parts[-1])
    node[parts[-1]] = _merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value


def _merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old`` with ``new``'s keys set, mappings merged key by key."""
    out = dict(old)
    for k, v in new.items():
        out[k] = _merged(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out
