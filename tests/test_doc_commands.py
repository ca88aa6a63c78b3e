"""Every command a reader would copy from README.md and docs/*.md runs as written, or at least parses.

A command block is a fenced block marked ``sh``, ``bash`` or ``shell``, or not marked at all (a synopsis that is
not meant to be run is marked ``text``). Its lines (continuations joined, comments dropped, ``VAR=value``, ``env``
and ``nice`` prefixes taken off, a shell loop's body taken with its variable set) are checked by what they call:

- ``headscan COMMAND ...``: parsed by that command's own click parser, so an option ``--help`` does not list or a
  value the option refuses fails; each input it names (a corpus, pairs, needles, a metric module, a checkpoints
  folder, the runs it reads) must exist from the checkout, be written by a command of the docs (its ``--out``, a
  ``>`` redirection), or be one of the few placeholders for the reader's own files below. ``headscan models``
  (no model is loaded) and ``--help`` run for real, in a temporary folder;
- ``python SCRIPT ...``: the script exists and declares each option given (its argparse source names it);
- ``make TARGET``: the Makefile has the target;
- a shell pipeline (``grep ... > FILE``) runs for real in a temporary folder where its input files exist as the
  docs name them, on a few lines of the treebank;
- ``git clone``: not run (it fetches from the network).

Real sweeps are not run here: they load real models over the treebank (minutes to hours); their parse is what
this test can check in a minute.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from headscan.cli import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
SHELL = {"sh", "bash", "shell", ""}
# The reader's own files, which no command of the docs writes: each page says what they stand for.
PLACEHOLDERS = {
    "big.conllu": "docs/distributed.md: a corpus too big for one machine",
    "runs/tiny": "docs/checkpoints.md: the reader's own folder of training checkpoints",
    "head_score/llama-2-7b-80k.json": "Retrieval_Head's published scores, downloaded by the reader",
}
# Option values that are inputs: they must exist (or be written first).
INPUTS = {"corpus", "pairs", "needles", "metric_modules", "checkpoints", "select_pairs", "runs", "run", "shards",
          "scores"}
NOT_FILES = re.compile(r"builtin|repeat-random(:.*)?|hf:.*")
# Shell variables the docs' loops and job scripts use, set as one iteration would set them.
VARIABLES = {"k": "0", "SLURM_ARRAY_TASK_ID": "0"}


def blocks() -> list[tuple[Path, int, str]]:
    """Each command block: its page, its first line's number, and its text."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) in SHELL:
                found.append((page, text[: match.start()].count("\n") + 2, match.group(2)))
    return found


def _uncommented(line: str) -> str:
    """`line` without its comment: from the first ``#`` outside quotes that starts a word."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _operators(line: str) -> set[str]:
    """The shell operators of `line` outside quotes (|, >, ;, &)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    return {token for token in lexer if token and set(token) <= set("|&;<>")}


def commands(block: str) -> list[str]:
    """The block's commands, one string each: continuations joined, comments and prefixes dropped, a loop's body
    taken out of it, its variables set."""
    lines, joined = [], ""
    for line in block.splitlines():
        joined += _uncommented(line) if not line.rstrip().endswith("\\") else line.rstrip()[:-1] + " "
        if line.rstrip().endswith("\\"):
            continue
        lines.append(joined.strip())
        joined = ""
    found = []
    for line in filter(None, lines):
        loop = re.fullmatch(r"for \w+ in [^;]*; do (.*?)[\s&;]*done(; wait)?", line)
        line = loop.group(1) if loop else line
        for name, value in VARIABLES.items():
            line = line.replace(f"${name}", value)
        if _operators(line):  # a pipeline, kept as the shell reads it
            found.append(line)
            continue
        words = shlex.split(line)
        while words and (re.fullmatch(r"\w+=.*", words[0]) or words[0] == "env"):
            words = words[1:]
        if words[:2] == ["nice", "-n"]:
            words = words[3:]
        while words and re.fullmatch(r"\w+=.*", words[0]) or words[:1] == ["env"]:
            words = words[1:]
        found.append(shlex.join(words))
    return found


def every_command() -> list[tuple[str, str]]:
    """(where, command) for every command of every block."""
    return [(f"{page.relative_to(ROOT)}:{number}", command) for page, number, block in blocks()
            for command in commands(block)]


def written() -> set[str]:
    """Every path a command of the docs writes: its --out, or a shell redirection's target."""
    paths = set()
    for _, command in every_command():
        if ">" in _operators(command):
            paths.add(command.rsplit(">", 1)[1].strip())
            continue
        words = shlex.split(command)
        for flag, value in zip(words, words[1:]):
            if flag in ("--out", "-o"):
                paths.add(value)
    return paths


def _exists(value: str, made: set[str]) -> bool:
    if NOT_FILES.fullmatch(value) or value in PLACEHOLDERS or (ROOT / value).exists():
        return True
    return any(Path(value).match(pattern) or value == pattern for pattern in made) or \
        any(Path(pattern).match(value) for pattern in made)  # out/part-* against out/part-0


def check_headscan(words: list[str], made: set[str]) -> list[str]:
    """What is wrong with a headscan command line: click's refusal, or an input that nothing provides."""
    if len(words) < 2 or words[1] not in cli.commands:
        return [f"no such command: {' '.join(words[:2])}"]
    name, arguments = words[1], words[2:]
    command = cli.commands[name]
    try:
        with command.make_context(name, list(arguments)) as context:
            params = dict(context.params)
    except click.ClickException as error:
        return [error.format_message()]
    problems = []
    for key in INPUTS & set(params):
        values = params[key] if isinstance(params[key], tuple) else (params[key],)
        for value in values:
            if value is not None and not _exists(str(value), made):
                problems.append(f"{key} {value}: no such file from the checkout, and no command of the docs writes "
                                f"it")
    return problems


def check_python(words: list[str]) -> list[str]:
    script = ROOT / words[1]
    if not script.is_file():
        return [f"no such script: {words[1]}"]
    source = script.read_text()
    flags = [word.split("=")[0] for word in words[2:] if word.startswith("--")]
    missing = [flag for flag in flags if f'"{flag}"' not in source and not
               (flag.startswith("--no-") and f'"--{flag[5:]}"' in source)]
    return [f"{words[1]} declares no option {', '.join(missing)}"] if missing else []


def check_make(words: list[str]) -> list[str]:
    targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
    # NAME=value words set make variables (REV=..., ARGS=...); every other word is a target
    return [f"the Makefile has no target {target}" for target in words[1:]
            if not re.match(r"^[A-Za-z_]\w*=", target) and target not in targets]


def run_pipeline(command: str, made: set[str], tmp_path: Path) -> list[str]:
    """Run a shell pipeline in a folder of `tmp_path`, where each file it reads is there as from the checkout
    (the treebank's first 200 lines: enough for a pipeline's head); a file it reads must exist from the checkout."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    for word in shlex.split(command.split("|")[0]):
        if not word.endswith((".conllu", ".txt", ".jsonl")):
            continue
        if not _exists(word, made):
            return [f"{word}: no such file from the checkout, and no command of the docs writes it"]
        if not (ROOT / word).is_file():
            continue  # written by another command of the docs
        copy = (work / word).resolve()
        copy.parent.mkdir(parents=True, exist_ok=True)
        with (ROOT / word).open() as source:
            copy.write_text("".join(line for _, line in zip(range(200), source)))
    result = subprocess.run(["bash", "-c", f"set -o pipefail; {command}"], cwd=work, capture_output=True, text=True)
    return [f"exit {result.returncode}: {result.stderr.strip()[:200]}"] if result.returncode else []


def problems_of(command: str, made: set[str], tmp_path: Path) -> list[str]:
    if _operators(command):
        return run_pipeline(command, made, tmp_path)
    words = shlex.split(command)
    if words[0] == "headscan":
        return check_headscan(words, made)
    if words[0] in ("python", "python3"):
        return check_python(words)
    if words[0] == "make":
        return check_make(words)
    if words[:2] == ["git", "clone"]:
        return []  # fetches from the network: not run
    return [f"a command this test does not know how to check: {words[0]}"]


# Commands of a page this branch does not edit (docs/speed.md is another's), that fail as written, with what is
# wrong: each must keep failing until that page is mended, and then be removed from here.
KNOWN: dict[str, str] = {}  # commands known not to run as written, with why (none now)


def test_the_docs_have_command_blocks():
    found = every_command()
    assert len(found) > 20 and any(command.startswith("headscan sweep") for _, command in found)


def test_every_command_block_of_the_docs_parses_and_names_inputs_that_exist(tmp_path):
    made = written()
    problems, known = [], []
    for where, command in every_command():
        found = problems_of(command, made, tmp_path)
        if command in KNOWN:
            known.append(command)
            assert found, f"{where}: {command} runs now: remove it from KNOWN"
            continue
        problems += [f"{where}: {command}\n    {problem}" for problem in found]
    assert not problems, "commands of the docs that would not run as written:\n" + "\n".join(problems)
    assert sorted(known) == sorted(KNOWN)


def test_the_checker_catches_a_wrong_option_a_bad_value_and_a_missing_input(tmp_path):
    made = {"out/ewt"}
    assert check_headscan(["headscan", "sweep", "--haystack", "x"], made)  # an option --help does not list
    assert check_headscan(["headscan", "sweep", "--bos", "maybe"], made)
    assert check_headscan(["headscan", "sweep", "-c", "en_ewt-ud-dev.conllu"], made)  # bare: not from the checkout
    assert check_headscan(["headscan", "show", "out/other"], made)
    assert not check_headscan(["headscan", "show", "out/ewt", "--metric", "syntax"], made)
    assert check_python(["python", "benchmarks/crossover.py", "--no-such-option"])
    assert check_make(["make", "no-such-target"])


@pytest.mark.subprocess
def test_the_commands_that_load_no_model_run_for_real(tmp_path):
    for arguments in (["models"], ["sweep", "--help"], ["show", "--help"]):
        result = subprocess.run([sys.executable, "-m", "headscan", *arguments], cwd=tmp_path, capture_output=True,
                                text=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                                "PYTHONPATH": str(ROOT)})
        assert result.returncode == 0, (arguments, result.stderr[-1000:])
    assert shutil.which("bash")  # the pipelines above run through it
