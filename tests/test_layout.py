"""The package's shape: modules by concept that import each other without cycles, and a report that loads no model."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "headscan"
# Modules that draw or lay out a report: they read tables, never models (examples.py computes the example
# attention beforehand, and is the one report-side module allowed to load models).
REPORT_SIDE = {"report/build", "report/document", "analysis/findings", "analysis/runs", "plots/heatmaps",
               "plots/profiles", "report/atlas", "report/sections"}


def _name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def module_imports() -> dict[str, set[str]]:
    """Each headscan module -> the headscan modules it imports at import time (not inside functions)."""
    names = {_name(path) for path in PACKAGE.rglob("*.py")}
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        here = _name(path).split(".")[:-1] if path.name != "__init__.py" else _name(path).split(".")[:-1]
        found = set()
        for node in tree.body:  # module level only: imports inside functions are lazy on purpose
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                base = here[: len(here) - (node.level - 1)]
                module = ".".join([*base, *(node.module.split(".") if node.module else [])])
                found.update({module} if node.module else {".".join([*base, a.name]) for a in node.names})
        graph[_name(path)] = {name for name in found if name in names and name != _name(path)}
    return graph


def test_no_import_cycles():
    graph = module_imports()
    visiting, done = set(), set()

    def visit(node, trail):
        if node in visiting:
            pytest.fail(f"import cycle: {' -> '.join(trail + [node])}")
        if node in done:
            return
        visiting.add(node)
        for child in sorted(graph.get(node, ())):
            visit(child, trail + [node])
        visiting.discard(node)
        done.add(node)

    for module in sorted(graph):
        visit(module, [])


@pytest.mark.parametrize("module", sorted(REPORT_SIDE))
def test_report_modules_do_not_import_models_or_the_sweep(module):
    source = (PACKAGE / f"{module}.py").read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            names = {node.module.split(".")[0]} if node.module else {alias.name for alias in node.names}
            assert not names & {"models", "scan"}, f"{module} imports {names}"
