"""The README cannot drift from the code: metric definitions come from the registry, every command is there."""

from pathlib import Path

import pytest

from click.testing import CliRunner

from headscan.cli import cli
from headscan.docs import blocks, pattern
from headscan.tables import TABLES

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


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_every_command_s_help_shows_each_example_on_its_own_line(name):
    examples = [line.strip() for line in cli.commands[name].help.splitlines() if line.strip().startswith("headscan ")]
    assert examples, f"headscan {name} --help has no example"
    shown = CliRunner().invoke(cli, [name, "--help"], terminal_width=80).output
    lines = [line.strip() for line in shown.splitlines()]
    for example in examples:
        assert example in lines, f"headscan {name} --help runs this example into another line: {example}"


def test_sweep_help_names_every_table_of_the_registry():
    shown = CliRunner().invoke(cli, ["sweep", "--help"], terminal_width=80).output
    for table in TABLES.values():
        assert table.file in shown, table.file
