"""Every command, every --metric that `show` lists and every option at a bad value: the command works, or refuses
in one line (exit 1, a `click.ClickException`) or with click's usage error (exit 2); never a traceback.

The grid is read off the click group itself, so a new command or option is covered without editing this file.
"""

import math
import re

import click
import pytest
from click.testing import CliRunner

from headscan.cli import cli
from headscan.metrics import metric_names

# Values each kind of option may be given by mistake; the ones that turn out valid must simply work.
BAD = {
    click.types.IntParamType: ["-1", "0", "x"],
    click.types.FloatParamType: ["-1", "nan", "x"],
    click.Choice: ["nosuch"],
    click.Path: ["/nonexistent/headscan-test", "/etc/hostname"],
    click.types.StringParamType: ["", "nosuch"],
}


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_gpt2):
    """A sweep of the tiny GPT-2 with no optional table (no syntax, importance, similarity or retrieval)."""
    out = tmp_path_factory.mktemp("every") / "run"
    result = CliRunner().invoke(cli, ["sweep", "-m", str(tiny_gpt2), "--limit", "3", "--out", str(out), "-q",
                                      "--bootstrap", "20", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    return out


def base_arguments(command: str, tiny_gpt2, run, out) -> list[str]:
    """Arguments with which `command` does its work quickly (or refuses for a reason of its own)."""
    return {
        "sweep": ["-m", str(tiny_gpt2), "-c", "builtin", "--limit", "2", "--bootstrap", "20", "-q", "--device", "cpu",
                  "--out", str(out), "--overwrite"],
        # 64 tokens cannot hold a needle: the command checks everything else, then refuses in one line, fast
        "retrieval": ["-m", str(tiny_gpt2), "-c", "builtin", "--lengths", "64", "--bootstrap", "20", "-q",
                      "--device", "cpu", "--out", str(out), "--overwrite"],
        "merge": [str(run), "--out", str(out), "--overwrite"],
        "models": [str(tiny_gpt2)],
        "show": [str(run)],
        "report": [str(run), "--no-models", "-q", "--out", str(out)],
    }[command]


def check_refusal(result, arguments) -> None:
    """Works, or one line: never a traceback, never an exception other than click's own exit."""
    shown = f"headscan {' '.join(arguments)}\n{result.output}"
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"{shown}\n{result.exception!r}"
    assert "Traceback" not in result.output, shown
    assert result.exit_code in (0, 1, 2), shown
    lines = result.output.strip().splitlines()
    if result.exit_code == 1:
        assert len(lines) == 1 and lines[0].startswith("Error: "), shown
    if result.exit_code == 2:
        assert lines[-1].startswith("Error: ") and "Usage:" in result.output, shown


def option_cases():
    for name, command in cli.commands.items():
        for param in command.params:
            if not isinstance(param, click.Option) or param.is_flag:
                continue
            for kind, values in BAD.items():
                if isinstance(param.type, kind):
                    flag = next((o for o in param.opts if o.startswith("--")), param.opts[0])
                    yield from (pytest.param(name, flag, v, id=f"{name}{flag}={v!r}") for v in values)


def test_every_command_has_a_short_help_that_is_not_cut_inside_a_bracket():
    result = CliRunner().invoke(cli, ["--help"])
    listed = re.sub(r"\n\s{4,}", " ", result.output.split("Commands:")[1]).strip().splitlines()  # rejoin wrapped help
    assert {line.split()[0] for line in listed} == set(cli.commands)
    for line in listed:
        assert line.count("(") == line.count(")"), line  # "Find retrieval heads (Wu et al." was cut mid-citation


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_every_option_of_every_command_has_help_and_the_docstring_an_example(name):
    command = cli.commands[name]
    for param in command.params:
        if isinstance(param, click.Option):
            assert (param.help or "").strip(), f"{name} {param.opts[0]} has no help"
    assert "Example:" in (command.help or ""), name


@pytest.mark.parametrize("name, flag, value", list(option_cases()))
def test_every_option_at_a_bad_value_is_taken_or_refused_in_one_line(name, flag, value, tiny_gpt2, run, tmp_path):
    arguments = base_arguments(name, tiny_gpt2, run, tmp_path / "out")
    if flag in arguments:  # the bad value replaces the one the base arguments give
        at = arguments.index(flag)
        del arguments[at:at + 2]
    arguments = [name, *arguments, flag, value]
    check_refusal(CliRunner().invoke(cli, arguments), arguments)


def listed_metrics(run) -> list[str]:
    """The metrics `show` says it takes, read off its own error for an unknown one."""
    result = CliRunner().invoke(cli, ["show", str(run), "--metric", "nosuch"])
    assert result.exit_code == 1
    return [m.strip().rstrip(".") for m in result.output.split("Available:")[1].split(",")]


def test_show_takes_every_metric_it_lists(run):
    metrics = listed_metrics(run)
    assert set(metric_names()) <= set(metrics)
    for metric in metrics:
        arguments = ["show", str(run), "--metric", metric, "--top", "3"]
        result = CliRunner().invoke(cli, arguments)
        check_refusal(result, arguments)
        if result.exit_code == 1:  # only for a table this run lacks, and it says how to get one
            assert re.match(r"Error: this run has no \w+\.parquet, so no '\w+'; .+ to get one$", result.output.strip()), \
                result.output


def test_show_prints_a_profile_as_each_heads_peak(run):
    """offsets crashed with a pandas KeyError: 'metric' on every run; now each head at its highest offset."""
    import pandas as pd

    result = CliRunner().invoke(cli, ["show", str(run), "--metric", "offsets", "--top", "2"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0] == "offsets: each head at the offset where it is highest"
    offsets = pd.read_parquet(run / "offsets.parquet")
    peaks = offsets.loc[offsets.groupby(["layer", "head"])["value"].idxmax()]  # an independent reading
    best = peaks.sort_values(["value", "layer", "head"], ascending=[False, True, True]).iloc[0]
    fields = lines[2].split()
    assert fields[1:5] == [best["label"], str(best["layer"]), str(best["head"]), str(best["offset"])]
    assert math.isclose(float(fields[5]), best["value"], rel_tol=1e-5)


def test_show_says_a_run_has_no_syntax_table_rather_than_calling_syntax_a_profile(run):
    result = CliRunner().invoke(cli, ["show", str(run), "--metric", "syntax"])
    assert result.exit_code == 1
    assert result.output.strip() == ("Error: this run has no syntax.parquet, so no 'syntax'; sweep a CoNLL-U treebank "
                                     "(--corpus FILE.conllu) to get one")
