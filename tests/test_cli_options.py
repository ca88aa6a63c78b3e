"""Options declared once: each command's options come from one declaration, every one has help, and
docs/options.md is what the declarations generate."""

import dataclasses
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from headscan.cli import cli
from headscan.cli_options import CONFIGS, OPTIONS, TITLES, config_from, options_markdown, shown_opts
from headscan.config import GROUPS, SweepConfig
from headscan.retrieval_config import RetrievalConfig
from headscan.setting import fingerprinted, settings

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
            if field.name == "extra":  # the values of settings added from outside, declared where they are added
                continue
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


# --- each setting declared once: the lists derived from the declarations keep their properties ---------------------
REQUIRED = {"sweep": [], "retrieval": ["-m", "x", "-c", "y"], "patch": ["-m", "x", "--pairs", "p"]}


def test_each_config_command_lists_its_fields_as_options_in_their_order():
    """A field of a config is an option of its command (`Config.command`), in the order of the fields, with its
    `Setting`'s group and help and the field's default: the command's option list is not written anywhere else."""
    assert set(CONFIGS) == set(REQUIRED)
    for command, config in CONFIGS.items():
        declared = {opt.name: opt for opt in OPTIONS[command]}
        assert [name for name in declared if name in settings(config)] == list(settings(config)), command
        for name, setting in settings(config).items():
            assert (declared[name].help, declared[name].group) == (setting.help, setting.group), (command, name)
        parsed = cli.commands[command].make_context(command, list(REQUIRED[command])).params
        assert config_from(config, parsed) == config(), command


def test_the_options_that_are_no_field_are_in_no_fingerprint():
    """Where to write, whether to resume: the options of a config command that are no field of its config."""
    for command, config in CONFIGS.items():
        others = {opt.name for opt in OPTIONS[command]} - set(settings(config))
        assert others and not others & {f.name for f in dataclasses.fields(config)}, command
        assert not others & set(fingerprinted(config)), command


def test_the_fingerprinted_settings_are_fields_of_their_config_in_order():
    for config in CONFIGS.values():
        names = fingerprinted(config)
        assert names and list(names) == [name for name in settings(config) if name in names], config.__name__
        # where the model runs, and how replicates become an interval, change no number a run keeps
        assert not {"device", "interval"} & set(names), config.__name__
