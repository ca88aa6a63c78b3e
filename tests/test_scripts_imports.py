"""The benchmark and experiment scripts import only public names of headscan that exist: a rename inside the
package must not leave `make benchmark-previous` or an experiment failing at its first line (it once did, on a
private name that had moved)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted([*ROOT.joinpath("benchmarks").glob("*.py"), *ROOT.joinpath("experiments").glob("*.py")])


def headscan_imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) of every ``from headscan... import name`` in the script, inside functions too."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [(node.lineno, node.module, alias.name) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "headscan"
            for alias in node.names]


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_every_headscan_name_a_script_imports_is_public_and_exists(path):
    problems = []
    for line, module, name in headscan_imports(path):
        where = f"{path.relative_to(ROOT)}:{line}: from {module} import {name}"
        if name.startswith("_"):
            problems.append(f"{where}: a private name; make it public in a module meant for sharing")
            continue
        imported = importlib.import_module(module)
        if not hasattr(imported, name):
            try:  # a submodule imported by name
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                problems.append(f"{where}: no such name")
    assert not problems, "\n".join(problems)


def test_the_check_reads_imports_inside_functions(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import os\nfrom headscan.models.hub import quiet\n\ndef f():\n"
                      "    from headscan.models.specs import _quiet\n    from other import thing\n")
    assert headscan_imports(script) == [(2, "headscan.models.hub", "quiet"), (5, "headscan.models.specs", "_quiet")]
