"""YAML as written: the YAML 1.2 reading of config files and override values, with bounded cost.

PyYAML implements YAML 1.1, where ``010`` is the octal 8, ``1:30`` the base-60 number 90 and ``yes`` a
boolean; a config author writing YAML today means 10, a string and a string. ruamel.yaml's safe loader
implements YAML 1.2 (the core schema): ``010`` is 10, ``0o10`` is 8, ``1:30`` is a string, only
``true``/``false`` are booleans. Merge keys (``<<: *defaults``) are accepted; a key repeated in one
mapping is refused (YAML would keep the last one silently).

The cost of reading is bounded before anything big is built, so that a hostile or mistaken file fails
with one line instead of filling the memory:

* the text is at most :data:`MAX_BYTES` long;
* the document, with every alias expanded as a reader of the data would see it, has at most
  :data:`MAX_NODES` nodes (an "alias bomb" of nine nested lists of nine aliases has 9^9 = 387 million
  nodes while its text is a few hundred bytes; the count is memoised per node, so it costs one visit
  of the text's own nodes), and nests at most :data:`MAX_DEPTH` levels deep.
"""

from __future__ import annotations

import re
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from fedrun.errors import ConfigError, brief

__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_NODES", "YAMLError", "parse_yaml"]

MAX_BYTES = 1 << 20  # 1 MiB: the largest config of configs/ is a few KiB
MAX_NODES = 100_000  # scalars, lists and mappings, aliases expanded
MAX_DEPTH = 32  # nesting levels of lists and mappings (a config uses 4)


def parse_yaml(text: str) -> Any:
    """The plain Python value of YAML 1.2 ``text`` (dicts, lists, str, int, float, bool, None; no Python
    objects). Raises :class:`ConfigError` for a duplicate key, a too large, too big or too deep document,
    and ruamel's :class:`YAMLError` for text that is not YAML (the caller names the file)."""
    if len(text) > MAX_BYTES:
        raise ConfigError(f"{len(text)} characters, more than the {MAX_BYTES} a config may have")
    if "\x00" in text:
        raise ConfigError("contains a NUL character; expected YAML text")
    yaml = YAML(typ="safe", pure=True)
    try:
        node = yaml.compose(text)
    except RecursionError:
        raise ConfigError(f"nested more than {MAX_DEPTH} levels deep") from None
    if node is None:
        return None
    _check_size(node)
    try:
        return yaml.constructor.construct_document(node)
    except DuplicateKeyError as exc:
        key = re.search(r'found duplicate key "(.*)" with value', exc.problem or "", re.S)
        line = exc.problem_mark.line + 1 if exc.problem_mark is not None else "?"
        name = brief(key.group(1)) if key else "?"
        raise ConfigError(f"line {line}: duplicate key {name} in one mapping (YAML would keep the last one "
                          "silently)") from None
    except RecursionError:
        raise ConfigError(f"nested more than {MAX_DEPTH} levels deep") from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. an integer of more than 4300 digits
        raise ConfigError(f"cannot read a value ({brief(str(exc))[1:-1]})") from None


def _check_unique_keys(node: MappingNode) -> None:
    """Refuse a key written twice in one mapping (ConfigError naming it and its line). ruamel.yaml refuses
    it too, except in a mapping that also holds a merge key (``<<``), where it keeps the last one."""
    seen: set[tuple[str, str]] = set()
    for key, _ in node.value:
        if isinstance(key, ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
            if (key.tag, key.value) in seen:
                raise ConfigError(f"line {key.start_mark.line + 1}: duplicate key {brief(key.value)} in one mapping "
                                  "(YAML would keep the last one silently)")
            seen.add((key.tag, key.value))


def _check_size(root: Node) -> None:
    """Refuse a document of more than MAX_NODES expanded nodes or MAX_DEPTH levels (ConfigError).

    ``size(n) = 1 + sum(size(child))`` and ``depth(n) = 1 + max(depth(child))`` over the composed graph,
    where an alias is the same node object as its anchor: memoised by node, each is computed once."""
    sizes: dict[int, tuple[int, int]] = {}
    on_path: set[int] = set()

    def visit(node: Node, level: int) -> tuple[int, int]:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in on_path:  # an anchor used inside itself: infinitely large
            raise ConfigError("an alias refers to a node that contains it (infinitely large document)")
        if level > MAX_DEPTH:
            raise ConfigError(f"nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, MappingNode):
            _check_unique_keys(node)
            children = [c for pair in node.value for c in pair]
        elif isinstance(node, SequenceNode):
            children = list(node.value)
        else:
            children = []
        on_path.add(key)
        size, depth = 1, 0
        for child in children:
            s, d = visit(child, level + 1)
            size += s
            depth = max(depth, d)
            if size > MAX_NODES:
                raise ConfigError(f"more than {MAX_NODES} values once its aliases are expanded; expected a "
                                  "config of ordinary size")
        on_path.discard(key)
        sizes[key] = (size, depth + 1)
        return sizes[key]

    visit(root, 1)
