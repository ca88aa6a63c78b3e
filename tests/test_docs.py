"""The docs cannot drift from the code: generated blocks equal the registries, every command is in the README,
every relative link lands, and no file speaks of issue numbers or of the project's own history."""

import re
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from headscan.cli import cli
from headscan.docs import PAGES, blocks, pattern
from headscan.tables import TABLES

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKDOWN = [README, *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("name", list(blocks()))
def test_generated_blocks_are_the_registries(name):
    page = ROOT / PAGES[name]
    found = pattern(name).search(page.read_text())
    assert found, f"{PAGES[name]} lost its {name} block"
    assert found.group(2) == blocks()[name], f"run: python -m headscan.docs to regenerate {PAGES[name]}"


def test_every_generated_block_has_one_page():
    assert set(PAGES) == set(blocks())
    for page in MARKDOWN:
        held = [name for name in PAGES if pattern(name).search(page.read_text())]
        assert all(ROOT / PAGES[name] == page for name in held), f"{page.name} holds a block another page owns: {held}"


def test_readme_is_a_few_screens():
    assert len(README.read_text().splitlines()) <= 300, "README.md over 300 lines: move the detail to docs/"


def test_every_command_is_in_the_readme():
    text = README.read_text()
    for name in cli.commands:
        assert f"headscan {name}" in text, name


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_every_command_s_help_shows_each_example_on_its_own_line(name):
    examples = [line.strip() for line in cli.commands[name].help.splitlines() if line.strip().startswith("headscan ")]
    assert examples, f"headscan {name} --help has no example"
    shown = CliRunner().invoke(cli, [name, "--help"], terminal_width=80).output
    lines = [line.strip() for line in shown.splitlines()]
    for example in examples:
        assert example in lines, f"headscan {name} --help runs this example into another line: {example}"


def test_sweep_help_names_every_table_a_sweep_fills_and_no_other():
    import re

    from headscan.cli import PATCH_TABLES, RETRIEVAL_TABLES

    shown = CliRunner().invoke(cli, ["sweep", "--help"], terminal_width=80).output
    listed = set(re.findall(r"^ +(\w+\.parquet) ", shown, re.M))  # the table list, one file a line
    assert listed == {table.file for name, table in TABLES.items() if name not in RETRIEVAL_TABLES + PATCH_TABLES}
    assert not {"patching.parquet", "paths.parquet"} & listed  # `headscan patch` writes these
    assert not {"retrieval.parquet", "retrieval_trials.parquet"} & listed  # `headscan retrieval` writes these


# Links --------------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^\s*```")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_CODE_SPAN = re.compile(r"`[^`]*`")


def _prose(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, with inline code removed (a link shown as code is not a link)."""
    kept, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            kept.append((number, _CODE_SPAN.sub("", line)))
    return kept


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation dropped, spaces to hyphens,
    a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    for _, line in _prose(text):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            seen[f"{slug}-{count}"] = 1
    return set(seen)


def broken_links(page: Path) -> list[str]:
    """Each relative link of a Markdown page that lands on no file, or on no heading of a Markdown file."""
    broken = []
    for number, line in _prose(page.read_text()):
        for target in _LINK.findall(line):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
                continue
            path, _, anchor = target.partition("#")
            landed = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            if not landed.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and landed.suffix == ".md" and anchor not in anchors(landed.read_text()):
                broken.append(f"{where} (no heading #{anchor} in {landed.relative_to(ROOT)})")
    return broken


def test_anchors_follow_github():
    text = "# Speed\n## What each mode holds at 4,096 tokens\n```\n# not a heading\n```\n## Speed\n"
    assert anchors(text) == {"speed", "what-each-mode-holds-at-4096-tokens", "speed-1"}


def test_broken_links_are_found(tmp_path, monkeypatch):
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    (tmp_path / "there.md").write_text("# A heading\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md#a-heading) [gone](missing.md) [bad](there.md#nope) `[code](x.md)`\n"
        "[web](https://example.org/x.md)\n```\n[fenced](y.md)\n```\n"
    )
    assert broken_links(page) == [
        "page.md:1: missing.md (no such file)",
        "page.md:1: there.md#nope (no heading #nope in there.md)",
    ]


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda page: page.name)
def test_every_relative_link_resolves(page):
    assert not broken_links(page), "\n".join(broken_links(page))


# History --------------------------------------------------------------------------------------------------------

# What the project's files must not say: a file says what the code does and why, not which issue asked for it or
# what an earlier version did. A small set of unambiguous forms; the rest is left to review.
HISTORY = [
    re.compile(p, re.I)
    for p in (
        r"\bissues?[- ]?#?\d+",  # "issue 23 asks for", "issue-20 protocol", "issues 18"
        r"(?<![\w&#])#\d{1,2}\b(?![\w-])",  # "#38", GitHub's references (colours such as #000 have 3 digits or more)
        r"\bPR #?\d+\b",
        r"\bstops? \d+\b",  # "stops 28 and 29"
        r"found by review",
        r"before the fix",
        r"\(a crash before\)",
    )
]
_DATA_URI = re.compile(r"data:[\w/+.-]+;base64,[\w+/=]+")  # a report's inline images, whose text means nothing
# a report's atlas data holds the corpus's own text (each head's examples): web text says "#1", which is no issue
_ATLAS_DATA = re.compile(r'<script type="application/json" id="atlas-data">.*?</script>')


def history(text: str) -> list[tuple[int, str]]:
    """Each line of `text` that names an issue, a stop or the project's own history, with its number."""
    return [
        (number, line.strip())
        for number, line in enumerate(text.splitlines(), 1)
        if any(p.search(_DATA_URI.sub("", _ATLAS_DATA.sub("", line))) for p in HISTORY)
    ]


def project_files() -> list[Path]:
    """Every file git tracks, and every new one it does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def test_history_is_found():
    found = history(
        "the tenth issue 23 asks for\n(the default since Issue 20)\nseen in #38\n"
        "the last run (stops 28 and 29)\ncolor:#0173b2; fill:#999999; stroke:#000\nstop at token 5\n"
        '<img src="data:image/png;base64,AAAtk7pr12issue5AAA=">\n'
    )
    assert [number for number, _ in found] == [1, 2, 3, 4]


def test_no_file_speaks_of_issues_or_history():
    offending = []
    for path in project_files():
        if path == Path(__file__).resolve():  # the patterns and their examples above
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):  # binary files: parquet, png, npz
            continue
        offending += [f"{path.relative_to(ROOT)}:{number}: {line[:120]}" for number, line in history(text)]
    assert not offending, "say what the code does and why, not its history:\n" + "\n".join(offending)
