"""Every repository path and every ``fedrun.<module>.<name>`` the docs, the configs and the code's comments name
exists.

Scanned: README.md, docs/**/*.md and every YAML file of configs/, experiments/, examples/ and slurm/ (all
their text), and the comments and docstrings of the Python files under fedrun/, tests/, bench/,
experiments/ and examples/. A path is a word that starts with one of the repository's top-level
directories and a slash (``fedrun/config/tree.py``, ``tests/test_resume.py``, ``docs/results/``), backticked or
not; ``test_{a,b}.py`` stands for each of its names. Templates (``ckpt_<round>.h5``, ``runs/{name}``,
``*.h5``) are not paths, and what runs and set-up scripts write is not in the repository (``GENERATED``).
Markdown links are checked too, relative to the file that holds them. A dotted name ``fedrun.<a>.<b>`` is a
module, or a module followed by a name its file defines at the top level (or lists in ``__all__``).

Run ``python tests/test_doc_paths.py`` to print every stale reference.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOP = ("fedrun", "tests", "bench", "experiments", "examples", "configs", "docs", "launch", "slurm")
CODE = ("fedrun", "tests", "bench", "experiments", "examples")
YAML = ("configs", "experiments", "examples", "slurm")
# made by set-up scripts and benchmarks, ignored by git (runs/ and .venv/ are not top-level names above)
GENERATED = ("bench/.envs/", "bench/.cache/")
# a path: a top-level directory, a slash, then path characters; not inside a longer word, a URL or a
# dotted name (``fedrun/`` is a path, ``myfl/fedrun/x`` and ``https://.../docs/x`` are not)
PATH = re.compile(r"(?<![\w./:-])((?:" + "|".join(TOP) + r")/[\w./{},*<>\[\]-]*)")
LINK = re.compile(r"\]\(([^()\s]+)\)")  # a markdown link's target
DOTTED = re.compile(r"(?<![\w./-])(fedrun(?:\.\w+)+)")
TEMPLATE = re.compile(r"[<>*\[\]]|\{[^,}]*\}|\.\.\.")  # placeholders and globs, not paths


def expand(path: str) -> list[str]:
    """``a/test_{x,y}.py`` -> ``a/test_x.py``, ``a/test_y.py`` (one brace group at a time)."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", path)
    if not m:
        return [path]
    return [q for part in m.group(1).split(",") for q in expand(path[: m.start()] + part + path[m.end():])]


def named_paths(text: str) -> Iterator[str]:
    for m in PATH.finditer(text):
        path = m.group(1).rstrip(".,:;")
        if path.count("{") != path.count("}"):
            continue
        for p in expand(path):
            if not TEMPLATE.search(p):
                yield p


def comments_and_docstrings(source: str) -> str:
    """The comments and docstrings of a Python file, one per line."""
    parts = [tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                parts.append(doc)
    return "\n".join(parts)


def sources() -> Iterator[tuple[Path, str]]:
    yield REPO / "README.md", (REPO / "README.md").read_text()
    for pattern in ("docs/**/*.md", *(f"{top}/**/*.yaml" for top in YAML)):
        for path in sorted(REPO.glob(pattern)):
            yield path, path.read_text()
    for top in CODE:
        for path in sorted((REPO / top).rglob("*.py")):
            if not any(part.startswith(".") for part in path.relative_to(REPO / top).parts):  # virtual envs
                yield path, comments_and_docstrings(path.read_text())


def module_file(parts: list[str]) -> Path | None:
    path = REPO.joinpath(*parts)
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def top_level_names(path: Path) -> set[str]:
    """The names a module binds at its top level (definitions, assignments, imports) and its ``__all__``."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in getattr(node, "targets", [])):
                names.update(ast.literal_eval(node.value))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def dotted_name_exists(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        path = module_file(parts[:i])
        if path is not None:
            return i == len(parts) or parts[i] in top_level_names(path)
    return False


def stale_references() -> list[str]:
    """``file: path`` for every named path that does not exist."""
    missing = []
    for source, text in sources():
        where = source.relative_to(REPO)
        for path in dict.fromkeys(named_paths(text)):
            if not (REPO / path).exists() and not path.startswith(GENERATED):
                missing.append(f"{where}: {path}")
        for name in dict.fromkeys(m.group(1).rstrip(".") for m in DOTTED.finditer(text)):
            if not dotted_name_exists(name):
                missing.append(f"{where}: {name}")
        if source.suffix == ".md":
            for m in LINK.finditer(text):
                target = m.group(1).split("#")[0]
                if target and not re.match(r"[a-z]+:", target) and not (source.parent / target).exists():
                    missing.append(f"{where}: link {target}")
    return missing


def test_every_path_and_name_in_docs_configs_and_comments_exists():
    missing = stale_references()
    assert not missing, f"{len(missing)} stale references:\n" + "\n".join(missing)


def test_the_checker_finds_paths_and_skips_templates():
    text = ("see `fedrun/config.py`, tests/test_{config,layering}.py and fedrun/nowhere.py. "
            "Writes runs/x/ckpt_<round>.h5 and docs/results/{name}/; https://example.org/docs/a.md; "
            "fedrun/federation/.")
    assert list(named_paths(text)) == ["fedrun/config.py", "tests/test_config.py", "tests/test_layering.py",
                                       "fedrun/nowhere.py", "fedrun/federation/"]
    assert dotted_name_exists("fedrun.federation.participation.Participation")
    assert dotted_name_exists("fedrun.runtime.world") and dotted_name_exists("fedrun.ConfigError")
    assert not dotted_name_exists("fedrun.federation.async_rounds")
    assert not dotted_name_exists("fedrun.checkpoint.h5.CheckpointWriter")
    assert comments_and_docstrings('"""doc: docs/a.md"""\nx = "fedrun/b.py"  # tests/c.py\n').split("\n") == [
        "# tests/c.py", "doc: docs/a.md"]


if __name__ == "__main__":
    found = stale_references()
    print("\n".join(found) or "no stale references")
    sys.exit(1 if found else 0)
