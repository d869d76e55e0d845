"""``fedrun config --defaults``: every config key with its default and what it means.

The meanings are the comments next to the fields in the source of the config dataclasses (fedrun/config/sections.py,
and an algorithm's ``Hparams`` wherever it lives, plugins included): a field's trailing comment, else the
comment lines right above it. So the table cannot drift from the code.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import json
import textwrap
import tokenize
from typing import Any

from fedrun.config.sections import AlgorithmConfig
from fedrun.config.tree import Config


def field_comments(cls: type) -> dict[str, str]:
    """``{field: comment}`` from the source of dataclass ``cls`` ("" where a field has none)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source (built in a REPL): no comments
        return {}
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    out = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            own = [comments[i] for i in range(node.lineno, (node.end_lineno or node.lineno) + 1) if i in comments]
            above, line = [], node.lineno - 1
            while line in comments and line not in code_lines:
                above.insert(0, comments[line])
                line -= 1
            out[node.target.id] = " ".join(above + own)
    return out


def describe_keys(obj: Any, prefix: str = "") -> list[tuple[str, Any, str]]:
    """``[(dotted key, value, meaning)]`` of every leaf field of config dataclass ``obj``, in order."""
    rows: list[tuple[str, Any, str]] = []
    meanings = {}
    for cls in reversed(type(obj).__mro__):  # inherited fields (a shared Hparams base) first, then overrides
        if dataclasses.is_dataclass(cls):
            meanings.update(field_comments(cls))
    for f in dataclasses.fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if not f.init:  # a plugin's settings: keys of the section itself
            if dataclasses.is_dataclass(value):
                rows += describe_keys(value, prefix)
        elif isinstance(value, AlgorithmConfig):
            rows.append((f"{key}.name", value.name, "the algorithm: a name of `fedrun list` or "
                                                     "package.module:Class (its own keys follow)"))
            if dataclasses.is_dataclass(value.hparams):
                rows += describe_keys(value.hparams, f"{key}.")
        elif dataclasses.is_dataclass(value):
            rows += describe_keys(value, f"{key}.")
        else:
            rows.append((key, value, meanings.get(f.name, "")))
    return rows


def format_keys(cfg: Config) -> str:
    """The table ``fedrun config --defaults`` prints: key, value (JSON/YAML), meaning; one line per key."""
    rows = [(k, json.dumps(v), m) for k, v, m in describe_keys(cfg)]
    kw, vw = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    vw = min(vw, 24)
    return "\n".join(f"{k.ljust(kw)}  {v.ljust(vw)}  {m}".rstrip() for k, v, m in rows)
