"""Every ``headscan.NAME(`` that a reader is told to call exists: in README.md, docs/, the committed runs'
``run.json`` (whose ``command`` a run made in Python records as such a call) and the code that writes those
commands. The names are read from the files, not listed here, so a new documented call is checked as it lands.

Every command has one Python entry point (`headscan.cli_options.ENTRY_POINTS`), named in docs/options.md and
README.md, with an example in its docstring; the command calls it: with ``headscan.NAME`` replaced by a stand-in,
running the command reaches the stand-in. Every registered job (`headscan.scan.jobs`) has ``headscan.NAME`` and a
command, and its entry point runs it through `headscan.scan.runner.run_job`. (That a run's recorded command runs
again: test_recorded_commands.py.)"""

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import headscan
from headscan.cli import cli
from headscan.cli_options import ENTRY_POINTS

ROOT = Path(__file__).resolve().parents[1]
CALL = re.compile(r"\bheadscan\.([A-Za-z_]\w*)\(")


def _calls() -> dict[str, set[str]]:
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "reports").rglob("run.json"),
             *(ROOT / "headscan").rglob("*.py")]
    found: dict[str, set[str]] = {}
    for path in files:
        for name in CALL.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


CALLS = _calls()


def test_the_documented_entry_points_are_found():
    # the scan itself: the calls the docs and the recorded commands are known to hold
    assert {"sweep", "load", "report", "patch", "retrieval", "import_scores"} <= set(CALLS)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_documented_call_exists(name):
    assert callable(getattr(headscan, name, None)), f"headscan.{name} is called in {sorted(CALLS[name])[:3]}"
    assert name in headscan.__all__


# --- every command's Python entry point: documented, importable, and what the command calls ------------------------

OPTIONS_MD = (ROOT / "docs" / "options.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")
COMMITTED_RUN = ROOT / "reports" / "runs" / "ewt-dev"


class Called(Exception):
    """What a stand-in for ``headscan.NAME`` raises: the command reached it, with these arguments."""


def _arguments(command: str, tmp_path, model: str) -> list[str]:
    """The fewest arguments with which `command` gets past its own checks to its entry point."""
    return {
        "sweep": ["-m", model, "--limit", "2", "--out", tmp_path / "s", "--device", "cpu"],
        "retrieval": ["-m", model, "-c", "builtin", "--out", tmp_path / "r", "--device", "cpu"],
        "patch": ["-m", model, "--pairs", tmp_path / "pairs.jsonl", "--out", tmp_path / "p", "--device", "cpu"],
        "pairs": ["ioi", "--n", "2", "--out", tmp_path / "pairs.jsonl"],
        "merge": [tmp_path / "a", tmp_path / "b", "--out", tmp_path / "m"],
        "export": [COMMITTED_RUN, "--out", tmp_path / "e"],
        "import-scores": [tmp_path / "scores.json", "--out", tmp_path / "i"],
        "models": [model],
        "show": [COMMITTED_RUN, "--metric", "prev_token"],
        "report": [COMMITTED_RUN, "--no-models", "--out", tmp_path / "report"],
    }[command]


def test_every_command_has_an_entry_point_the_docs_name():
    assert set(ENTRY_POINTS) == set(cli.commands)
    for command, name in ENTRY_POINTS.items():
        function = getattr(headscan, name)
        assert callable(function) and name in headscan.__all__, name
        assert "Example" in function.__doc__ or ">>>" in function.__doc__, f"headscan.{name}: no example"
        assert f"## headscan {command}\n\nFrom Python: `headscan.{name}`" in OPTIONS_MD, command
        row = next(line for line in README.splitlines() if line.startswith(f"| `headscan {command}")
                   or (command == "pairs" and line.startswith("| `headscan patch")))
        assert f"`headscan.{name}`" in row, (command, row)


@pytest.mark.parametrize("command", sorted(ENTRY_POINTS))
def test_each_command_calls_its_entry_point(command, tiny_gpt2, tmp_path, monkeypatch):
    name = ENTRY_POINTS[command]

    def stand_in(*args, **kwargs):
        raise Called(args, kwargs)

    monkeypatch.setattr(headscan, name, stand_in)  # the command looks headscan.NAME up when it runs
    result = CliRunner().invoke(cli, [command, *map(str, _arguments(command, tmp_path, str(tiny_gpt2)))])
    assert isinstance(result.exception, Called), (result.output, result.exception)


# --- every registered job (headscan.scan.jobs): its entry point imports and runs it through run_job ---------------

JOB_CALLS = {"patch": (["gpt2"], "pairs.jsonl"), "import-scores": ("scores.json",)}  # the fewest arguments of each


def test_every_registered_job_has_an_entry_point_and_a_command():
    from headscan.scan.jobs import registered_jobs

    jobs = registered_jobs()
    assert set(JOB_CALLS) <= set(jobs)
    for job in jobs.values():
        function = getattr(headscan, job.python_name)
        assert callable(function) and "Example" in function.__doc__, job.name
        assert job.name in cli.list_commands(None) and cli.get_command(None, job.name) is not None, job.name


@pytest.mark.parametrize("name", sorted(JOB_CALLS))
def test_each_jobs_entry_point_runs_it_through_run_job(name, monkeypatch):
    import importlib

    from headscan.scan.jobs import registered_jobs

    job = registered_jobs()[name]

    def stand_in(*args, **kwargs):
        raise Called(args, kwargs)

    module = importlib.import_module(job.work.__module__)  # where the job is declared, and its entry point
    monkeypatch.setattr(module, "run_job", stand_in)
    with pytest.raises(Called) as called:
        getattr(headscan, job.python_name)(*JOB_CALLS[name])
    assert called.value.args[0][0] is job
