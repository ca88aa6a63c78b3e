"""The commands the committed runs record (reports/runs/*/run.json) run as written with today's command line.

Each recorded command is parsed by the real command's own parser (click), as a shell would hand it over: an
option `--help` no longer lists (an old spelling kept working is not listed either), or a value it refuses,
fails. Then the parsed settings are compared with the settings the run records (`config`): replayed, the command
would sweep with the settings the run was swept with. A command that repeats an option click keeps only once
(``--lengths 1024 --lengths 2048``) would replay another run, and fails here.

And a run's recorded command runs: a sweep made by the command line, its recorded command run again into another
folder, and one made in Python, its recorded ``headscan.sweep(...)`` call evaluated with another ``out``, make
the same tables to the bit.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import shlex
from pathlib import Path

import click
import pandas as pd
import pytest
from click.testing import CliRunner

import headscan
from headscan.cli import cli
from headscan.cli_options import config_from, shown_opts
from headscan.config import SweepConfig
from headscan.patching_config import PatchConfig
from headscan.retrieval_config import RetrievalConfig

ROOT = Path(__file__).resolve().parents[1]
RUNS = sorted(ROOT.glob("reports/runs/*/run.json"))
CONFIGS = {"sweep": SweepConfig, "retrieval": RetrievalConfig, "patch": PatchConfig}


def recorded(path: Path) -> tuple[str, list[str]]:
    """The command name and its arguments, from a run's recorded command line (``python -m headscan sweep ...``
    or ``headscan retrieval ...``)."""
    words = shlex.split(json.loads(path.read_text())["command"])
    start = next(i for i, word in enumerate(words) if word in cli.commands)
    assert words[start - 1] == "headscan", words[: start + 1]
    return words[start], words[start + 1:]


def test_there_are_committed_runs_to_check():
    assert {path.parent.name for path in RUNS} >= {"ewt-dev", "retrieval-smollm2", "retrieval-mask-smollm2"}


@pytest.mark.parametrize("path", RUNS, ids=[path.parent.name for path in RUNS])
def test_a_recorded_command_uses_only_options_help_lists(path):
    name, arguments = recorded(path)
    command = cli.commands[name]
    listed = {flag for parameter in command.params for flag in shown_opts(parameter)}
    listed |= {flag for parameter in command.params for flag in getattr(parameter, "secondary_opts", [])}
    flags = [word.split("=")[0] for word in arguments if word.startswith("-")]
    assert [flag for flag in flags if flag not in listed] == [], f"{path}: options --help does not list"
    with command.make_context(name, list(arguments)) as context:  # click's own refusals: unknown option, bad value
        assert Path(context.params["out"]).as_posix() == path.parent.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", RUNS, ids=[path.parent.name for path in RUNS])
def test_a_recorded_command_replays_the_settings_the_run_records(path):
    name, arguments = recorded(path)
    run = json.loads(path.read_text())
    try:
        context = cli.commands[name].make_context(name, list(arguments))
    except click.ClickException as error:
        pytest.fail(f"{path}: {error.format_message()}")
    parsed = dataclasses.asdict(config_from(CONFIGS[name], context.params))
    differing = {}
    for key, value in run["config"].items():
        if key not in parsed:
            continue
        mine = list(parsed[key]) if isinstance(parsed[key], tuple) else parsed[key]
        if key == "bootstrap_unit" and mine == "auto":  # the run records the unit "auto" chose
            continue
        if mine != value:
            differing[key] = (mine, value)
    assert differing == {}, f"{path}: the command would replay (parsed, recorded): {differing}"


@pytest.mark.parametrize("arguments", [
    ["retrieval", "-m", "smollm2", "-c", "builtin", "--lengths", "1024,2048", "--depths", "0,0.5,1", "--out", "o"],
    ["sweep", "-m", "minilm", "-m", "smollm2", "--control", "random-init", "--control", "shuffled-words", "--no-values"],
    ["merge", "a", "b", "--out", "o"],
], ids=["lists-of-numbers", "repeated-options", "arguments"])
def test_the_command_a_run_records_replays_its_own_settings(arguments):
    from headscan.cli import _effective_command

    name = arguments[0]
    with cli.commands[name].make_context(name, arguments[1:]) as context:
        line = _effective_command(context)
        first = dict(context.params)
    words = shlex.split(line)
    assert words[0] == name
    with cli.commands[name].make_context(name, words[1:]) as replayed:
        assert replayed.params == first, line


# --- a run's recorded command, run again, makes the same tables ----------------------------------------------------

SWEEP = ["--limit", "3", "--device", "cpu", "--bootstrap", "20", "-q"]


def _same_tables(a: Path, b: Path) -> None:
    first, second = headscan.load(a), headscan.load(b)
    assert list(first.frames) == list(second.frames)
    for name in first.frames:
        pd.testing.assert_frame_equal(first[name], second[name], check_exact=True)


def _elsewhere(arguments: list[str], out: Path) -> list[str]:
    """`arguments` with the value of --out replaced by `out`."""
    at = arguments.index("--out") + 1
    return [*arguments[:at], str(out), *arguments[at + 1:]]


def test_a_sweeps_recorded_command_runs_again_to_the_same_tables(tiny_gpt2, tmp_path):
    first = tmp_path / "first"
    made = CliRunner().invoke(cli, ["sweep", "-m", str(tiny_gpt2), "--out", str(first), *SWEEP], prog_name="headscan")
    assert made.exit_code == 0, made.output
    name, arguments = recorded(first / "run.json")
    again = CliRunner().invoke(cli, [name, *_elsewhere(arguments, tmp_path / "again")], prog_name="headscan")
    assert again.exit_code == 0, again.output
    _same_tables(first, tmp_path / "again")


def test_a_python_sweeps_recorded_call_runs_again_to_the_same_tables(tiny_gpt2, tmp_path):
    first = headscan.sweep(str(tiny_gpt2), "builtin", tmp_path / "first", limit=3, device="cpu", bootstrap=20)
    call = ast.parse(first.provenance.command, mode="eval")
    assert ast.unparse(call.body.func) == "headscan.sweep"
    [out] = [keyword for keyword in call.body.keywords if keyword.arg == "out"]
    out.value = ast.Constant(str(tmp_path / "again"))
    eval(compile(ast.fix_missing_locations(call), "run.json", "eval"), {"headscan": headscan})  # noqa: S307  the run's own record
    _same_tables(tmp_path / "first", tmp_path / "again")
