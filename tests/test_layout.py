"""The package's shape: folders that import one way, no import cycles, modules a reader can take in at once.

The rules are the import-linter contracts in pyproject.toml (imports inside functions counted); docs/layout.md's
table is generated from them (tests/test_docs.py). import-linter checks folders against each other;
the file-level checks here (a circle between two files of one folder, a module imported under another name,
functions and modules too long to read at once) walk the source with `ast`.
"""

import ast
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "headscan"
MAX_LINES = 450  # a module longer than this wants splitting by concept
MAX_FUNCTION_LINES = 80  # from `def` to the last line of the body, decorators excluded
# a comment on the `def` line or the line above it that exempts a function holding a generated table
GENERATED = "# layout: generated table"
MODULES = sorted(PACKAGE.rglob("*.py"))


def lint_imports() -> str:
    beside = Path(sys.executable).parent / "lint-imports"
    return str(beside) if beside.exists() else (shutil.which("lint-imports") or "lint-imports")


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def module_file(folder: Path) -> Path | None:
    """The file Python runs for the module at `folder` (without suffix): NAME.py, or NAME/__init__.py."""
    if folder.with_suffix(".py").is_file():
        return folder.with_suffix(".py")
    if (folder / "__init__.py").is_file():
        return folder / "__init__.py"
    return None


def _type_checking_blocks(module: ast.Module) -> set[int]:
    """The ids of the import nodes under ``if TYPE_CHECKING:``: names for annotations, never run (import-linter's
    contracts leave them out too: exclude_type_checking_imports in pyproject.toml)."""
    inside = set()
    for node in ast.walk(module):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(child) for statement in node.body for child in ast.walk(statement))
    return inside


def imported_files(path: Path) -> set[Path]:
    """The files of headscan that `path` imports, anywhere in it (inside functions too; not the names imported
    under ``if TYPE_CHECKING:`` for annotations, which never run).

    ``from . import name`` leads to the sibling module `name` (not to the package's own ``__init__``, which Python
    is already running); ``from .mod import name`` to ``mod`` and, when `name` is a module of the package ``mod``,
    to that module too. Absolute ``headscan...`` imports are resolved the same way.
    """
    found, module = set(), tree(path)
    annotations_only = _type_checking_blocks(module)
    for node in ast.walk(module):
        if id(node) in annotations_only:
            continue
        if isinstance(node, ast.Import):
            targets = [(alias.name.split("."), []) for alias in node.names if alias.name.split(".")[0] == "headscan"]
            for parts, _ in targets:
                target = module_file(ROOT.joinpath(*parts))
                if target is not None:
                    found.add(target)
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
        elif node.module and node.module.split(".")[0] == "headscan":
            base = ROOT
        else:
            continue
        folder = base.joinpath(*node.module.split(".")) if node.module else base
        target = module_file(folder) if node.module else None
        if target is not None and target != path:
            found.add(target)
        for alias in node.names:
            submodule = module_file(folder / alias.name)
            if submodule is not None and submodule != path:
                found.add(submodule)
    return found


def import_graph() -> dict[Path, set[Path]]:
    return {path: imported_files(path) for path in MODULES}


def cycles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """The strongly connected components of more than one file (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def renamed_modules(path: Path) -> list[str]:
    """Relative imports in `path` that bring in a module of headscan under another name."""
    found = []
    for node in ast.walk(tree(path)):
        if not (isinstance(node, ast.ImportFrom) and node.level):
            continue
        base = path.parent
        for _ in range(node.level - 1):
            base = base.parent
        folder = base.joinpath(*node.module.split(".")) if node.module else base
        for alias in node.names:
            if alias.asname and alias.asname != alias.name and module_file(folder / alias.name) is not None:
                dots = "." * node.level
                found.append(f"line {node.lineno}: from {dots}{node.module or ''} import {alias.name} as "
                             f"{alias.asname}")
    return found


def long_functions(path: Path) -> list[str]:
    """Functions of `path` longer than MAX_FUNCTION_LINES, from `def` to the end of the body."""
    lines = path.read_text().splitlines()
    found = []
    for node in ast.walk(tree(path)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1
        marked = any(GENERATED in lines[i] for i in (node.lineno - 2, node.lineno - 1) if i >= 0)
        if length > MAX_FUNCTION_LINES and not marked:
            found.append(f"{node.name} (line {node.lineno}): {length} lines")
    return found


def test_imports_keep_the_contracts():
    result = subprocess.run([lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_no_two_files_import_each_other_in_a_circle():
    found = cycles(import_graph())
    assert not found, "import circles between files (imports inside functions counted): " + "; ".join(
        " <-> ".join(relative(path) for path in component) for component in found)


def test_the_cycle_finder_finds_a_circle_held_by_an_import_inside_a_function(tmp_path):
    """The check above, on a made-up package: a -> b at the top, b -> a inside a function; c -> a only."""
    package = tmp_path / "headscan"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("from .a import A\n")
    (package / "inner" / "a.py").write_text("from .b import B\nA = 1\n")
    (package / "inner" / "b.py").write_text("def f():\n    from . import a\n    return a\nB = 2\n")
    (package / "c.py").write_text("from .inner.a import A\n")
    files = sorted(package.rglob("*.py"))
    graph = {path: imported_files(path) for path in files}
    inner = package / "inner"
    assert graph[package / "c.py"] == {inner / "a.py"}
    assert graph[inner / "b.py"] == {inner / "a.py"}
    assert cycles(graph) == [[inner / "a.py", inner / "b.py"]]
    (inner / "b.py").write_text("B = 2\n")
    tree.cache_clear()
    assert cycles({path: imported_files(path) for path in files}) == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_imported_under_another_name(path):
    """``from ..plots import profiles as charts`` makes a reader learn two names for one module: import it as
    itself (or import the names it needs)."""
    found = renamed_modules(path)
    assert not found, f"{relative(path)} renames modules it imports: " + "; ".join(found)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_too_long(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{relative(path)} has {lines} lines; split it by concept"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_is_too_long(path):
    found = long_functions(path)
    assert not found, (f"{relative(path)} has functions over {MAX_FUNCTION_LINES} lines; split them by step: "
                       + "; ".join(found))
