"""Options declared once: each command's options come from one declaration, every one has help, and
docs/options.md is what the declarations generate."""

import dataclasses
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from headscan.cli import cli
from headscan.cli_options import OPTIONS, TITLES, config_from, options_markdown, shown_opts
from headscan.config import GROUPS, SweepConfig
from headscan.retrieval_config import RetrievalConfig

OPTIONS_MD = Path(__file__).resolve().parents[1] / "docs" / "options.md"


def options_of(command: str) -> dict[str, click.Option]:
    """The options of `command` by their longest listed flag (--help is click's own, not declared)."""
    return {max(shown_opts(p), key=len): p for p in cli.commands[command].params
            if isinstance(p, click.Option) and p.name != "help"}


def test_options_md_is_generated_from_the_declarations():
    assert OPTIONS_MD.read_text() == options_markdown(), "run: python -m headscan.cli_options to regenerate it"


def test_options_md_names_every_option_of_every_command():
    text = OPTIONS_MD.read_text()
    for name in cli.commands:
        for option in cli.commands[name].params:
            if isinstance(option, click.Option):
                assert max(shown_opts(option), key=len) in text, (name, option.opts)


def test_sweep_and_retrieval_share_their_common_options_from_one_declaration():
    sweep, retrieval = options_of("sweep"), options_of("retrieval")
    shared = {"--device", "--dtype", "--bootstrap", "--interval", "--overwrite", "--restart", "--quiet"}
    assert shared <= set(sweep) & set(retrieval)
    for flag in shared:
        assert sweep[flag].declared is retrieval[flag].declared, flag
    # and no option is written out twice: two commands' options with the same flag and help are one declaration
    for flag in set(sweep) & set(retrieval):
        if sweep[flag].help == retrieval[flag].help:
            assert sweep[flag].declared is retrieval[flag].declared, flag


def test_every_option_of_every_command_is_declared_once_and_has_help():
    for name, command in cli.commands.items():
        declared = [p for p in command.params if isinstance(p, click.Option) and p.name != "help"]
        assert [p.declared for p in declared] == OPTIONS[name], name  # generated, in the declared order
        for option in declared:
            assert option.help and option.help.strip(), (name, option.opts)
            assert option.group in TITLES, (name, option.opts)


def test_every_config_field_declares_its_group_and_help():
    assert set(GROUPS) <= set(TITLES)
    for config in (SweepConfig, RetrievalConfig):
        for field in dataclasses.fields(config):
            setting = field.metadata["setting"]
            assert setting.group in GROUPS and setting.help.strip(), (config.__name__, field.name)


@pytest.mark.parametrize("width", [80, 60])
def test_headscan_help_cuts_no_line(width):
    shown = CliRunner().invoke(cli, ["--help"], terminal_width=width).output
    commands = shown[shown.index("Commands:"):].splitlines()[1:]
    assert {line.split()[0] for line in commands if line.startswith("  ") and not line.startswith("   ")} \
        == set(cli.commands)
    assert not [line for line in commands if line.rstrip().endswith("...")]


def test_defaults_on_the_command_line_are_the_configs_defaults():
    """Parsing no option at all gives the dataclasses' own defaults (--bos auto is prepend_bos None)."""
    sweep = cli.commands["sweep"].make_context("sweep", [])
    assert config_from(SweepConfig, sweep.params) == SweepConfig()
    retrieval = cli.commands["retrieval"].make_context("retrieval", ["-m", "x", "-c", "y"])
    assert config_from(RetrievalConfig, retrieval.params) == RetrievalConfig()
    chosen = cli.commands["retrieval"].make_context("retrieval", ["-m", "x", "-c", "y", "--bos", "no",
                                                                 "--lengths", "64,128", "--depths", "0,1"])
    assert config_from(RetrievalConfig, chosen.params) == RetrievalConfig(prepend_bos=False, lengths=(64, 128),
                                                                           depths=(0.0, 1.0))


def test_c_is_the_corpus_in_every_command_and_haystack_still_works():
    for name in ("sweep", "retrieval"):
        assert options_of(name)["--corpus"].opts[:2] == ["--corpus", "-c"], name
    spelled = cli.commands["retrieval"].make_context("retrieval", ["-m", "x", "--haystack", "h.txt"])
    assert spelled.params["corpus"] == "h.txt"
    shown = CliRunner().invoke(cli, ["retrieval", "--help"], terminal_width=80).output
    assert "--haystack" not in shown and "-c, --corpus PATH|builtin" in shown
    missing = CliRunner().invoke(cli, ["retrieval", "-m", "x"])
    assert missing.exit_code == 2 and "Missing option '--corpus' / '-c'." in missing.output


def test_a_refused_setting_is_named_by_its_flag(tmp_path):
    result = CliRunner().invoke(cli, ["retrieval", "-m", "x", "-c", str(tmp_path), "--query-chunk", "0", "--out",
                                      str(tmp_path / "out")])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: --query-chunk must be a whole number >= 1, got 0"
