"""Every ``headscan.NAME(`` that a reader is told to call exists: in README.md, docs/, the committed runs'
``run.json`` (whose ``command`` a run made in Python records as such a call) and the code that writes those
commands. The names are read from the files, not listed here, so a new documented call is checked as it lands."""

import re
from pathlib import Path

import pytest

import headscan

ROOT = Path(__file__).resolve().parents[1]
CALL = re.compile(r"\bheadscan\.([A-Za-z_]\w*)\(")


def _calls() -> dict[str, set[str]]:
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "reports").rglob("run.json"),
             *(ROOT / "headscan").rglob("*.py")]
    found: dict[str, set[str]] = {}
    for path in files:
        for name in CALL.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


CALLS = _calls()


def test_the_documented_entry_points_are_found():
    # the scan itself: the calls the docs and the recorded commands are known to hold
    assert {"sweep", "load", "report", "patch", "retrieval", "import_scores"} <= set(CALLS)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_documented_call_exists(name):
    assert callable(getattr(headscan, name, None)), f"headscan.{name} is called in {sorted(CALLS[name])[:3]}"
    assert name in headscan.__all__
