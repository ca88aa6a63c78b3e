"""A small document model: a list of blocks that render to HTML and to Markdown, so the two cannot differ.

A `Document` is a title, blocks (`Heading`, `Text`, `Note`, `Bullets`, `Table`, `Panels`, `Figures`,
`Definition`, `Contents`, `Raw`) and the PNG images its `Figures` blocks name. `to_html` writes one
self-contained page (images embedded as data URIs, scripts inline, no external link: it works from
``file://``); `to_markdown` writes the same text with each image linked as ``figures/NAME``; `write_folder`
puts both, and the images, in one folder, all at once. Text is plain except for `code` spans in backticks.
A `Table` marked sortable sorts by a click on a column's heading in HTML (`page_script`, inline); a `Raw`
block is a piece of HTML for the page only (an interactive figure), with what Markdown shows instead.

This module knows nothing of heads, metrics or models, and draws nothing: `headscan.report` lays out the
sections, `headscan.plots` draws.

>>> doc = Document("Demo", [Heading(1, "Demo"), Contents(), Heading(2, "Two & three"), Text("Use `a < b`."),
...                         Table(pd.DataFrame({"head": ["L0H1"], "value": ["0.90"]}), numeric=("value",))])
>>> print(to_markdown(doc))
# Demo
<BLANKLINE>
**Contents**
<BLANKLINE>
1. [Two & three](#two--three)
<BLANKLINE>
## Two & three
<BLANKLINE>
Use `a < b`.
<BLANKLINE>
| head | value |
| --- | ---: |
| L0H1 | 0.90 |
<BLANKLINE>
>>> print(to_html(doc).split("<main>")[1].split("</main>")[0].strip())
<h1>Demo</h1>
<nav class="toc"><h2>Contents</h2><ol><li><a href="#two--three">Two &amp; three</a></li></ol></nav>
<h2 id="two--three">Two &amp; three</h2>
<p>Use <code>a &lt; b</code>.</p>
<div class="scroll"><table><thead><tr><th>head</th><th class="num">value</th></tr></thead><tbody><tr><td>L0H1</td><td class="num">0.90</td></tr></tbody></table></div>
"""

from __future__ import annotations

import base64
import contextvars
import functools
import html
import inspect
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import pandas as pd

from ..tables.folders import publish

__all__ = [
    "Heading", "Text", "Note", "Bullets", "Table", "Panels", "Figures", "Definition", "Contents", "Raw", "Block",
    "Document", "to_html", "to_markdown", "write_folder", "FOLDER_FILES", "CSS",
]

FOLDER_FILES = {"index.html", "report.md", "figures"}  # all that write_folder puts in a folder


@dataclass
class Heading:
    level: int  # 1 is the page title; level-2 headings make the table of contents
    text: str

    @property
    def anchor(self) -> str:
        """GitHub's rule for simple headings, so report.md's table of contents links work there too."""
        return re.sub(r"[^a-z0-9 _-]", "", self.text.lower()).strip().replace(" ", "-")


@dataclass
class Text:
    text: str  # `code` spans in backticks; nothing else is markup


@dataclass
class Note:
    text: str  # a paragraph set apart: a caveat, or why something is missing


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    frame: pd.DataFrame  # cells are display strings
    numeric: tuple[str, ...] = ()  # columns aligned right (and sorted as numbers)
    note: str = ""  # a muted line under the table
    sortable: bool = False  # in HTML, a click on a column's heading sorts the rows by it


@dataclass
class Panels:
    items: list[tuple[str, Table]]  # (heading, table): side by side in HTML, one after another in Markdown


@dataclass
class Figures:
    names: list[str]  # image names: keys of Document.images, files figures/NAME beside report.md
    caption: str


@dataclass
class Definition:
    term: str  # shown as code
    kind: str  # a short note after the term
    body: str  # a docstring: paragraphs, and lists of "- " lines
    anchor: str = ""  # the HTML id of the term; none when empty


@dataclass
class Contents:
    """Where the table of contents (every level-2 heading) goes."""


@dataclass
class Raw:
    html: str  # put into the page as it is: it must be self-contained (no external link)
    markdown: str = ""  # what report.md shows in its place (plain text with `code` spans); nothing when empty


Block = Heading | Text | Note | Bullets | Table | Panels | Figures | Definition | Contents | Raw


@dataclass
class Document:
    title: str  # the HTML page's <title>
    blocks: list[Block]
    images: dict[str, bytes] = field(default_factory=dict)  # PNG bytes by name
    # User-given strings (paths, model names, the example sentence): wherever one appears in the text it is shown
    # as it is, its backticks no code fence and (in HTML) its right-to-left overrides kept inside it
    verbatim: tuple[str, ...] = ()


# --- inline text ------------------------------------------------------------------------------------------

_CODE = re.compile(r"(`+)(.+?)\1", re.S)
_MD_SPECIAL = re.compile(r"([\\*_<>|$#`~]|\](?=\()|&(?=#?\w+;))")  # "](" would end a link's text, "&lt;" is "<"
# In a heading only what could become markup or break the line: names such as next_token keep their underscores
_HEADING_SPECIAL = re.compile(r"([\\<>|`~]|\](?=\()|&(?=#?\w+;))")


# Characters that change the direction of the text after them (embeddings, overrides, isolates), to the paragraph's end
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069]")
_VERBATIM: contextvars.ContextVar[tuple[re.Pattern, tuple[str, ...]] | None] = contextvars.ContextVar(
    "verbatim", default=None)
_HELD = re.compile("\x00(\\d+)\x00")  # a verbatim string's place while the text around it is read (no text holds NUL)


def _reading_verbatim(render):
    """`render(document, ...)` with `document.verbatim` held by `_hold` while it runs. Only strings that markup
    could misread count: those holding a backtick or a direction control."""
    @functools.wraps(render)
    def wrapped(document, *args, **kwargs):
        strings = sorted({s for s in document.verbatim if "`" in s or _BIDI.search(s)}, key=len, reverse=True)
        token = _VERBATIM.set((re.compile("|".join(map(re.escape, strings))), tuple(strings)) if strings else None)
        try:
            return render(document, *args, **kwargs)
        finally:
            _VERBATIM.reset(token)
    return wrapped


def _hold(text: str) -> tuple[str, tuple[str, ...]]:
    """`text` with each verbatim string in it replaced by a placeholder (longest first), and the strings."""
    verbatim = _VERBATIM.get()
    if verbatim is None:
        return text, ()
    pattern, strings = verbatim
    return pattern.sub(lambda m: f"\x00{strings.index(m.group())}\x00", text), strings


def _verbatim_html(text: str) -> str:
    """`text` escaped; one holding direction controls in a <bdi>, so they turn nothing outside it."""
    escaped = html.escape(text)
    return f"<bdi>{escaped}</bdi>" if _BIDI.search(text) else escaped


def _inline_html(text: str) -> str:
    text, strings = _hold(text)

    def escape(part: str) -> str:
        return _HELD.sub(lambda m: _verbatim_html(strings[int(m.group(1))]), html.escape(part))

    out, last = [], 0
    for match in _CODE.finditer(text):
        out.append(escape(text[last:match.start()]))
        out.append(f"<code>{escape(match.group(2).strip())}</code>")
        last = match.end()
    out.append(escape(text[last:]))
    return "".join(out)


def _inline_md(text: str) -> str:
    """`text` as Markdown that shows it literally: markup characters escaped, each `code` span fenced by more
    backticks than it holds, and a pipe in it escaped (GitHub reads \\| as | in a code span, and needs it there
    inside a table cell).

    >>> print(_inline_md("a | <b> `x|y` and ``a`b``"))
    a \\| \\<b\\> `x\\|y` and ``a`b``
    """
    text, strings = _hold(text)

    def escape(part: str) -> str:  # outside code spans a verbatim string's backticks are escaped like the rest
        return _HELD.sub(lambda m: _MD_SPECIAL.sub(r"\\\1", strings[int(m.group(1))]), _MD_SPECIAL.sub(r"\\\1", part))

    out, last = [], 0
    for match in _CODE.finditer(text):
        out.append(escape(text[last:match.start()]))
        code = _HELD.sub(lambda m: strings[int(m.group(1))], match.group(2)).strip().replace("|", "\\|")
        fence = "`" * (max((len(run) for run in re.findall(r"`+", code)), default=0) + 1)
        pad = " " if code.startswith("`") or code.endswith("`") else ""
        out.append(f"{fence}{pad}{code}{pad}{fence}")
        last = match.end()
    out.append(escape(text[last:]))
    return "".join(out).replace("\n", " ")


def _heading_md(text: str) -> str:
    """A heading's text as Markdown that shows it literally (one line, no markup, no link).

    >>> print(_heading_md("m<img src=x> | next_token [random init](x)"))
    m\\<img src=x\\> \\| next_token [random init\\](x)
    """
    return _HEADING_SPECIAL.sub(r"\\\1", " ".join(text.split()))


def _paragraphs(body: str) -> list[list[str] | str]:
    """Split a docstring into paragraphs (str) and bullet lists (list of str)."""
    blocks = []
    for chunk in re.split(r"\n\s*\n", inspect.cleandoc(body or "")):
        lines = [line.strip() for line in chunk.splitlines() if line.strip()]
        if not lines:
            continue
        if all(re.match(r"[-*] ", line) for line in lines):
            blocks.append([line[2:] for line in lines])
        else:
            blocks.append(" ".join(lines))
    return blocks


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height of a PNG, from its IHDR chunk."""
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


# --- HTML -------------------------------------------------------------------------------------------------

def _resource(name: str) -> str:
    return resources.files("headscan").joinpath(f"data/{name}").read_text(encoding="utf-8")


CSS = _resource("report.css").strip()  # the page's style


def page_script() -> str:
    """The page's script (``headscan/data/atlas.js``, with ``atlas_views.js``, the panel's corpus examples and the
    scatter of heads, put in at its marker): it makes tables sortable and draws the head atlas, where the page has
    one. One strict-mode function: it leaves nothing in the page's globals."""
    return _resource("atlas.js").replace("/* atlas_views.js */", _resource("atlas_views.js"))


def _table_html(block: Table) -> str:
    def cls(column):
        return ' class="num"' if column in block.numeric else ""

    head = "".join(f"<th{cls(c)}>{_inline_html(str(c))}</th>" for c in block.frame.columns)
    sortable = ' class="sortable"' if block.sortable else ""
    rows = "".join(
        "<tr>" + "".join(f"<td{cls(c)}>{_inline_html(str(v))}</td>" for c, v in zip(block.frame.columns, r)) + "</tr>"
        for r in block.frame.itertuples(index=False)
    )
    note = f'<p class="muted">{_inline_html(block.note)}</p>' if block.note else ""
    return (f'<div class="scroll"><table{sortable}><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>'
            f"{note}")


def _figures_html(block: Figures, images: dict[str, bytes], scale: float) -> str:
    tags = []
    for name in block.names:
        data = images[name]
        width, height = (round(scale * side) for side in _png_size(data))
        alt = html.escape(name.removesuffix(".png").replace("_", " "), quote=True)
        tags.append(
            f'<img src="data:image/png;base64,{base64.b64encode(data).decode("ascii")}" width="{width}" '
            f'height="{height}" alt="{alt}" title="figures/{html.escape(name)}">'
        )
    wrap = f'<div class="gallery">{"".join(tags)}</div>' if len(tags) > 1 else "".join(tags)
    return f"<figure>{wrap}<figcaption>{_inline_html(block.caption)}</figcaption></figure>"


def _definition_html(block: Definition) -> str:
    parts = []
    for para in _paragraphs(block.body):
        if isinstance(para, list):
            parts.append("<ul>" + "".join(f"<li>{_inline_html(i)}</li>" for i in para) + "</ul>")
        else:
            parts.append(f"<p>{_inline_html(para)}</p>")
    anchor = f' id="{html.escape(block.anchor, quote=True)}"' if block.anchor else ""
    return (f'<dt{anchor}><code>{html.escape(block.term)}</code> <span class="muted">({_inline_html(block.kind)})'
            f'</span></dt><dd>{"".join(parts)}</dd>')


@_reading_verbatim
def to_html(document: Document, *, image_scale: float = 1.0) -> str:
    """The document as one self-contained HTML page.

    Parameters
    ----------
    document : Document
        What to render.
    image_scale : float, default 1.0
        Each image is shown at this many CSS pixels per PNG pixel (it still scales down to fit the page).
    """
    toc = [b for b in document.blocks if isinstance(b, Heading) and b.level == 2]
    body: list[str] = []
    in_list = False
    for block in document.blocks:
        if in_list != isinstance(block, Definition):  # consecutive definitions make one <dl>
            body.append("</dl>" if in_list else "<dl>")
            in_list = not in_list
        if isinstance(block, Heading):
            anchor = f' id="{block.anchor}"' if block.level > 1 else ""
            body.append(f"<h{block.level}{anchor}>{_inline_html(block.text)}</h{block.level}>")
        elif isinstance(block, Contents):
            items = "".join(f'<li><a href="#{h.anchor}">{_inline_html(h.text)}</a></li>' for h in toc)
            body.append(f'<nav class="toc"><h2>Contents</h2><ol>{items}</ol></nav>')
        elif isinstance(block, Text):
            body.append(f"<p>{_inline_html(block.text)}</p>")
        elif isinstance(block, Note):
            body.append(f'<p class="note">{_inline_html(block.text)}</p>')
        elif isinstance(block, Bullets):
            body.append("<ul>" + "".join(f"<li>{_inline_html(i)}</li>" for i in block.items) + "</ul>")
        elif isinstance(block, Table):
            body.append(_table_html(block))
        elif isinstance(block, Panels):
            panels = "".join(
                f'<section><h3 id="{Heading(3, title).anchor}">{_inline_html(title)}</h3>{_table_html(table)}</section>'
                for title, table in block.items
            )
            body.append(f'<div class="panels">{panels}</div>')
        elif isinstance(block, Figures):
            body.append(_figures_html(block, document.images, image_scale))
        elif isinstance(block, Definition):
            body.append(_definition_html(block))
        elif isinstance(block, Raw):
            body.append(block.html)
    if in_list:
        body.append("</dl>")
    sortable = any(isinstance(b, Table) and b.sortable for b in document.blocks) or any(
        isinstance(b, Panels) and any(t.sortable for _, t in b.items) for b in document.blocks)
    script = page_script()
    if sortable and not any(isinstance(b, Raw) and script in b.html for b in document.blocks):  # the atlas holds it
        body.append(f"<script>{script}</script>")
    joined = "\n".join(body)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<link rel="icon" href="data:,">\n'  # no request for /favicon.ico
        f"<title>{html.escape(document.title)}</title>\n<style>\n{CSS}\n</style>\n</head>\n<body>\n<main>\n"
        f"{joined}\n</main>\n</body>\n</html>\n"
    )


# --- Markdown ---------------------------------------------------------------------------------------------


def _table_md(block: Table) -> str:
    columns = list(block.frame.columns)
    lines = ["| " + " | ".join(_inline_md(str(c)) for c in columns) + " |",
             "| " + " | ".join("---:" if c in block.numeric else "---" for c in columns) + " |"]
    lines += ["| " + " | ".join(_inline_md(str(v)) for v in r) + " |" for r in block.frame.itertuples(index=False)]
    if block.note:
        lines.append(f"\n*{_inline_md(block.note)}*")
    return "\n".join(lines)


@_reading_verbatim
def to_markdown(document: Document) -> str:
    """The document as Markdown (GitHub's flavour), each image linked as ``figures/NAME``."""
    toc = [b for b in document.blocks if isinstance(b, Heading) and b.level == 2]
    out: list[str] = []
    for block in document.blocks:
        if isinstance(block, Heading):
            out.append(f"{'#' * block.level} {_heading_md(block.text)}")
        elif isinstance(block, Contents):
            out.append("**Contents**\n\n" + "\n".join(f"{i}. [{_heading_md(h.text)}](#{h.anchor})"
                                                      for i, h in enumerate(toc, 1)))
        elif isinstance(block, Text):
            out.append(_inline_md(block.text))
        elif isinstance(block, Note):
            out.append(f"> **Note.** {_inline_md(block.text)}")
        elif isinstance(block, Bullets):
            out.append("\n".join(f"- {_inline_md(i)}" for i in block.items))
        elif isinstance(block, Table):
            out.append(_table_md(block))
        elif isinstance(block, Panels):
            for title, table in block.items:
                out += [f"### {_heading_md(title)}", _table_md(table)]
        elif isinstance(block, Figures):
            out.append("\n".join(f"![{n.removesuffix('.png')}](figures/{n})" for n in block.names))
            out.append(f"*{_inline_md(block.caption)}*")
        elif isinstance(block, Raw):
            if block.markdown:
                out.append(_inline_md(block.markdown))
        elif isinstance(block, Definition):
            parts = [f"**`{block.term}`** ({_inline_md(block.kind)})"]
            for para in _paragraphs(block.body):
                parts.append("\n".join(f"- {_inline_md(i)}" for i in para) if isinstance(para, list)
                             else _inline_md(para))
            out.append("\n\n".join(parts))
    return "\n\n".join(out) + "\n"


# --- a folder ---------------------------------------------------------------------------------------------


def write_folder(document: Document, out: str | os.PathLike, *, image_scale: float = 1.0) -> Path:
    """Write `document` as the folder `out`: ``index.html``, ``report.md`` and ``figures/NAME`` per image.

    The folder is built apart and swapped in at the end, replacing whatever `out` was (an empty folder is
    filled instead, `headscan.tables.folders.publish`): a failure leaves the old folder (or none), never half of
    one. Check that `out` may be replaced before calling. Returns the folder's absolute path.
    """
    def fill(folder: Path) -> None:
        (folder / "figures").mkdir()
        for name, data in document.images.items():
            (folder / "figures" / name).write_bytes(data)
        (folder / "report.md").write_text(to_markdown(document), encoding="utf-8")
        (folder / "index.html").write_text(to_html(document, image_scale=image_scale), encoding="utf-8")

    return publish(out, fill, last="index.html")
