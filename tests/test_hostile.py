"""Hostile input: text that is also markup, in the corpus, the --example sentence, the models' folder names, the
corpus's file name and the run's, reaches the reports literally, runs no script, and breaks neither the page nor
report.md's tables; what cannot be taken in is refused in one line that says where.

What each kind of input meets, decided case by case:
- markup (``<!--<script>``, ``</script>``, ``<img onerror>``, pipes, backticks, ``&lt;``, ``~~``): shown as text.
- a right-to-left override (U+202E): kept, and in HTML isolated (``<bdi>``) so it turns nothing after the name.
- a 100 kB line: swept like any other.
- a NUL byte or bytes that are not UTF-8 in a text corpus, a lone surrogate in a JSONL field: refused, naming the
  file and line (a tokenizer cannot take a lone surrogate; a NUL in a text file means it is binary or UTF-16).
- a NUL written as ``\\u0000`` inside a JSONL string: text the user asked for, swept as it is.
- a NUL or a lone surrogate in --example: refused; in a model spec: "not found", in one line. (A NUL cannot reach
  a path on a command line: argv is C strings.)
"""

import json
import re
import shutil

import pytest
from click.testing import CliRunner
from conftest import chromium_page

from headscan.cli import cli

PWN = "window.__pwned=1"
EXAMPLE = f"a <!--<script> b </script><script>{PWN}</script> c | d ` e &lt;f&gt; \u202eright-to-left"
CORPUS = [
    "the cat <!--<script> sat on the mat",
    f"a </script><script>{PWN}</script> b",
    f'look <img src=x onerror="{PWN}"> here',
    "a | b | c `code` and ``dou`ble`` ticks [link](javascript:alert(1))",
    "right\u202eto left override, and U+2028\u2028and U+2029\u2029inside",
    "x " * 50_000,  # a 100 kB line
]
MODEL_NAME = f"m<img src=x onerror={PWN}>|`x`"  # the tiny GPT-2's folder
BERT_NAME = "b\u202e<!--<script>|`y` ~~z~~"  # the tiny BERT's: a right-to-left override before markup
CORPUS_NAME = "c|`w`<b>&lt;.txt"
RUN_NAME = "run<!--<script>"
BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, tiny_gpt2, tiny_bert):
    """A sweep of the tiny GPT-2 and BERT, copied into folders with hostile names, over a hostile corpus, and its
    report with a hostile example sentence."""
    root = tmp_path_factory.mktemp("hostile")
    gpt2, bert = root / MODEL_NAME, root / BERT_NAME
    shutil.copytree(tiny_gpt2, gpt2)
    shutil.copytree(tiny_bert, bert)
    corpus = root / CORPUS_NAME
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    run = root / RUN_NAME
    runner = CliRunner()
    result = runner.invoke(cli, ["sweep", "-m", str(gpt2), "-m", str(bert), "-c", str(corpus), "--out", str(run), "-q",
                                 "--bootstrap", "20", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    report = root / "report"
    result = runner.invoke(cli, ["report", str(run), "--out", str(report), "-q", "--example", EXAMPLE])
    assert result.exit_code == 0, result.output
    names = [str(gpt2), str(bert), str(corpus), str(run), RUN_NAME, EXAMPLE]
    return {"root": root, "models": [gpt2, bert], "run": run, "report": report, "names": names}


# In the page, each text node holding a direction control, unless a <bdi> (or an SVG text of its own) isolates it
UNISOLATED = """() => {
  const out = [], walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walk.nextNode(); node; node = walk.nextNode()) {
    const parent = node.parentElement;
    if (!/[\\u202a-\\u202e\\u2066-\\u2069]/.test(node.data) || parent.closest("bdi, script, style")) continue;
    if (parent.closest("svg") && parent.closest("text, title")) continue;
    out.push(parent.tagName + ": " + node.data.slice(0, 60));
  }
  return out;
}"""


@pytest.mark.browser
def test_the_hostile_report_shows_every_string_literally_and_runs_no_script(hostile, tmp_path):
    html = (hostile["report"] / "index.html").read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="atlas-data">(.*?)</script>', html, re.S)[1])
    cells = sum(m["layers"] * m["heads"] for m in data["models"])
    with chromium_page(hostile["report"] / "index.html", tmp_path / "profile") as (page, errors):
        assert page.locator("#atlas-grids rect.atlas-cell").count() == cells == 16  # the atlas drew every head
        page.hover("#atlas-grids rect.atlas-cell[data-m='1']")  # the tooltip names the BERT
        tip = page.inner_text("#atlas-tip")
        page.click("#atlas-grids rect.atlas-cell[data-m='1']")  # its panel: the name, and the example's tokens
        page.wait_for_selector("#atlas-panel:not([hidden])", timeout=10_000)
        # the example's attention is folded (a grid as tall as the panel's scores): opened, its sentence shows
        page.locator("#atlas-panel details.atlas-example-attention summary").first.click()
        panel = page.inner_text("#atlas-panel")
        page.wait_for_timeout(300)  # time for an <img onerror> to fire, were one parsed
        assert page.evaluate("window.__pwned") is None
        text = page.inner_text("body")
        unisolated = page.evaluate(UNISOLATED)
        assert errors == []
    for name in hostile["names"]:
        assert name in text, name  # markup, backticks and all, as text
        assert "`" not in name or name.replace("`", "") not in text, name  # nowhere its backticks read as code
    assert str(hostile["models"][1]) in tip and str(hostile["models"][1]) in panel and EXAMPLE in panel
    assert unisolated == []  # a right-to-left override reorders nothing outside the name holding it
    assert "<img src=x" not in html  # escaped wherever it appears: as text, or as \u003c inside the data
    assert html.count("<script") == html.count("</script>")


def without_code_spans(markdown: str) -> str:
    """`markdown` less its code spans, read as CommonMark does: a run of n backticks opens one, and the next run of
    exactly n closes it (an unclosed run is text)."""
    return "".join(part for code, part in markdown_parts(markdown) if not code)


def markdown_parts(markdown: str) -> list[tuple[bool, str]]:
    """`markdown` as (is a code span, its source) pieces, read as CommonMark does."""
    out, at = [], 0
    runs = list(re.finditer(r"(?<!\\)`+", markdown))
    i = 0
    while i < len(runs):
        opening = runs[i]
        closing = next((r for r in runs[i + 1:] if len(r.group()) == len(opening.group())), None)
        if closing is None:
            i += 1
            continue
        out += [(False, markdown[at:opening.start()]), (True, markdown[opening.end():closing.start()])]
        at = closing.end()
        i = runs.index(closing) + 1
    return out + [(False, markdown[at:])]


def shown(markdown: str) -> str:
    """The text a GitHub reader sees in `markdown`'s inline parts: backslash escapes undone outside code spans,
    a code span's one padding space dropped and its escaped pipes (a table's) read as pipes."""
    out = []
    for code, part in markdown_parts(markdown):
        if code:
            part = part[1:-1] if part.startswith(" ") and part.endswith(" ") and part.strip() else part
            out.append(part.replace("\\|", "|"))
        else:
            out.append(re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", part))
    return "".join(out)


def test_report_md_shows_every_name_literally_and_keeps_every_table_row_whole(hostile):
    markdown = (hostile["report"] / "report.md").read_text(encoding="utf-8")
    outside_code = without_code_spans(markdown)  # a code span shows its text as it is
    assert re.findall(r"(?<!\\)<", outside_code) == []  # elsewhere only \< reaches a renderer
    assert re.findall(r"(?<!\\)&\w+;", outside_code) == []  # an entity would show as the character it names
    assert re.findall(r"(?<!\\)~", outside_code) == []  # ~~z~~ would strike through
    rows = []
    for block in re.split(r"\n\s*\n", markdown):
        lines = [line for line in block.splitlines() if line.startswith("|")]
        if len(lines) >= 2:
            cells = [len(re.findall(r"(?<!\\)\|", without_code_spans(line))) for line in lines]  # cell delimiters
            assert len(set(cells)) == 1, block
            rows += lines
    assert any(str(hostile["models"][0]) in shown(row) for row in rows)  # a table cell holds a name whole
    text = shown(markdown)
    for name in hostile["names"]:
        assert name in text, name
        assert "`" not in name or name.replace("`", "") not in text, name  # nowhere its backticks read as code


def test_embedded_json_has_no_raw_markup_or_line_separators(hostile):
    html = (hostile["report"] / "index.html").read_text(encoding="utf-8")
    data = re.search(r'<script type="application/json" id="atlas-data">(.*?)</script>', html, re.S).group(1)
    for character in "<>&\u2028\u2029":
        assert character not in data
    parsed = json.loads(data)  # and it reads back as the strings it holds
    assert {m["name"] for m in parsed["models"]} == {str(m) for m in hostile["models"]}
    assert {e["text"] for m in parsed["models"] for e in m["examples"]} >= {EXAMPLE}


def test_script_json_escapes_what_could_end_or_bend_a_script():
    from headscan.report.atlas import script_json

    text = "<!--<script></script>&\u2028\u2029"
    escaped = script_json({"t": text})
    assert escaped == '{"t":"\\u003c!--\\u003cscript\\u003e\\u003c/script\\u003e\\u0026\\u2028\\u2029"}'
    assert json.loads(escaped) == {"t": text}


@pytest.mark.parametrize("name, content, where", [
    ("bad.txt", b"fine\nnul\x00here\n", "line 2: holds a NUL byte"),
    ("bad.txt", b"fine\nbad \xed\xa0\x80 surrogate\n", "line 2: not UTF-8 text"),
    ("bad.jsonl", b'{"text": "fine"}\n{"text": "lone \\ud800 surrogate"}\n', "line 2: field 'text' holds a lone"),
])
def test_a_corpus_that_cannot_be_read_is_refused_in_one_line_naming_the_line(tmp_path, tiny_gpt2, name, content,
                                                                              where):
    corpus = tmp_path / name
    corpus.write_bytes(content)
    result = CliRunner().invoke(cli, ["sweep", "-m", str(tiny_gpt2), "-c", str(corpus), "--out", str(tmp_path / "o"),
                                      "-q", "--device", "cpu"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert result.output.count("\n") == 1 and f"{corpus}, {where}" in result.output, result.output
    assert not (tmp_path / "o").exists()  # refused before any work


def test_a_nul_escaped_in_a_jsonl_string_is_swept_as_text(tmp_path, tiny_gpt2):
    from headscan.corpus import read_corpus

    corpus = tmp_path / "nul.jsonl"
    corpus.write_text('{"text": "a nul \\u0000 inside"}\n{"text": "and a plain line"}\n', encoding="utf-8")
    assert "\x00" in read_corpus(corpus).segments[0].text
    result = CliRunner().invoke(cli, ["sweep", "-m", str(tiny_gpt2), "-c", str(corpus), "--out", str(tmp_path / "o"),
                                      "-q", "--device", "cpu", "--bootstrap", "0"])
    assert result.exit_code == 0, result.output


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
