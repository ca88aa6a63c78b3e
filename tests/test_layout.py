"""The package's shape: folders that import one way, no import cycles, modules a reader can take in at once.

The rules are the import-linter contracts in pyproject.toml (imports inside functions counted); the README's
Layout section is generated from them (tests/test_docs.py).
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "headscan"
MAX_LINES = 550  # a module longer than this wants splitting (aim for 500)


def lint_imports() -> str:
    beside = Path(sys.executable).parent / "lint-imports"
    return str(beside) if beside.exists() else (shutil.which("lint-imports") or "lint-imports")


def test_imports_keep_the_contracts():
    result = subprocess.run([lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_too_long(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines; split it by concept"
