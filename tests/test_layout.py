"""The package's shape: modules by concept that import each other without cycles, and a report that loads no model."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "headscan"
# Modules that draw or lay out a report: they read tables, never models (examples.py computes the example
# attention beforehand, and is the one report-side module allowed to load models).
REPORT_SIDE = {"report", "document", "findings", "runs", "figures", "charts", "atlas", "sections"}


def module_imports() -> dict[str, set[str]]:
    """Each headscan module -> the headscan modules it imports at import time (not inside functions)."""
    graph = {}
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        found = set()
        for node in tree.body:  # module level only: imports inside functions are lazy on purpose
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(alias.name for alias in node.names)
        graph[path.stem] = {name for name in found if (PACKAGE / f"{name}.py").exists()}
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
    if not (PACKAGE / f"{module}.py").exists():
        pytest.skip(f"no {module}.py")
    source = (PACKAGE / f"{module}.py").read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = {node.module} if node.module else {alias.name for alias in node.names}
            assert not names & {"models", "scan", "jobs", "hooking"}, f"{module} imports {names}"
