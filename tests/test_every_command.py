"""Every command, every --metric that `show` lists and every option at a bad value, on runs that lack each optional
table: the command works, or refuses in one line (exit 1, a `click.ClickException`) or with click's usage error
(exit 2); never a traceback, and never a message that contradicts --help.

The grid is read off the click group itself, so a new command, option, choice or table is covered without editing
this file (a new table must be present in one of the runs below and absent from another: a test says so).
"""

import json
import math
import re
from pathlib import Path

import click
import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import treebank_corpus

from headscan.cli import cli
from headscan.metrics import METRICS, metric_names
from headscan.tables import TABLES

# Values each kind of option may be given by mistake; the ones that turn out valid must simply work.
BAD = {
    click.types.IntParamType: ["-1", "0", "x"],
    click.types.FloatParamType: ["-1", "nan", "x"],
    click.Choice: ["nosuch"],
    click.Path: ["/nonexistent/headscan-test", "/etc/hostname"],
    click.types.StringParamType: ["", "nosuch"],
}
SWEEP = ["-q", "--device", "cpu", "--bootstrap", "20"]
# Where each score `show` takes lives, written out here rather than read from headscan's own lookup.
TABLE_OF = {**{name: metric.table for name, metric in METRICS.items()}, "copying": "weights", "patching": "patching"}


def invoke(arguments):
    return CliRunner().invoke(cli, [str(a) for a in arguments])


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_gpt2, tiny_bert) -> dict:
    """Small runs on the tiny checkpoints, between them lacking every optional table (see the test below)."""
    tmp = tmp_path_factory.mktemp("every")
    treebank = treebank_corpus(tmp, 9)
    made = {
        # heads, offsets, positions, value, weights; no syntax, importance, similarity or retrieval
        "plain": ["sweep", "-m", tiny_gpt2, "--limit", "3", *SWEEP],
        # no value.parquet, and dla not scored
        "no-values": ["sweep", "-m", tiny_gpt2, "--limit", "3", "--no-values", *SWEEP],
        # every table a sweep writes: syntax (CoNLL-U), importance, similarity and similarity_across (two models)
        "treebank": ["sweep", "-m", tiny_gpt2, "-m", tiny_bert, "-c", treebank, "--importance", "atp",
                     "--similarity-sample", "3", *SWEEP],
        # retrieval, retrieval_trials and the masking tables, and none of a sweep's tables; 124 + 5 - 1 tokens fill
        # the 128 positions
        "retrieval": ["retrieval", "-m", tiny_gpt2, "-c", "builtin", "--lengths", "124", "--max-new-tokens", "5",
                      "--depths", "0,1", "--bootstrap", "20", "-q", "--device", "cpu", "--mask-top", "1",
                      "--mask-random", "1", "--mask-draws", "1"],
        "part-0": ["sweep", "-m", tiny_gpt2, "--limit", "4", "--shard", "0/2", *SWEEP],
        "part-1": ["sweep", "-m", tiny_gpt2, "--limit", "4", "--shard", "1/2", *SWEEP],
    }
    pairs = tmp / "pairs.jsonl"
    result = invoke(["pairs", "induction", "--n", "4", "-m", tiny_gpt2, "--out", pairs])
    assert result.exit_code == 0, result.output
    # patching and paths, and none of a sweep's tables
    made["patched"] = ["patch", "-m", tiny_gpt2, "--pairs", pairs, "--paths", "L0H0>L1H0:k", "--bootstrap", "20", "-q",
                       "--device", "cpu"]
    for name, arguments in made.items():
        result = invoke([*arguments, "--out", tmp / name])
        assert result.exit_code == 0, f"{name}: {result.output}"
    return {name: tmp / name for name in made}



def tables_of(run) -> set[str]:
    return {name for name, table in TABLES.items() if (run / table.file).exists()}


# --- what a refusal may say --------------------------------------------------------------------------------------


def flags_of(command: click.Command) -> set[str]:
    return {o for p in command.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}


ALL_FLAGS = set().union(*(flags_of(c) for c in cli.commands.values()), {"--help", "--version"})


def check_refusal(result, arguments) -> None:
    """Works, or one line: never a traceback, never an exception other than click's own exit; and every flag the
    line names is one --help lists: the command's own, or that of a command the line names ("headscan sweep
    --values", "sweep it with --shard K/N")."""
    shown = f"headscan {' '.join(map(str, arguments))}\n{result.output}"
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"{shown}\n{result.exception!r}"
    assert "Traceback" not in result.output, shown
    assert "Empty DataFrame" not in result.output, shown  # a table of nothing is no answer
    assert result.exit_code in (0, 1, 2), shown
    lines = result.output.strip().splitlines()
    if result.exit_code == 1:
        assert len(lines) == 1 and lines[0].startswith("Error: "), shown
        command = cli.commands[str(arguments[0])]
        others = set(re.findall(r"\w+", lines[0])) & set(cli.commands)  # the commands the line names
        allowed = flags_of(command).union(*(flags_of(cli.commands[o]) for o in others))
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", lines[0]))
        assert named <= allowed, f"{shown}\nnames {sorted(named - allowed)}, which `headscan {arguments[0]} " \
                                 f"--help` does not list"
    if result.exit_code == 2:
        assert lines[-1].startswith("Error: ") and "Usage:" in result.output, shown


# --- the grid ----------------------------------------------------------------------------------------------------


def base_arguments(command: str, tiny_gpt2, runs, out) -> list:
    """Arguments with which `command` does its work quickly (or refuses for a reason of its own)."""
    pairs = runs["plain"].parent / "pairs.jsonl"
    return {
        "patch": ["-m", tiny_gpt2, "--pairs", pairs, "--bootstrap", "20", "-q", "--device", "cpu", "--out", out,
                  "--overwrite"],
        "pairs": ["induction", "--n", "4", "-m", tiny_gpt2, "--out", out, "--overwrite"],
        "sweep": ["-m", tiny_gpt2, "-c", "builtin", "--limit", "2", *SWEEP, "--out", out, "--overwrite"],
        # 64 tokens cannot hold a needle: the command checks everything else, then refuses in one line, fast
        "retrieval": ["-m", tiny_gpt2, "-c", "builtin", "--lengths", "64", "--bootstrap", "20", "-q",
                      "--device", "cpu", "--out", out, "--overwrite"],
        "merge": [runs["part-0"], runs["part-1"], "--out", out, "--overwrite"],
        "models": [tiny_gpt2],
        "show": [runs["plain"]],
        "report": [runs["plain"], "--no-models", "-q", "--out", out],
        "export": [runs["plain"], "--out", out, "--overwrite"],
        "import-scores": [published_scores(Path(out).parent), "--out", out, "--overwrite", "--bootstrap", "20"],
    }[command]


def published_scores(folder: Path) -> Path:
    """A Retrieval_Head head_score file of 2 layers x 2 heads over 3 trials."""
    path = folder / "published.json"
    path.write_text(json.dumps({f"{layer}-{head}": [0.1 * layer, 0.5, 0.2 * head] for layer in (0, 1) for head in (0, 1)}))
    return path


def option_cases():
    """Every option of every command at each bad value of its kind, and a Choice at each of its own choices."""
    for name, command in cli.commands.items():
        for param in command.params:
            if not isinstance(param, click.Option) or param.is_flag:
                continue
            flag = next((o for o in param.opts if o.startswith("--")), param.opts[0])
            for kind, values in BAD.items():
                if isinstance(param.type, kind):
                    yield from (pytest.param(name, flag, v, id=f"{name}{flag}={v!r}") for v in values)
            if isinstance(param.type, click.Choice):  # what --help offers must be taken, or refused in one line
                yield from (pytest.param(name, flag, v, id=f"{name}{flag}={v}") for v in param.type.choices)


def test_every_run_lacks_and_holds_each_table(runs):
    """The runs the tests below use cover every table: each is absent from one run (show and report must say so)
    and present in another (show must print it)."""
    held = {name: tables_of(run) for name, run in runs.items()}
    for table in TABLES:
        assert any(table in h for h in held.values()), f"no run holds {table}.parquet: add one to `runs`"
        assert any(table not in h for h in held.values()), f"every run holds {table}.parquet"


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
def test_every_option_at_a_bad_value_is_taken_or_refused_in_one_line(name, flag, value, tiny_gpt2, runs, tmp_path):
    arguments = base_arguments(name, tiny_gpt2, runs, tmp_path / "out")
    if flag in arguments:  # the value replaces the one the base arguments give
        at = arguments.index(flag)
        del arguments[at:at + 2]
    arguments = [name, *arguments, flag, value]
    result = invoke(arguments)
    check_refusal(result, arguments)
    if value in getattr(next(p for p in cli.commands[name].params if flag in p.opts).type, "choices", ()):
        assert "nosuch" not in result.output and not re.search(r"not one of|invalid choice", result.output), \
            result.output  # a choice --help lists is never called unknown


@pytest.mark.parametrize("command", ["show", "report", "merge", "export"])
def test_the_commands_that_read_runs_work_or_refuse_in_one_line_on_every_run(command, runs, tmp_path):
    cases = [*runs.items(), ("sweep and retrieval", f"{runs['plain']} {runs['retrieval']}")]
    for i, (name, run) in enumerate(cases):
        arguments = {"show": ["show", run],
                     "report": ["report", run, "--no-models", "-q", "--out", tmp_path / f"report-{i}"],
                     "merge": ["merge", run, "--out", tmp_path / f"merged-{i}"],
                     "export": ["export", run, "--out", tmp_path / f"export-{i}"]}[command]
        arguments = [part for a in arguments for part in (str(a).split(" ") if a == run else [a])]
        result = invoke(arguments)
        check_refusal(result, arguments)
        # show takes every run; report every sweep, and a retrieval or patching run beside a sweep of its model only
        if command == "show" and " " not in name or command == "report" and name not in ("retrieval", "patched"):
            assert result.exit_code == 0, result.output


def listed_metrics(run) -> list[str]:
    """The metrics `show` says it takes, read off its own error for an unknown one."""
    result = invoke(["show", run, "--metric", "nosuch"])
    assert result.exit_code == 1, result.output
    return [m.strip().rstrip(".") for m in result.output.split("Available:")[1].split(",")]


def test_show_lists_every_metric_its_help_names(runs):
    """Every metric `show --help` names is one it lists, and it lists each registered metric and copying."""
    listed = listed_metrics(runs["plain"])
    assert set(metric_names()) | set(TABLE_OF) == set(listed)
    help_text = " ".join(invoke(["show", "--help"]).output.split())
    named = set(re.findall(r"[a-z_]+", help_text.split("--metric NAME")[1].split("--top")[0]))
    assert {"offsets", "syntax", "importance", "copying", "retrieval", "retrieval_ungated"} <= named & set(listed)


@pytest.mark.parametrize("name", ["plain", "no-values", "treebank", "retrieval", "patched"])
def test_show_takes_every_metric_it_lists_on_every_run(name, runs):
    """A metric whose table the run holds prints; one whose table it lacks says so and how to get one."""
    run = runs[name]
    held = tables_of(run)
    for metric in listed_metrics(run):
        arguments = ["show", run, "--metric", metric, "--top", "3"]
        result = invoke(arguments)
        check_refusal(result, arguments)
        if TABLE_OF[metric] in held:
            assert result.exit_code == 0, result.output
        else:
            assert result.exit_code == 1
            assert re.match(rf"Error: this run has no {TABLE_OF[metric]}\.parquet, so no '{metric}'; .+ to get one",
                            result.output.strip()), result.output


def test_show_prints_a_profile_as_each_heads_peak(runs):
    """offsets crashed with a pandas KeyError: 'metric' on every run; now each head at its highest offset."""
    run = runs["plain"]
    result = invoke(["show", run, "--metric", "offsets", "--top", "2"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0] == "offsets: each head at the offset where it is highest"
    assert lines[1].split()[-2:] == ["no", "claim"]
    offsets = pd.read_parquet(run / "offsets.parquet")
    peaks = offsets.loc[offsets.groupby(["layer", "head"])["value"].idxmax()]  # an independent reading
    best = peaks.sort_values(["value", "layer", "head"], ascending=[False, True, True]).iloc[0]
    fields = lines[2].split()
    assert fields[1:5] == [best["label"], str(best["layer"]), str(best["head"]), str(best["offset"])]
    assert math.isclose(float(fields[5]), best["value"], rel_tol=1e-5)


def test_show_says_a_run_has_no_syntax_table_rather_than_calling_syntax_a_profile(runs):
    result = invoke(["show", runs["plain"], "--metric", "syntax"])
    assert result.exit_code == 1
    assert result.output.strip() == ("Error: this run has no syntax.parquet, so no 'syntax'; sweep a CoNLL-U treebank "
                                     "(headscan sweep --corpus FILE.conllu) to get one")


def test_show_says_why_a_metric_is_undefined_for_every_head_instead_of_an_empty_table(runs):
    """streaming on segments shorter than --sink + --recent, dla without --values, retrieval when no trial passed
    printed pandas' "Empty DataFrame"; now one line per model, saying why."""
    streaming = invoke(["show", runs["plain"], "--metric", "streaming"]).output.splitlines()[0]
    assert streaming.endswith(": streaming: undefined for every head: no query lies at or past position sink + "
                              "recent (64 + 256); give headscan sweep longer segments, or a smaller --sink and "
                              "--recent")
    dla = invoke(["show", runs["no-values"], "--metric", "dla"]).output.splitlines()[0]
    assert dla.endswith(": dla: undefined for every head: dla off (values=False); headscan sweep --values scores it")


def test_a_retrieval_run_says_its_intervals_resample_trials(runs):
    """A retrieval run's note said "intervals resample segments (trial: ...)": its unit is the trial."""
    result = invoke(["show", runs["retrieval"], "--metric", "retrieval_ungated"])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == ("intervals resample trials: each needle-in-a-haystack trial is "
                                                       "one unit (its own prompt and decoding)")


def test_retrieval_refuses_lengths_whose_answer_would_pass_the_context(tiny_gpt2, tmp_path):
    """124 + 5 - 1 positions fit the tiny model's 128 (the runs above); 125 decoded past them: an IndexError
    traceback from the position embedding, after the model loaded."""
    arguments = ["retrieval", "-m", tiny_gpt2, "-c", "builtin", "--lengths", "125", "--max-new-tokens", "5",
                 "--depths", "0", "--bootstrap", "0", "-q", "--device", "cpu", "--out", tmp_path / "out"]
    result = invoke(arguments)
    check_refusal(result, arguments)
    assert result.output.strip() == (f"Error: --lengths: 125 tokens and --max-new-tokens 5 pass {tiny_gpt2}'s context "
                                     f"(128 tokens); use --lengths of at most 124 (or fewer --max-new-tokens)")


def float_counts_copy(run, folder):
    """A copy of `run` whose parquet files hold count and units as float64, as older headscan wrote them; each
    file's metadata (its provenance) kept, so headscan still reads it as that run's."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(run, folder)
    for path in folder.glob("*.parquet"):
        table = pq.read_table(path)
        for column in ("count", "units"):
            at = table.schema.get_field_index(column)
            table = table.set_column(at, pa.field(column, pa.float64()), table.column(column).cast(pa.float64()))
        # headscan's own metadata kept; pandas' (which would read the floats back as Int64) left out
        metadata = {k: v for k, v in pq.read_schema(path).metadata.items() if k != b"pandas"}
        pq.write_table(table.replace_schema_metadata(metadata), path)
    return folder


def test_counts_and_units_are_whole_numbers_however_a_table_is_made(runs, tmp_path):
    """count and units were float64 (4602.0 in show and in every parquet file); now Int64 in what sweep, retrieval,
    merge, merge_tables and load give, and a run written with float counts still loads, its numbers unchanged."""

    from headscan.tables import load, merge_tables

    merged = tmp_path / "merged"
    assert invoke(["merge", runs["part-0"], runs["part-1"], "--out", merged]).exit_code == 0
    parts = [load(runs["part-0"]), load(runs["part-1"])]
    old = float_counts_copy(runs["treebank"], tmp_path / "old")  # as headscan wrote counts before they were whole
    made = {name: load(runs[name]) for name in ("plain", "treebank", "retrieval")}
    made |= {"merge": load(merged), "merge_tables": merge_tables(parts), "old": load(old)}
    for name, run in made.items():
        for table, frame in run.frames.items():
            for column in ("count", "units"):
                assert frame[column].dtype == "Int64", f"{name} {table}.{column}: {frame[column].dtype}"
            if name not in ("old", "merge_tables"):  # the file itself, read without headscan
                raw = pd.read_parquet(run.path / TABLES[table].file, columns=["count", "units"])
                assert all(raw[c].dtype.kind == "i" for c in raw), f"{name} {table}: {raw.dtypes.to_dict()}"
    for table, frame in made["old"].frames.items():  # the same numbers as the file's floats
        raw = pd.read_parquet(old / TABLES[table].file, columns=["count", "units"])
        for column in ("count", "units"):
            assert raw[column].dtype == "float64"
            pd.testing.assert_series_equal(frame[column].astype("float64"), raw[column], check_names=False)
    # merge_tables adds the two shards' counts: the merge's (one independent sum, read from the files)
    counts = sum(pd.read_parquet(runs[p] / "heads.parquet")["count"].to_numpy() for p in ("part-0", "part-1"))
    assert (made["merge_tables"]["heads"]["count"].to_numpy() == counts).all()
    assert (made["merge"]["heads"]["count"].to_numpy() == counts).all()
    shown = invoke(["show", runs["plain"], "--top", "1"]).output.splitlines()
    assert re.fullmatch(r"\d+", shown[1].split()[shown[0].split().index("count")]), shown
