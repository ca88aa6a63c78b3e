"""Hostile input: text that is also markup, in the corpus, the --example sentence, the model's folder name and the
run's, reaches the reports literally, runs no script, and breaks neither the page nor report.md's tables; what
cannot be taken in (NUL bytes, bytes that are not UTF-8) is refused in one line that says where.
"""

import re
import shutil

import pytest
from click.testing import CliRunner

from headscan.cli import cli

from conftest import chromium_page

PWN = "window.__pwned=1"
EXAMPLE = f"a <!--<script> b </script><script>{PWN}</script> c | d ` e \u202eright-to-left"
CORPUS = [
    "the cat <!--<script> sat on the mat",
    f"a </script><script>{PWN}</script> b",
    f'look <img src=x onerror="{PWN}"> here',
    "a | b | c `code` and ``dou`ble`` ticks [link](javascript:alert(1))",
    "right\u202eto left override, and U+2028\u2028and U+2029\u2029inside",
    "x " * 50_000,  # a 100 kB line
]
MODEL_NAME = f"m<img src=x onerror={PWN}>|`x`"
RUN_NAME = "run<!--<script>"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, tiny_gpt2):
    """A sweep of the tiny GPT-2, copied into a folder with a hostile name, over a hostile corpus, and its report
    with a hostile example sentence."""
    root = tmp_path_factory.mktemp("hostile")
    model = root / MODEL_NAME
    shutil.copytree(tiny_gpt2, model)
    corpus = root / "hostile.txt"
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    run = root / RUN_NAME
    runner = CliRunner()
    result = runner.invoke(cli, ["sweep", "-m", str(model), "-c", str(corpus), "--out", str(run), "-q", "--bootstrap",
                                 "20", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    report = root / "report"
    result = runner.invoke(cli, ["report", str(run), "--out", str(report), "-q", "--example", EXAMPLE])
    assert result.exit_code == 0, result.output
    return {"root": root, "model": model, "run": run, "report": report}


@pytest.mark.browser
def test_the_hostile_report_shows_every_string_literally_and_runs_no_script(hostile, tmp_path):
    with chromium_page(hostile["report"] / "index.html", tmp_path / "profile") as (page, errors):
        # open the first head: its panel draws the example's tokens from the embedded JSON
        page.click("#atlas-grids rect[data-index]")
        page.wait_for_selector("#atlas-panel:not([hidden])", timeout=10_000)
        panel = page.inner_text("#atlas-panel")
        assert page.evaluate("window.__pwned") is None
        text = page.inner_text("body")
        assert errors == []
    assert str(hostile["model"]) in text  # the model's name, markup and all, as text
    assert RUN_NAME in text
    assert "<script>" in panel or "script" in panel  # the example's tokens, as text
    html = (hostile["report"] / "index.html").read_text(encoding="utf-8")
    assert "<img src=x" not in html  # escaped wherever it appears: as text, or as \u003c inside the data
    assert html.count("<script") == html.count("</script>")


def without_code_spans(markdown: str) -> str:
    """`markdown` less its code spans, read as CommonMark does: a run of n backticks opens one, and the next run of
    exactly n closes it (an unclosed run is text)."""
    out, at = [], 0
    runs = list(re.finditer(r"(?<!\\)`+", markdown))
    i = 0
    while i < len(runs):
        opening = runs[i]
        closing = next((r for r in runs[i + 1:] if len(r.group()) == len(opening.group())), None)
        if closing is None:
            i += 1
            continue
        out.append(markdown[at:opening.start()])
        at = closing.end()
        i = runs.index(closing) + 1
    return "".join(out) + markdown[at:]


def test_report_md_escapes_markup_and_keeps_every_table_row_whole(hostile):
    markdown = (hostile["report"] / "report.md").read_text(encoding="utf-8")
    outside_code = without_code_spans(markdown)  # a code span shows its text as it is
    assert re.findall(r"(?<!\\)<", outside_code) == []  # elsewhere only \< reaches a renderer
    rows = []
    for block in re.split(r"\n\s*\n", markdown):
        lines = [line for line in block.splitlines() if line.startswith("|")]
        if len(lines) >= 2:
            cells = [len(re.findall(r"(?<!\\)\|", line)) for line in lines]  # pipes that delimit cells
            assert len(set(cells)) == 1, block
            rows += lines
    assert any("m\\<img" in row for row in rows) or "m\\<img" in markdown


def test_embedded_json_has_no_raw_markup_or_line_separators(hostile):
    html = (hostile["report"] / "index.html").read_text(encoding="utf-8")
    data = re.search(r'<script type="application/json" id="atlas-data">(.*?)</script>', html, re.S).group(1)
    for character in "<>&\u2028\u2029":
        assert character not in data


@pytest.mark.parametrize("content, where", [
    (b"fine\nnul\x00here\n", "line 2: holds a NUL byte"),
    (b"fine\nbad \xed\xa0\x80 surrogate\n", "line 2: not UTF-8 text"),
])
def test_a_corpus_that_cannot_be_read_is_refused_in_one_line_naming_the_line(tmp_path, tiny_gpt2, content, where):
    corpus = tmp_path / "bad.txt"
    corpus.write_bytes(content)
    result = CliRunner().invoke(cli, ["sweep", "-m", str(tiny_gpt2), "-c", str(corpus), "--out", str(tmp_path / "o"),
                                      "-q", "--device", "cpu"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert result.output.count("\n") == 1 and where in result.output, result.output


@pytest.mark.parametrize("example, said", [
    ("a lone \udced surrogate", "--example holds a lone surrogate (bytes that are not UTF-8) at character 8"),
    ("a NUL \x00 byte", "--example holds a NUL byte at character 7"),
])
def test_an_example_that_cannot_be_drawn_is_refused_in_one_line(hostile, example, said):
    result = CliRunner().invoke(cli, ["report", str(hostile["run"]), "--out", str(hostile["root"] / "r2"), "-q",
                                      "--example", example])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.output == f"Error: {said}; pass UTF-8 text\n"


@pytest.mark.parametrize("spec", ["m\udced", "a b", "<script>x</script>"])
def test_a_model_name_that_is_no_model_is_refused_in_one_line(tmp_path, spec):
    result = CliRunner().invoke(cli, ["sweep", "-m", spec, "--out", str(tmp_path / "o"), "-q"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.output.startswith(f"Error: model {spec!r} not found") or "no such file" in result.output
    assert result.output.count("\n") == 1
