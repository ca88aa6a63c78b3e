"""The command line end to end: exit codes and the exact one-line errors.

(SIGINT's exit code 130 is tested in test_jobs.py, with a real signal.)
"""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from headscan.cli import cli
from headscan.scan import partial_folder

SWEEP = ["-q", "--device", "cpu", "--bootstrap", "20"]


@pytest.fixture()
def runner():
    return CliRunner()


@pytest.fixture()
def no_model_loads(monkeypatch):
    """Fail the test if any model is loaded: errors must come before the first forward pass."""

    def load_model(*args, **kwargs):
        pytest.fail(f"a model was loaded: {args}")

    monkeypatch.setattr("headscan.scan.controls.load_model", load_model)


def one_line(result) -> str:
    """The output of a failed command: exactly one line, no traceback."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)  # a ClickException, not a crash
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


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
    lines = result.output.strip().splitlines()
    # header, bert's 2 heads, the line naming the thin heads (4 segments: every row is thin), the columns' line,
    # one line for gpt2, which cannot look ahead, the unit
    assert len(lines) == 1 + 2 + 1 + 1 + 1 + 1 and lines[4].startswith("columns | value: next_token in share of attention")
    assert "rest on thin support" in lines[3]
    assert lines[-2] == f"{tiny_gpt2}: next_token: a causal model's queries cannot see later tokens, so it is 0 for every head"
    # one clause, no parentheses inside parentheses (was "(auto: segments, since no document holds two or more
    # (none: each segment is its own document))")
    assert lines[-1] == "intervals resample segments (auto), since each segment is its own document"
    result = runner.invoke(cli, ["show", str(out), "--metric", "prev_token", "--top", "2"])
    shown = result.output.strip().splitlines()  # header + 2 heads per model, a thin heads' line each, columns, unit
    thin = [line for line in shown if "rest on thin support" in line]
    assert len(shown) == 1 + 2 * 2 + len(thin) + 1 + 1 and 1 <= len(thin) <= 2


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["sweep", "--corpus", "missing.txt", "-q"], "Error: missing.txt: no such file; pass a .txt, .jsonl or .conllu file, 'builtin' or 'repeat-random'"),
        (["sweep", "--batch-size", "0", "-q"], "Error: --batch-size must be a whole number >= 1, got 0"),
        (["sweep", "--limit", "0", "-q"], "Error: --limit must be a whole number >= 1, got 0"),
        (["sweep", "--max-offset", "0", "-q"], "Error: --max-offset must be a whole number >= 1, got 0"),
        (["sweep", "--bootstrap", "5", "-q"], "Error: --bootstrap must be 0 (no intervals) or at least 20, got 5: fewer "
                                              "replicates cannot place the 2.5% and 97.5% points"),
        (["sweep", "--shard", "3/3", "-q"], "Error: --shard must be K/N with 0 <= K < N, got '3/3' (K counts from 0)"),
        (["show", "nowhere"], "Error: nowhere: no such folder; pass the --out folder of a `headscan sweep` run"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else "",
)
def test_user_mistakes_are_one_line_errors(runner, arguments, message, tmp_path, monkeypatch, no_model_loads):
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


# --- sweep: settings, models and output folders -----------------------------------------------------------------


def test_bos_takes_only_its_choices(runner):
    result = runner.invoke(cli, ["sweep", "--bos", "maybe", "-q"])
    assert result.exit_code == 2  # click's usage error
    assert result.output.strip().splitlines()[-1] == "Error: Invalid value for '--bos': 'maybe' is not one of 'auto', 'yes', 'no'."


def test_a_model_named_twice_is_refused(runner, tmp_path, tiny_bert, no_model_loads):
    result = runner.invoke(cli, ["sweep", "-m", str(tiny_bert), "-m", str(tiny_bert), "--out", str(tmp_path / "out"), *SWEEP])
    assert one_line(result) == (f"Error: --model: {tiny_bert} named twice; name each model once (their rows would "
                                f"collide)")
    assert not (tmp_path / "out").exists()


def test_a_misspelt_model_gets_did_you_mean_and_nothing_is_swept(runner, tmp_path, tiny_bert, no_model_loads):
    # the good model comes first: it must not be swept before the misspelt one is found
    result = runner.invoke(cli, ["sweep", "-m", str(tiny_bert), "-m", "smollm", "--out", str(tmp_path / "out"), *SWEEP])
    assert one_line(result) == ("Error: model 'smollm' not found: no embedded alias, local path or cached Hugging Face "
                                "model of that name (HF_HUB_OFFLINE is set). Did you mean 'smollm2'? Aliases: minilm, smollm2")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no output, no partial state


def test_a_folder_that_holds_files_is_replaced_only_with_overwrite(runner, tmp_path, tiny_bert, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    arguments = ["sweep", "-m", str(tiny_bert), "--limit", "2", "--out", "full", *SWEEP]
    with monkeypatch.context() as patched:
        patched.setattr("headscan.scan.controls.load_model", lambda *a, **k: pytest.fail("loaded a model"))
        result = runner.invoke(cli, arguments)
    # --overwrite replaces a run, never a folder of one's own files: the first refusal says so, not "pass --overwrite"
    for overwrite in ([], ["--overwrite"]):
        result = runner.invoke(cli, [*arguments, *overwrite])
        assert one_line(result) == ("Error: full: holds files but no run.json, so it is not a headscan run, and "
                                    "--overwrite replaces only a run; choose another --out, or empty the folder")
        assert [p.name for p in (tmp_path / "full").iterdir()] == ["notes.txt"]
    (tmp_path / "full" / "notes.txt").unlink()
    assert runner.invoke(cli, arguments).exit_code == 0  # an empty folder takes a run
    (tmp_path / "full" / "extra.txt").write_text("left by hand in a run")
    (tmp_path / "full" / "mystuff").mkdir()
    with monkeypatch.context() as patched:  # refused before any work, and nothing of the user's deleted
        patched.setattr("headscan.scan.controls.load_model", lambda *a, **k: pytest.fail("loaded a model"))
        result = runner.invoke(cli, [*arguments, "--overwrite"])
    assert one_line(result) == ("Error: full: holds extra.txt, mystuff, which a headscan run does not write, and "
                                "replacing the folder would delete them; move them out, or choose another --out")
    assert {"extra.txt", "mystuff", "run.json"} <= {p.name for p in (tmp_path / "full").iterdir()}
    (tmp_path / "full" / "extra.txt").unlink()
    (tmp_path / "full" / "mystuff").rmdir()
    result = runner.invoke(cli, [*arguments, "--overwrite"])
    assert result.exit_code == 0, result.output
    written = {p.name for p in (tmp_path / "full").iterdir()}
    assert {"heads.parquet", "offsets.parquet", "run.json"} <= written and "extra.txt" not in written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # no staging or old folder left behind


def test_an_output_folder_under_a_file_is_refused_before_any_work(runner, tmp_path, tiny_bert, monkeypatch, no_model_loads):
    # root ignores permissions, so "cannot write" is made with a parent that is a regular file
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    result = runner.invoke(cli, ["sweep", "-m", str(tiny_bert), "--limit", "2", "--out", "afile/out", *SWEEP])
    assert one_line(result) == f"Error: afile/out: {tmp_path / 'afile'} is a file, not a folder; choose another --out"
    assert (tmp_path / "afile").read_text() == "x"


def test_an_output_folder_under_an_executable_file_is_refused_before_any_work(runner, tmp_path, tiny_bert, monkeypatch,
                                                                              no_model_loads):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "script").write_text("#!/bin/sh\n")
    (tmp_path / "script").chmod(0o755)
    result = runner.invoke(cli, ["sweep", "-m", str(tiny_bert), "--limit", "2", "--out", "script/out", *SWEEP])
    assert one_line(result) == f"Error: script/out: {tmp_path / 'script'} is a file, not a folder; choose another --out"


def test_the_current_folder_takes_a_run_and_is_kept(runner, tmp_path, tiny_bert, monkeypatch):
    # "." has no name of its own: the partial states go beside the folder it stands for, and the files into it,
    # so a shell inside it still sees them; replacing it would strand that shell, so that is refused
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(cli, ["sweep", "-m", str(tiny_bert), "--limit", "2", "--out", ".", *SWEEP])
    assert result.exit_code == 0, result.output
    assert Path.cwd() == tmp_path and {"heads.parquet", "run.json"} <= {p.name for p in Path(".").iterdir()}
    assert partial_folder(".") == tmp_path.parent / f"{tmp_path.name}.partial"
    assert not partial_folder(".").exists()
    assert [p.name for p in tmp_path.parent.iterdir() if p.name.startswith(f".{tmp_path.name}")] == []
    result = runner.invoke(cli, ["sweep", "-m", str(tiny_bert), "--limit", "2", "--out", "./", "--overwrite", *SWEEP])
    assert one_line(result) == (f"Error: .: is the folder you are in, and replacing it would leave your shell in a "
                                f"deleted folder; cd to {tmp_path.parent} and pass --out {tmp_path.name}")
    monkeypatch.chdir(tmp_path.parent)
    result = runner.invoke(cli, ["sweep", "-m", str(tiny_bert), "--limit", "2", "--out", tmp_path.name, "--overwrite",
                                 *SWEEP])
    assert result.exit_code == 0, result.output


def _read_only_folder() -> Path | None:
    """A folder this process cannot write in even as root (a read-only mount), or None."""
    for folder in (Path("/sys"), Path("/proc")):
        try:
            (folder / ".headscan-test").mkdir()
        except OSError:
            return folder if folder.is_dir() else None
        (folder / ".headscan-test").rmdir()
    return None


def test_an_output_folder_that_cannot_be_written_is_refused_before_any_work(runner, tmp_path, tiny_bert, monkeypatch,
                                                                             no_model_loads):
    # root passes os.access everywhere, so the check must try a real write; a read-only mount shows it
    folder = _read_only_folder()
    if folder is None:
        pytest.skip("no read-only folder on this machine")
    result = runner.invoke(cli, ["sweep", "-m", str(tiny_bert), "--limit", "2", "--out", str(folder / "x"), *SWEEP])
    assert one_line(result).startswith(f"Error: {folder / 'x'}: cannot write in {folder} (")
    assert one_line(result).endswith("); choose another --out")


@pytest.mark.parametrize(
    "head, line, message",
    [
        ("x", 3, "HEAD column is 'x', expected a whole number; write the ID of the word's head, 0 for the root"),
        ("5", 3, "HEAD is 5 but the sentence has 2 words; use 0 for the root or a word ID from 1 to 2"),
    ],
    ids=["not-a-number", "out-of-range"],
)
def test_a_conllu_file_with_a_bad_head_names_the_file_and_line(runner, tmp_path, tiny_bert, monkeypatch, no_model_loads,
                                                               head, line, message):
    monkeypatch.chdir(tmp_path)
    good = "# sent_id = a\n# text = Dogs bark\n1\tDogs\tdog\tNOUN\t_\t_\t2\tnsubj\t_\t_\n2\tbark\tbark\tVERB\t_\t_\t0\troot\t_\t_\n\n"
    bad = f"# text = It rains\n1\tIt\tit\tPRON\t_\t_\t0\troot\t_\t_\n2\trains\train\tVERB\t_\t_\t{head}\tdep\t_\t_\n\n"
    Path("trees.conllu").write_text(good + bad)
    line += good.count("\n")  # the bad word line, counted from the top of the file
    result = runner.invoke(cli, ["sweep", "-m", str(tiny_bert), "--corpus", "trees.conllu", "--out", "out", *SWEEP])
    assert one_line(result) == f"Error: trees.conllu, line {line}: {message}"
    assert not Path("out").exists()


# --- show and merge on damaged or foreign folders ---------------------------------------------------------------


@pytest.fixture(scope="module")
def a_run(tmp_path_factory, tiny_bert) -> Path:
    from headscan.scan import sweep

    out = tmp_path_factory.mktemp("cli-run") / "run"
    sweep(str(tiny_bert), "builtin", out, limit=3, device="cpu", bootstrap=20)
    return out


@pytest.fixture()
def damaged(a_run, tmp_path, monkeypatch):
    """A copy of `a_run` as ./run, to damage."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(a_run, tmp_path / "run")
    return Path("run")


def test_show_on_a_truncated_heads_parquet(runner, damaged):
    data = (damaged / "heads.parquet").read_bytes()
    (damaged / "heads.parquet").write_bytes(data[: len(data) // 2])
    line = one_line(runner.invoke(cli, ["show", str(damaged)]))
    # the middle is pyarrow's own reason, whose wording is pyarrow's
    assert line.startswith("Error: run/heads.parquet: not a readable parquet file (") and line.endswith("); sweep again")


def test_show_on_a_broken_run_json(runner, damaged):
    (damaged / "run.json").write_text('{"run_id": ')
    assert one_line(runner.invoke(cli, ["show", str(damaged)])) == (
        "Error: run/run.json: broken JSON (Expecting value: line 1 column 12 (char 11)); the tables' own copy of it is "
        "in their parquet metadata, or sweep again")


def test_show_on_a_run_json_that_is_not_an_object(runner, damaged):
    (damaged / "run.json").write_text("[1, 2]\n")
    assert one_line(runner.invoke(cli, ["show", str(damaged)])) == "Error: run/run.json: expected a JSON object; sweep again"


def test_show_on_a_run_without_its_heads_parquet(runner, damaged):
    (damaged / "heads.parquet").unlink()
    assert one_line(runner.invoke(cli, ["show", str(damaged)])) == (
        "Error: run: has no heads.parquet, retrieval.parquet or patching.parquet; is it the --out folder of a "
        "`headscan sweep`, `headscan retrieval` or `headscan patch` run?")


def test_show_on_a_folder_that_is_not_a_run(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("photos").mkdir()
    Path("photos/cat.jpg").write_bytes(b"\xff\xd8")
    assert one_line(runner.invoke(cli, ["show", "photos"])) == (
        "Error: photos: has no heads.parquet, retrieval.parquet or patching.parquet; is it the --out folder of a "
        "`headscan sweep`, `headscan retrieval` or `headscan patch` run?")


def test_show_on_a_parquet_file_of_another_kind(runner, damaged):
    pd.DataFrame({"a": [1, 2]}).to_parquet(damaged / "heads.parquet")
    line = one_line(runner.invoke(cli, ["show", str(damaged)]))
    assert line.startswith("Error: run/heads.parquet: not a headscan heads table (heads table is missing columns ['model', ")


@pytest.fixture(scope="module")
def shard_runs(tmp_path_factory, tiny_bert) -> Path:
    from headscan.scan import sweep

    root = tmp_path_factory.mktemp("cli-shards")
    for k in range(3):
        sweep(str(tiny_bert), "builtin", root / f"part-{k}", shard=f"{k}/3", limit=6, device="cpu", bootstrap=20)
    return root


def test_merge_with_a_missing_shard(runner, shard_runs, monkeypatch):
    monkeypatch.chdir(shard_runs)
    result = runner.invoke(cli, ["merge", "part-0", "part-2", "--out", "merged"])
    assert one_line(result) == "Error: shards 1/3 are missing; merge needs all 3"
    assert not (shard_runs / "merged").exists()
    result = runner.invoke(cli, ["merge", "part-0", "part-1", "part-2", "--out", "merged"])
    assert result.exit_code == 0 and result.output == "merged 3 runs into merged\n"


def test_merge_with_a_shard_folder_that_does_not_exist(runner, shard_runs, monkeypatch):
    monkeypatch.chdir(shard_runs)
    result = runner.invoke(cli, ["merge", "part-0", "part-9", "part-2", "--out", "elsewhere"])
    assert one_line(result) == "Error: part-9: no such folder; pass the --out folder of a `headscan sweep` run"
    assert not (shard_runs / "elsewhere").exists()
