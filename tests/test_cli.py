"""The command line end to end: exit codes and the exact one-line errors."""

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from headscan.cli import cli


@pytest.fixture()
def runner():
    return CliRunner()


def test_sweep_then_show(runner, tmp_path, tiny_gpt2, tiny_bert):
    out = tmp_path / "out"
    result = runner.invoke(cli, ["sweep", "-m", str(tiny_gpt2), "-m", str(tiny_bert), "--limit", "4", "--out", str(out), "-q", "--bootstrap", "20", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "top heads by prev_token" in result.output
    heads = pd.read_parquet(out / "heads.parquet")
    assert heads["model"].nunique() == 2
    assert json.loads((out / "run.json").read_text())["command"].startswith("cli sweep --model ")
    result = runner.invoke(cli, ["show", str(out), "--metric", "next_token", "--top", "2"])
    assert result.exit_code == 0
    assert len(result.output.strip().splitlines()) == 1 + 2 * 2  # header + 2 heads per model


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["sweep", "--corpus", "missing.txt", "-q"], "Error: missing.txt: no such file; pass a .txt, .jsonl or .conllu file, 'builtin' or 'repeat-random'"),
        (["sweep", "--batch-size", "0", "-q"], "Error: --batch-size must be a whole number >= 1, got 0"),
        (["show", "nowhere"], "Error: nowhere: no such folder; pass the --out folder of a `headscan sweep` run"),
    ],
)
def test_user_mistakes_are_one_line_errors(runner, arguments, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(cli, arguments)
    assert result.exit_code == 1
    assert result.output.strip() == message
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_empty_corpus_is_refused_before_any_model_loads(runner, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    result = runner.invoke(cli, ["sweep", "--corpus", str(empty), "--out", str(tmp_path / "out"), "-q"])
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: {empty}: holds only blank lines; put one segment on each line"


def test_unknown_metric_in_show(runner, tmp_path, tiny_bert):
    out = tmp_path / "out"
    runner.invoke(cli, ["sweep", "-m", str(tiny_bert), "--limit", "2", "--out", str(out), "-q", "--device", "cpu"])
    result = runner.invoke(cli, ["show", str(out), "--metric", "prev_tokens"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: unknown metric 'prev_tokens'. Did you mean 'prev_token'?")


def test_models_lists_the_aliases(runner):
    result = runner.invoke(cli, ["models"])
    assert result.exit_code == 0
    assert result.output.startswith("minilm") and "smollm2" in result.output


def test_every_command_has_help_ending_with_an_example(runner):
    for name, command in cli.commands.items():
        result = runner.invoke(cli, [name, "--help"])
        assert result.exit_code == 0
        assert "Example:" in command.help, name


def test_python_dash_m_works():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "headscan", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "sweep" in result.stdout


def test_sweep_and_report_in_fresh_interpreters(tmp_path, tiny_bert):
    """As a user runs them: each command in a new process, nothing imported beforehand."""
    import subprocess
    import sys

    out, report = tmp_path / "out", tmp_path / "report"
    for arguments in (["sweep", "-m", str(tiny_bert), "--limit", "3", "--out", str(out), "-q", "--device", "cpu"],
                      ["report", str(out), "--out", str(report)]):
        result = subprocess.run([sys.executable, "-m", "headscan", *arguments], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
    assert (report / "index.html").is_file() and (report / "figures" / "looking_both_ways.png").is_file()
