"""The README cannot drift from the code: metric definitions come from the registry, every command is there."""

from pathlib import Path

import pytest

from headscan.cli import cli
from headscan.docs import blocks, pattern

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.parametrize("name", list(blocks()))
def test_readme_generated_blocks_are_the_registries(name):
    found = pattern(name).search(README.read_text())
    assert found, f"README lost its {name} block"
    assert found.group(2) == blocks()[name], "run: python -m headscan.docs to regenerate the README blocks"


def test_every_command_is_in_the_readme():
    text = README.read_text()
    for name in cli.commands:
        assert f"headscan {name}" in text, name
