"""The README cannot drift from the code: metric definitions come from the registry, every command is there."""

import re
from pathlib import Path

from headscan.cli import cli
from headscan.metrics import definitions_markdown

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCK = re.compile(r"<!-- metrics:start -->\n(.*?)<!-- metrics:end -->", re.S)


def test_readme_metric_definitions_are_the_registry_s():
    found = BLOCK.search(README.read_text())
    assert found, "README lost its metrics block"
    assert found.group(1) == definitions_markdown(), "run: python -m headscan.docs to regenerate the README block"


def test_every_command_is_in_the_readme():
    text = README.read_text()
    for name in cli.commands:
        assert f"headscan {name}" in text, name
