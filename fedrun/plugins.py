"""Researchers' own code as plugins: ``package.module:Attribute`` wherever a config field names a
registry entry (``algorithm.name``, ``model.name``, ``data.name``, ``participation.pattern``).

Each registry resolves its own field with :func:`load`: the module is imported from the ordinary Python
path (``PYTHONPATH``, an installed package) on every rank, in every array task of a sweep and on resume,
and the attribute is checked against the registry's contract (docs/extending.md). Anything wrong (the
module is missing or fails to import, no such attribute, the wrong kind of object) is one
:class:`~fedrun.errors.ConfigError` line naming the field, the module and what was expected.

A checkpoint records what ran: :func:`digests` maps each plugin field to ``"module:Attr@<sha256>"``, the
SHA-256 of the source file of the plugin's module (that file only, not the modules it imports) as it was
when this process imported it, so that a resume can tell whether the plugin's code changed since the
checkpoint (``Config.to_dict`` puts the map in the resolved config, which the resume policy compares).

Imports nothing of fedrun but the ground floor, so every registry can use it without an import cycle.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
from collections.abc import Callable
from typing import Any

from fedrun.errors import ConfigError, brief


def is_import_path(name: str) -> bool:
    """True for ``package.module:Attribute`` (registry names never contain a colon)."""
    return ":" in name


def _split(value: str, field: str) -> tuple[str, str]:
    module, _, attr = value.partition(":")
    if not all(part.isidentifier() for part in (*module.split("."), *attr.split("."))):
        raise ConfigError(f"{field}: expected a registered name or package.module:Attribute, got {brief(value)}")
    return module, attr


def load(value: str, field: str, expected: str, accept: Callable[[Any], bool]) -> Any:
    """Import ``package.module:Attribute`` named by config ``field`` and return the attribute;
    ``accept(obj)`` is the registry's contract check, ``expected`` says it in words for the error line."""
    module_name, attr = _split(value, field)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{field}: cannot import module {module_name!r} ({exc}); expected it on the Python "
                          "path (PYTHONPATH or an installed package)") from None
    except Exception as exc:  # the plugin's own code failed while importing: still bad input, one line
        raise ConfigError(f"{field}: importing module {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{field}: module {module_name!r} has no attribute {attr!r}; expected {expected}")
        obj = getattr(obj, part)
    if not accept(obj):
        raise ConfigError(f"{field}: {value} is {obj!r}; expected {expected}")
    source_digest(module_name)  # of the code as imported, even if the file is edited during the run
    return obj


def call(field: str, value: str, expected: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` for a plugin's factory or loader (``expected``: its contract in words): an exception it
    raises is one line naming the field (``FEDRUN_DEBUG=1`` prints the plugin's traceback)."""
    try:
        return fn(*args)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{field}: {value} raised {type(exc).__name__}: {exc}; expected {expected}") from exc


_DIGESTS: dict[str, tuple[object, str]] = {}  # module name -> (the module object digested, its digest)


def source_digest(module_name: str) -> str:
    """SHA-256 of the source file of an imported module ("" when it has none, e.g. a namespace package),
    taken when this module object is first digested (a re-import is digested again)."""
    module = sys.modules[module_name]
    cached = _DIGESTS.get(module_name)
    if cached is not None and cached[0] is module:
        return cached[1]
    path = getattr(module, "__file__", None)
    digest = ""
    if path is not None:
        with open(path, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()
    _DIGESTS[module_name] = (module, digest)
    return digest


def digests(fields: dict[str, str]) -> dict[str, str]:
    """``{field: "module:Attr@sha256"}`` for the fields (``{"algorithm.name": value, ...}``) that name a
    plugin; the modules must have been loaded (the config and the registries did that)."""
    out = {}
    for field, value in fields.items():
        if is_import_path(value):
            load(value, field, "an importable plugin", lambda obj: True)  # imported once, then cached
            out[field] = f"{value}@{source_digest(_split(value, field)[0])}"
    return out
