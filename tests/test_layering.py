"""The import graph of ``fedrun/`` has no cycle, function-level imports included, and the ground floor
(``fedrun.errors``) imports nothing else of fedrun. The experiments' home, ``experiments/`` (scripts that
import each other by file name), has no cycle either, and fedrun never imports an experiment.
The ground floor owns every error type: no other module of fedrun defines one, and every module (tests,
benchmarks and experiments too) imports them from there. One concept a module: no module of fedrun/ is
longer than ``MAX_LINES`` lines. A function receives the objects and the config sections it reads, not long
lists of loose values: at most ``MAX_WIDE`` functions of fedrun/ take ``WIDE`` or more parameters.

Run ``python tests/test_layering.py`` to print every cycle of fedrun/ and of experiments/ (a strongly
connected component of the graph) with one import that closes it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fedrun"
EXPERIMENTS = PACKAGE.parent / "experiments"
GROUND_FLOOR = ("fedrun.errors",)
MAX_LINES = 450  # past this a module holds more than one concept: split it (docs/design.md)
WIDE = 7  # parameters (positional and keyword-only, self and cls not counted) that make a function wide
MAX_WIDE = 6  # wide functions fedrun/ may hold (docs/design.md)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the fedrun modules it imports anywhere in its body (``from a import b`` counts as an
    import of ``a.b`` when that is a module, else of ``a``; importing ``a.b`` also runs package ``a``,
    unless ``a`` is a package of the importer itself, which is then already being imported)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
            for target in targets:
                parts = target.split(".")
                for i in range(1, len(parts) + 1):  # importing a.b.c runs a, a.b and a.b.c ...
                    prefix = ".".join(parts[:i])
                    # ... but the importer's own packages are already running: only naming one counts
                    if prefix in modules and prefix != name and (prefix == target or prefix not in ancestors):
                        graph[name].add(prefix)
    return graph


def imported_names(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports anywhere in its body (``from a import b``: ``a``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def script_graph(directory: Path) -> dict[str, set[str]]:
    """Script -> the scripts of the same directory it imports (scripts import each other by file name, the
    directory being first on ``sys.path`` when one of them runs)."""
    scripts = {p.stem: p for p in directory.glob("*.py")}
    return {name: {m.split(".")[0] for m in imported_names(path)} & set(scripts) - {name}
            for name, path in scripts.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles in fedrun/ (run python tests/test_layering.py): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_ground_floor_imports_nothing_of_fedrun():
    graph = import_graph()
    for name in GROUND_FLOOR:
        assert not graph[name], f"{name} imports {sorted(graph[name])}"


def test_no_import_cycle_among_the_experiments():
    found = cycles(script_graph(EXPERIMENTS))
    assert not found, "import cycles in experiments/: " + "; ".join(" <-> ".join(c) for c in found)


def test_fedrun_never_imports_an_experiment():
    experiments = set(script_graph(EXPERIMENTS))
    for path in PACKAGE.rglob("*.py"):
        wrong = {m.split(".")[0] for m in imported_names(path)} & (experiments | {"experiments"})
        assert not wrong, f"{path.relative_to(PACKAGE.parent)} imports the experiment(s) {sorted(wrong)}"


def error_types() -> set[str]:
    """The exception classes of the ground floor."""
    import fedrun.errors

    return {name for name, obj in vars(fedrun.errors).items()
            if isinstance(obj, type) and issubclass(obj, BaseException)}


def test_every_error_type_lives_in_the_ground_floor():
    errors = error_types()
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                assert not any(b in errors or b.endswith(("Error", "Exception")) for b in bases), (
                    f"{path.relative_to(PACKAGE.parent)}: error type {node.name} belongs in fedrun/errors.py")


def test_error_types_are_imported_from_the_ground_floor():
    errors = error_types()
    roots = [PACKAGE.parent / d for d in ("fedrun", "tests", "bench", "experiments", "examples")]
    # the project's own files, not the peers' virtual environments that bench/setup_peers.sh creates
    sources = (p for root in roots for p in root.rglob("*.py") if ".envs" not in p.relative_to(root).parts)
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fedrun") and node.level == 0:
                wrong = [a.name for a in node.names if a.name in errors and node.module != "fedrun.errors"]
                assert not wrong, (f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports {', '.join(wrong)} "
                                   f"from {node.module}; error types come from fedrun.errors")


def test_no_module_is_longer_than_the_limit():
    long = {str(p.relative_to(PACKAGE.parent)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by concept): " + ", ".join(
        f"{path} ({n})" for path, n in sorted(long.items()))


def wide_functions(package: Path = PACKAGE) -> dict[str, int]:
    """``path:line name`` -> parameter count of every function of ``package`` with ``WIDE`` or more
    parameters (positional, positional-only and keyword-only; a method's ``self`` or ``cls`` not counted)."""
    wide = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                if names[:1] in (["self"], ["cls"]):
                    names = names[1:]
                if len(names) >= WIDE:
                    wide[f"{path.relative_to(package.parent)}:{node.lineno} {node.name}"] = len(names)
    return wide


def test_few_functions_take_many_parameters():
    wide = wide_functions()
    assert len(wide) <= MAX_WIDE, (f"{len(wide)} functions take {WIDE} or more parameters (at most {MAX_WIDE}; "
                                   "pass a dataclass of what they read, or the config section): " +
                                   ", ".join(f"{name} ({n})" for name, n in sorted(wide.items())))


def test_the_parameter_counter_counts_keyword_only_and_skips_self(tmp_path):
    """The counter itself: keyword-only parameters count, ``self`` does not."""
    pkg = tmp_path / "fedrun"
    pkg.mkdir()
    (pkg / "m.py").write_text("class A:\n    def f(self, a, b, c, d, e, f): ...\n"
                              "def g(a, b, c, d, e, f, *, g=1): ...\n")
    assert wide_functions(pkg) == {"fedrun/m.py:3 g": 7}


def test_the_checker_sees_a_function_level_cycle(tmp_path, monkeypatch):
    """The checker itself: a cycle closed only inside a function body is found."""
    pkg = tmp_path / "fedrun"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from fedrun import b\n")
    (pkg / "b.py").write_text("def f():\n    from fedrun.a import g\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    assert cycles(import_graph()) == [["fedrun.a", "fedrun.b"]]


def test_the_checker_sees_a_cycle_between_scripts(tmp_path):
    """The checker itself: two scripts that import each other, one only inside a function, are a cycle."""
    (tmp_path / "run.py").write_text("def main():\n    from report import table\n")
    (tmp_path / "report.py").write_text("from run import GRID\n")
    (tmp_path / "other.py").write_text("import run\n")
    assert cycles(script_graph(tmp_path)) == [["report", "run"]]


if __name__ == "__main__":
    found_any = False
    for graph in (import_graph(), script_graph(EXPERIMENTS)):
        for component in cycles(graph):
            found_any = True
            members = set(component)
            print(f"cycle of {len(component)} modules:")
            for v in component:
                inside = sorted(graph[v] & members)
                print(f"  {v} -> {', '.join(inside)}")
    sys.exit(1 if found_any else 0)
