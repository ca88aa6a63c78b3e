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


# --- the derived lists are the hand lists they replaced ----------------------------------------------------------
# The hand lists the declarations replace, written once in their order, as the reference the derived lists must equal.
OLD_SWEEP_SETTINGS = ("max_len", "long", "batch_size", "limit", "device", "dtype", "device_map", "specials",
                      "prepend_bos", "max_offset", "bootstrap", "seed", "bootstrap_unit", "document_field", "interval",
                      "fdr", "window", "pack", "attention", "query_chunk", "attention_budget", "values", "control",
                      "control_seed", "control_seeds", "importance", "importance_models", "ablate_top", "ablate_first",
                      "importance_sample", "mask_rate", "composition", "similarity_sample", "sink", "recent",
                      "examples", "metric_modules", "layers")
OLD_FINGERPRINT_FIELDS = ("max_len", "long", "limit", "dtype", "specials", "max_offset", "bootstrap", "seed",
                          "prepend_bos", "bootstrap_unit", "window", "pack", "attention", "query_chunk", "values",
                          "document_field", "importance", "ablate_top", "ablate_first", "importance_sample",
                          "mask_rate", "sink", "recent", "similarity_sample", "examples", "composition", "layers")
OLD_NOT_FINGERPRINTED = {"batch_size", "device", "device_map", "interval", "attention_budget", "control",
                         "control_seed", "control_seeds", "fdr", "metric_modules", "importance_models"}
OLD_RETRIEVAL_LEFT_OUT = ("device", "bootstrap", "interval", "query_chunk")  # and every mask_* setting
OLD_PATCH_LEFT_OUT = ("device", "bootstrap", "interval", "seed")


def test_the_derived_lists_are_the_hand_lists_they_replaced():
    from headscan.patching_config import PatchConfig
    from headscan.setting import fingerprinted, settings

    sweep = [opt.name for opt in OPTIONS["sweep"]]
    assert [name for name in sweep if name in settings(SweepConfig)] == list(OLD_SWEEP_SETTINGS)
    assert sweep[:3] == ["models", "corpus", "out"]
    assert sweep[3 + len(OLD_SWEEP_SETTINGS):] == ["save_every", "shard", "overwrite", "restart", "ray", "quiet",
                                                   "checkpoints"]
    assert set(fingerprinted(SweepConfig)) == set(OLD_FINGERPRINT_FIELDS)
    assert set(settings(SweepConfig)) - set(fingerprinted(SweepConfig)) == OLD_NOT_FINGERPRINTED
    retrieval = [name for name in settings(RetrievalConfig)
                 if name not in OLD_RETRIEVAL_LEFT_OUT and not name.startswith("mask_")]
    assert fingerprinted(RetrievalConfig) == tuple(retrieval)
    assert fingerprinted(PatchConfig) == tuple(n for n in settings(PatchConfig) if n not in OLD_PATCH_LEFT_OUT)


OTHER = {"max_len": 64, "long": "split", "limit": 5, "dtype": "bfloat16", "specials": "exclude", "max_offset": 3,
         "bootstrap": 20, "seed": 1, "prepend_bos": False, "bootstrap_unit": "document", "window": 7,
         "pack": "sentences", "attention": "chunked", "query_chunk": 128, "values": False, "document_field": "doc",
         "importance": "ablate", "ablate_top": 3, "ablate_first": True, "importance_sample": 4, "mask_rate": 0.3,
         "sink": 4, "recent": 8, "examples": 2, "composition": "on", "batch_size": 3, "fdr": 0.1,
         "control": ("random-init",), "control_seeds": 2, "similarity_sample": 4}


@pytest.mark.parametrize("changes", [{}, OTHER], ids=["default", "other"])
def test_the_fingerprint_holds_what_the_hand_list_gave(tiny_models, changes):
    """The settings of a sweep's fingerprint, by the code the hand list fed (scan/plan.py, with the list): equal
    as the dicts a resume compares, and as JSON with sorted keys; only their order is now the fields' order."""
    import json

    from headscan.corpus import texts_corpus
    from headscan.scan.plan import plan_sweep

    for model in tiny_models.values():
        plan = plan_sweep(model, texts_corpus(["the cat sat", "a dog ran"], None),
                          SweepConfig(device="cpu", **changes).for_swept(model.name))
        old = {name: list(value) if isinstance(value := getattr(plan.config, name), tuple) else value
               for name in OLD_FINGERPRINT_FIELDS}
        new = plan.fingerprint["settings"]
        assert new == old
        assert json.dumps(new, sort_keys=True) == json.dumps(old, sort_keys=True)
