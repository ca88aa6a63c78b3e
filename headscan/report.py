"""Reports over one or more sweep outputs: one HTML page, the same in Markdown, and every figure as a PNG.

`write_report` is the library behind ``headscan report``. The rest are plain functions over the tables
(`top_heads`, `findings`, `model_shapes`, `looking_both_ways_heads`, ...) that pick what a report shows; they
draw nothing, so tests can check them number by number. Drawing is `headscan.figures`.

Every sentence of a report's findings is generated from the numbers, and every metric definition is read
from the metric registry (``headscan.metrics.METRICS[name].definition``), so neither can drift from the code.
A report holds no time of its own making: regenerating it from the same runs gives the same bytes.

This module does not compute scores (see `headscan.sweep`) and loads a model only to draw the one example
attention pattern, through ``headscan.models.load_model`` and ``headscan.sweep.example_attention``.

>>> import pandas as pd
>>> heads = pd.DataFrame({"model": "m", "family": "causal", "layer": [0, 0, 1], "head": [0, 1, 0],
...                       "label": ["L0H0", "L0H1", "L1H0"], "metric": "prev_token", "value": [0.2, 0.9, 0.5],
...                       "count": 10.0, "ci_low": float("nan"), "ci_high": float("nan")})
>>> top_heads(heads, metric="prev_token", n=2)[["model", "rank", "label", "value"]].to_dict("records")
[{'model': 'm', 'rank': 1, 'label': 'L0H1', 'value': 0.9}, {'model': 'm', 'rank': 2, 'label': 'L1H0', 'value': 0.5}]
"""

from __future__ import annotations

import base64
import html
import inspect
import io
import math
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from . import figures, tables
from .errors import ConfigError, HeadscanError
from .metrics import METRICS
from .tables import SweepTables, load

__all__ = [
    "DEFAULT_EXAMPLE",
    "write_report",
    "merge_runs",
    "run_names",
    "top_heads",
    "ci_is_wide",
    "findings",
    "findings_by_model",
    "model_shapes",
    "looking_both_ways_heads",
]

DEFAULT_EXAMPLE = "The cat sat on the mat because it was tired, and then the cat slept."

WIDE_CI = 0.1  # an interval wider than this (shares) or than this fraction of the value (others) is shown
ANNOTATE_TOP = 3  # heads annotated in each heatmap
OFFSET_TOP = 3  # heads drawn in each offset profile
DPI = 130
DISPLAY = 0.7  # on the page, a figure's PNG pixels are shown at this scale (about 91 CSS pixels per inch)
REPORT_FILES = {"index.html", "report.md", "figures"}  # all a report folder holds; see _check_out

# What a share of attention is on, for the findings' sentences; other metrics are named as they are.
_ON = {
    "prev_token": "the previous token",
    "next_token": "the next token",
    "self": "itself",
    "first_token": "the first token",
    "sep": "separator tokens",
}
# Metrics a causal model must score 0 on: they need keys after the query.
_AHEAD = {"next_token", "positional_next"}

# Fixed fonts and styles: the same input draws the same pixels, whatever the user's matplotlibrc says.
_RC = {
    **sns.axes_style("ticks"),
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "svg.hashsalt": "headscan",
    "savefig.facecolor": "white",
    "figure.facecolor": "white",
}


# ---------------------------------------------------------------------------------------------------------
# Runs and models


@dataclass(frozen=True)
class ReportModel:
    """A model as one report shows it."""

    name: str  # shown in the report: the model's name, or "run:model" when several runs have that name
    run: str  # the run's name (its folder's name)
    model: str  # the name in the run's tables
    family: str  # "causal" or "bidirectional"
    info: dict = field(default_factory=dict, compare=False, hash=False)  # its run.json "models" entry, or {}


@dataclass
class Comparison:
    """One or more runs' tables side by side, every model renamed apart (see `merge_runs`)."""

    heads: pd.DataFrame
    offsets: pd.DataFrame
    runs: list[tuple[str, SweepTables]]
    models: list[ReportModel]

    @property
    def metrics(self) -> list[str]:
        """The heads table's metrics, in the registry's order where it knows them."""
        present = list(dict.fromkeys(self.heads["metric"]))
        order = {name: i for i, name in enumerate(METRICS)}
        return sorted(present, key=lambda m: (order.get(m, len(order)), present.index(m)))


def run_names(paths: Sequence[str | os.PathLike]) -> list[str]:
    """A short, distinct name for each run: its folder's name, with ``-2``, ``-3`` ... on repeats.

    >>> run_names(["a/out", "b/out", "c/gpt2"])
    ['out', 'out-2', 'gpt2']
    """
    names, seen = [], Counter()
    for path in paths:
        base = Path(path).resolve().name if Path(path).name in ("", ".", "..") else Path(path).name
        seen[base] += 1
        names.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return names


def merge_runs(runs: Sequence[SweepTables], names: Sequence[str] | None = None) -> Comparison:
    """Put several runs' tables into one, renaming a model ``run:model`` when more than one run has it.

    Parameters
    ----------
    runs : sequence of SweepTables
        The runs, as `headscan.tables.load` returns them.
    names : sequence of str, optional
        One name per run; `run_names` of their paths by default.

    Returns
    -------
    Comparison
        ``heads`` and ``offsets`` with the ``model`` column renamed, and one `ReportModel` per model.
    """
    if names is None:
        names = run_names([run.path or f"run{i + 1}" for i, run in enumerate(runs)])
    seen = Counter(model for run in runs for model in run.models)
    models, heads, offsets = [], [], []
    for name, run in zip(names, runs):
        infos = {m.get("name"): m for m in run.provenance.get("models", []) if isinstance(m, dict)}
        rename = {}
        for model in run.models:
            shown = f"{name}:{model}" if seen[model] > 1 else model
            rename[model] = shown
            family = str(run.heads.loc[run.heads["model"] == model, "family"].iloc[0])
            models.append(ReportModel(shown, name, model, family, dict(infos.get(model, {}))))
        for frame, into in ((run.heads, heads), (run.offsets, offsets)):
            frame = frame.copy()
            frame["model"] = frame["model"].map(lambda m: rename.get(m, m)).astype("string")
            into.append(frame)
    return Comparison(
        heads=pd.concat(heads, ignore_index=True),
        offsets=pd.concat(offsets, ignore_index=True),
        runs=list(zip(names, runs)),
        models=models,
    )


# ---------------------------------------------------------------------------------------------------------
# Numbers: what a report shows, as DataFrames and sentences


def ci_is_wide(rows: pd.DataFrame, *, threshold: float = WIDE_CI) -> pd.Series:
    """Whether each row's 95% interval is wide enough to show.

    Wide means ``ci_high - ci_low > threshold`` for shares, and more than ``threshold`` times the value for
    unbounded metrics (entropy in nats, distance in tokens). Rows without an interval are not wide.

    >>> rows = pd.DataFrame({"metric": ["prev_token", "prev_token", "entropy"], "value": [0.5, 0.5, 2.0],
    ...                      "ci_low": [0.3, 0.45, 1.9], "ci_high": [0.7, 0.55, 2.1]})
    >>> ci_is_wide(rows).tolist()
    [True, False, False]
    """
    width = rows["ci_high"] - rows["ci_low"]
    share = rows["metric"].map(figures.is_share).astype(bool)
    limit = np.where(share, threshold, threshold * rows["value"].abs())
    # The 1e-9 keeps an interval of exactly the threshold (0.55 - 0.45 in floating point) from counting as wide.
    return pd.Series((width > limit + 1e-9).fillna(False).to_numpy(dtype=bool), index=rows.index)


def top_heads(heads: pd.DataFrame, *, metric: str, n: int = 10, model: str | None = None) -> pd.DataFrame:
    """The `n` highest-scoring heads of each model on `metric`: `headscan.tables.top_heads`, ranked.

    Heads where the metric is undefined (NaN) are left out; ties go to the lower layer, then head. A model
    whose heads all score the same has no top heads and is left out too (see `findings` for what it says).

    Returns
    -------
    DataFrame
        Columns ``model, rank, label, layer, head, value, ci_low, ci_high, wide`` (``wide``: see
        `ci_is_wide`), one block of up to `n` rows per model in the table's order, rank 1 first.

    Raises
    ------
    MetricError
        `metric` is not in the registry, or is not a head score.
    """
    rows = heads[heads["metric"] == metric]
    if model is not None:
        rows = rows[rows["model"] == model]
    scores = rows.groupby("model", sort=False)["value"]
    varied = scores.max() > scores.min()  # False where every head scores the same, or none is defined
    top = tables.top_heads(rows[rows["model"].isin(varied.index[varied])], metric, n)
    order = {name: i for i, name in enumerate(varied.index)}
    top = top.sort_values("model", key=lambda names: names.map(order), kind="stable").reset_index(drop=True)
    top["rank"] = top.groupby("model", sort=False).cumcount() + 1
    top["wide"] = ci_is_wide(top.assign(metric=metric))
    columns = ["model", "rank", "label", "layer", "head", "value", "ci_low", "ci_high", "wide"]
    return top[columns].astype({"model": str, "label": str})


def _pct(value: float) -> str:
    text = f"{100 * value:.1f}%"
    # 0.9998 is not all of the attention: keep the digit that says so.
    return f"{100 * value:.2f}%" if text == "100.0%" and value < 1 else text


def _interval(row: pd.Series, share: bool) -> str:
    low, high = row["ci_low"], row["ci_high"]
    if pd.isna(low) or pd.isna(high):
        return ""
    if share:
        return f" (95% interval {_pct(low)} to {_pct(high)})"
    return f" (95% interval {low:.2f} to {high:.2f})"


def findings(heads: pd.DataFrame, *, threshold: float = 0.5) -> list[str]:
    """Sentences that state what the numbers show, generated from `heads` (never written by hand).

    All of `findings_by_model`'s sentences in one list, model by model, then those across runs.

    For each model: its strongest previous-token head (and, in a bidirectional model, next-token head);
    any other head that puts more than `threshold` of its attention on one kind of token; metrics that are
    0, or undefined, for every head (and whether a causal model must score 0 there); how many heads look
    mostly at the previous token; where attention is most focused and broadest; how many scores have wide
    intervals. Across runs: how far two runs of the same model agree.

    >>> heads = pd.DataFrame({"model": "m", "family": "causal", "layer": 0, "head": [0, 1, 0, 1],
    ...                       "label": ["L0H0", "L0H1"] * 2, "metric": ["prev_token"] * 2 + ["next_token"] * 2,
    ...                       "value": [0.999, 0.1, 0.0, 0.0], "count": 10.0, "ci_low": float("nan"),
    ...                       "ci_high": float("nan")})
    >>> for sentence in findings(heads):
    ...     print(sentence)
    In m, L0H0 puts 99.9% of its attention on the previous token.
    1 of 2 heads in m put more than half of their attention on the previous token.
    m's `next_token` is 0 for every head, as a causal model's must be: it cannot attend to later tokens.
    """
    return [sentence for sentences in findings_by_model(heads, threshold=threshold).values() for sentence in sentences]


def findings_by_model(heads: pd.DataFrame, *, threshold: float = 0.5) -> dict[str, list[str]]:
    """`findings`, keyed by model (in the table's order), with the sentences across runs under ``""``."""
    by_model: dict[str, list[str]] = {}
    for model in dict.fromkeys(heads["model"]):
        out = by_model[model] = []
        rows = heads[heads["model"] == model]
        family = str(rows["family"].iloc[0])
        n_heads = len(rows[["layer", "head"]].drop_duplicates())
        metrics = list(dict.fromkeys(rows["metric"]))

        # The strongest heads: previous token always, next token in a bidirectional model, any other
        # "on what" metric where one head is mostly on it.
        for metric in [m for m in _ON if m in metrics]:
            top = top_heads(rows, metric=metric, n=1)
            if top.empty:
                continue
            best = top.iloc[0]
            wanted = metric == "prev_token" or (metric == "next_token" and family == "bidirectional")
            if wanted or best["value"] > threshold:
                out.append(
                    f"In {model}, {best['label']} puts {_pct(best['value'])} of its attention on {_ON[metric]}"
                    f"{_interval(best, True) if best['wide'] else ''}."
                )
        if "prev_token" in metrics:
            prev = rows[rows["metric"] == "prev_token"]["value"]
            many = int((prev > threshold).sum())
            if many:
                out.append(
                    f"{many} of {n_heads} heads in {model} put more than {'half' if threshold == 0.5 else _pct(threshold)}"
                    " of their attention on the previous token."
                )

        for metric in metrics:
            values = rows[rows["metric"] == metric]["value"]
            finite = values.dropna()
            if finite.empty:
                out.append(
                    f"{model}'s `{metric}` is undefined for every head: no query of the corpus counts for it."
                )
            elif figures.is_share(metric) and (finite.abs() < 1e-12).all() and len(finite) == len(values):
                why = (
                    ", as a causal model's must be: it cannot attend to later tokens"
                    if family == "causal" and metric in _AHEAD
                    else ""
                )
                out.append(f"{model}'s `{metric}` is 0 for every head{why}.")
            elif family == "causal" and metric in _AHEAD and finite.max() > 1e-6:
                label = rows.loc[finite.idxmax(), "label"]
                out.append(
                    f"Check the sweep: {model} is causal, yet {label} scores {finite.max():.3g} on `{metric}`, "
                    "which needs attention to later tokens."
                )

        if "entropy" in metrics:
            by_layer = rows[rows["metric"] == "entropy"].groupby("layer")["value"].mean().dropna()
            if len(by_layer) > 1:
                out.append(
                    f"In {model}, attention is most focused in layer {int(by_layer.idxmin())} (mean entropy "
                    f"{by_layer.min():.2f} nats) and broadest in layer {int(by_layer.idxmax())} "
                    f"({by_layer.max():.2f} nats)."
                )

        if {"ci_low", "ci_high"} <= set(rows.columns):
            shares = rows[rows["metric"].map(figures.is_share).astype(bool) & rows["value"].notna()]
            wide = int(ci_is_wide(shares).sum())
            if wide:
                out.append(
                    f"{wide} of {len(shares)} share scores of {model} have a 95% interval wider than "
                    f"{WIDE_CI:g}; a larger corpus would narrow them."
                )

    agreement = _agreement(heads)
    if agreement:
        by_model[""] = agreement
    return by_model


def _agreement(heads: pd.DataFrame) -> list[str]:
    """A sentence for each pair of runs of the same model: how far apart their share scores are."""
    names = list(dict.fromkeys(heads["model"]))
    by_model: dict[str, list[str]] = {}
    for name in names:
        if ":" in name:
            by_model.setdefault(name.split(":", 1)[1], []).append(name)
    out = []
    for model, shown in by_model.items():
        for i, first in enumerate(shown):
            for second in shown[i + 1:]:
                keys = ["layer", "head", "label", "metric"]
                pair = heads[heads["model"] == first].merge(
                    heads[heads["model"] == second], on=keys, suffixes=("_a", "_b")
                )
                pair = pair[pair["metric"].map(figures.is_share).astype(bool)]
                gap = (pair["value_a"] - pair["value_b"]).abs().dropna()
                if gap.empty:
                    continue
                if gap.max() < 5e-4:
                    out.append(f"{first} and {second} give every head the same share scores, to within 0.0005.")
                    continue
                worst = pair.loc[gap.idxmax()]
                out.append(
                    f"{first} and {second} agree within {gap.max():.3f} on every share score of every head "
                    f"(the largest gap: `{worst['metric']}` of {worst['label']})."
                )
    return out


def looking_both_ways_heads(heads: pd.DataFrame) -> pd.DataFrame:
    """For each model, the head to draw "looking both ways": a causal model's strongest previous-token head,
    a bidirectional model's strongest next-token head.

    Returns
    -------
    DataFrame
        Columns ``model, family, metric, label, layer, head, value``; a model without that metric, or whose
        heads all score the same on it, is left out.
    """
    rows = []
    for model in dict.fromkeys(heads["model"]):
        part = heads[heads["model"] == model]
        family = str(part["family"].iloc[0])
        metric = "prev_token" if family == "causal" else "next_token"
        top = top_heads(part, metric=metric, n=1)
        if not top.empty:
            best = top.iloc[0]
            rows.append({"model": model, "family": family, "metric": metric, "label": best["label"],
                         "layer": int(best["layer"]), "head": int(best["head"]), "value": float(best["value"])})
    return pd.DataFrame(rows, columns=["model", "family", "metric", "label", "layer", "head", "value"])


def _count(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (int, np.integer)) or (isinstance(value, float) and value.is_integer()):
        return f"{int(value):,}"
    return str(value)


def model_shapes(comparison: Comparison) -> pd.DataFrame:
    """One row per model comparing their shapes, from each run's provenance (the tables where it is silent).

    Returns
    -------
    DataFrame
        Columns ``model, family, layers, heads, kv heads, width, parameters, tokenizer, vocabulary, context``
        as display strings ("–" where unknown), plus ``run`` first when the report has several runs.
    """
    rows = []
    for m in comparison.models:
        info = m.info
        part = comparison.heads[comparison.heads["model"] == m.name]
        row = {
            "run": m.run,
            "model": m.name,
            "family": info.get("family", m.family),
            "layers": _count(info.get("n_layers", int(part["layer"].max()) + 1)),
            "heads": _count(info.get("n_heads", int(part["head"].max()) + 1)),
            "kv heads": _count(info.get("n_kv_heads", int(part["kv_group"].max()) + 1)),
            "width": _count(info.get("d_model")),
            "parameters": _count(info.get("n_params")),
            "tokenizer": str(info.get("tokenizer", "–")),
            "vocabulary": _count(info.get("vocab_size")),
            "context": _count(info.get("max_context")),
        }
        rows.append(row)
    frame = pd.DataFrame(rows)
    if len(comparison.runs) == 1:
        frame = frame.drop(columns="run")
    return frame


def model_spec(m: ReportModel) -> str:
    """What to pass to ``headscan.models.load_model`` to get `m` back: its alias, else its id or path."""
    if m.info.get("source", "alias") == "alias":
        return str(m.info.get("name", m.model))
    return str(m.info.get("id") or m.info.get("name", m.model))


# ---------------------------------------------------------------------------------------------------------
# The document: a list of blocks that render to both HTML and Markdown, so the two cannot differ.


@dataclass
class _Heading:
    level: int
    text: str

    @property
    def anchor(self) -> str:
        # GitHub's rule for simple headings, so report.md's table of contents links work there too.
        return re.sub(r"[^a-z0-9 _-]", "", self.text.lower()).strip().replace(" ", "-")


@dataclass
class _Text:
    text: str  # `code` spans in backticks; nothing else is markup


@dataclass
class _Note:
    text: str


@dataclass
class _Bullets:
    items: list[str]


@dataclass
class _Table:
    frame: pd.DataFrame  # cells are display strings
    numeric: tuple[str, ...] = ()  # columns aligned right
    note: str = ""


@dataclass
class _Figures:
    names: list[str]  # files in figures/
    caption: str


@dataclass
class _Panels:
    items: list[tuple[str, _Table]]  # (heading, table): side by side in HTML, one after another in Markdown


@dataclass
class _Definition:
    term: str
    kind: str
    body: str  # the registry's docstring text


_CODE = re.compile(r"(`+)(.+?)\1", re.S)


def _inline_html(text: str) -> str:
    out, last = [], 0
    for match in _CODE.finditer(text):
        out.append(html.escape(text[last:match.start()]))
        out.append(f"<code>{html.escape(match.group(2).strip())}</code>")
        last = match.end()
    out.append(html.escape(text[last:]))
    return "".join(out)


_MD_SPECIAL = re.compile(r"([\\*_<>|$#])")


def _inline_md(text: str) -> str:
    out, last = [], 0
    for match in _CODE.finditer(text):
        out.append(_MD_SPECIAL.sub(r"\\\1", text[last:match.start()]))
        out.append(f"`{match.group(2).strip()}`")
        last = match.end()
    out.append(_MD_SPECIAL.sub(r"\\\1", text[last:]))
    return "".join(out).replace("\n", " ")


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


_CSS = """
:root{--ink:#1f2328;--muted:#59636e;--line:#d8dee4;--soft:#f6f8fa}
*{box-sizing:border-box}
body{margin:0;font:15px/1.55 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:var(--ink);background:#fff}
main{max-width:1180px;margin:0 auto;padding:28px 36px 80px}
h1{font-size:1.9em;margin:0 0 .2em}
h2{font-size:1.4em;margin:2.2em 0 .6em;padding-bottom:.25em;border-bottom:1px solid var(--line)}
h3{font-size:1.1em;margin:1.6em 0 .4em}
p,li{max-width:78ch}
code{font:.88em ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:var(--soft);padding:.05em .3em;border-radius:4px}
nav.toc{display:inline-block;background:var(--soft);border:1px solid var(--line);border-radius:8px;padding:.5em 1.6em .7em 1em;margin:.8em 0}
nav.toc h2{font-size:1em;border:0;margin:.2em 0;padding:0}
nav.toc ol{margin:.2em 0;padding-left:1.4em}
a{color:#0969da;text-decoration:none}a:hover{text-decoration:underline}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.88em}
th,td{padding:.3em .75em;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:var(--soft);font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.scroll{overflow-x:auto}
.note{border-left:4px solid #d4a72c;background:#fff8c5;padding:.6em 1em;border-radius:0 6px 6px 0;max-width:78ch}
.panels{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:4px 28px}
.panels table{width:100%}
.gallery{display:flex;flex-wrap:wrap;gap:14px;align-items:flex-start}
figure{margin:.8em 0 1.4em}
figure img{display:block;max-width:100%;height:auto;border:1px solid var(--line);border-radius:6px}
figcaption{font-size:.86em;color:var(--muted);margin-top:.4em;max-width:90ch}
dl dt{margin-top:1.2em;font-weight:600}dl dd{margin:.3em 0 0 1.4em}
.muted{color:var(--muted)}
@media print{main{max-width:none;padding:0}nav.toc{display:none}h2{break-before:auto}figure,table{break-inside:avoid}}
""".strip()


def _table_html(block: _Table) -> str:
    def cls(column):
        return ' class="num"' if column in block.numeric else ""

    head = "".join(f"<th{cls(c)}>{_inline_html(str(c))}</th>" for c in block.frame.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td{cls(c)}>{_inline_html(str(v))}</td>" for c, v in zip(block.frame.columns, r)) + "</tr>"
        for r in block.frame.itertuples(index=False)
    )
    note = f'<p class="muted">{_inline_html(block.note)}</p>' if block.note else ""
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>{note}'


def _render_html(title: str, blocks: list, pngs: Mapping[str, bytes]) -> str:
    toc = [b for b in blocks if isinstance(b, _Heading) and b.level == 2]
    body: list[str] = []
    in_list = False
    for block in blocks:
        # Consecutive definitions make one <dl>.
        if in_list and not isinstance(block, _Definition):
            body.append("</dl>")
        elif not in_list and isinstance(block, _Definition):
            body.append("<dl>")
        in_list = isinstance(block, _Definition)
        if isinstance(block, _Heading):
            if block.level == 1:
                body.append(f"<h1>{_inline_html(block.text)}</h1>")
                continue
            body.append(f'<h{block.level} id="{block.anchor}">{_inline_html(block.text)}</h{block.level}>')
            continue
        if block is _TOC:
            items = "".join(f'<li><a href="#{h.anchor}">{_inline_html(h.text)}</a></li>' for h in toc)
            body.append(f'<nav class="toc"><h2>Contents</h2><ol>{items}</ol></nav>')
        elif isinstance(block, _Text):
            body.append(f"<p>{_inline_html(block.text)}</p>")
        elif isinstance(block, _Note):
            body.append(f'<p class="note">{_inline_html(block.text)}</p>')
        elif isinstance(block, _Bullets):
            body.append("<ul>" + "".join(f"<li>{_inline_html(i)}</li>" for i in block.items) + "</ul>")
        elif isinstance(block, _Table):
            body.append(_table_html(block))
        elif isinstance(block, _Panels):
            panels = "".join(
                f'<section><h3 id="{_Heading(3, title).anchor}">{_inline_html(title)}</h3>{_table_html(table)}</section>'
                for title, table in block.items
            )
            body.append(f'<div class="panels">{panels}</div>')
        elif isinstance(block, _Figures):
            images = []
            for name in block.names:
                data = pngs[name]
                width, height = (round(DISPLAY * int.from_bytes(data[i:i + 4], "big")) for i in (16, 20))  # IHDR
                alt = html.escape(name.removesuffix(".png").replace("_", " "), quote=True)
                images.append(
                    f'<img src="data:image/png;base64,{base64.b64encode(data).decode("ascii")}" width="{width}" '
                    f'height="{height}" alt="{alt}" title="figures/{html.escape(name)}">'
                )
            wrap = f'<div class="gallery">{"".join(images)}</div>' if len(images) > 1 else images[0]
            body.append(f"<figure>{wrap}<figcaption>{_inline_html(block.caption)}</figcaption></figure>")
        elif isinstance(block, _Definition):
            parts = []
            for para in _paragraphs(block.body):
                if isinstance(para, list):
                    parts.append("<ul>" + "".join(f"<li>{_inline_html(i)}</li>" for i in para) + "</ul>")
                else:
                    parts.append(f"<p>{_inline_html(para)}</p>")
            body.append(
                f'<dt id="metric-{block.term}"><code>{html.escape(block.term)}</code> '
                f'<span class="muted">({_inline_html(block.kind)})</span></dt><dd>{"".join(parts)}</dd>'
            )
    if in_list:
        body.append("</dl>")
    joined = "\n".join(body)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>\n{_CSS}\n</style>\n</head>\n<body>\n<main>\n"
        f"{joined}\n</main>\n</body>\n</html>\n"
    )


def _table_md(block: _Table) -> str:
    columns = list(block.frame.columns)
    lines = ["| " + " | ".join(_inline_md(str(c)) for c in columns) + " |",
             "| " + " | ".join("---:" if c in block.numeric else "---" for c in columns) + " |"]
    lines += ["| " + " | ".join(_inline_md(str(v)) for v in r) + " |" for r in block.frame.itertuples(index=False)]
    if block.note:
        lines.append(f"\n*{_inline_md(block.note)}*")
    return "\n".join(lines)


def _render_md(blocks: list) -> str:
    toc = [b for b in blocks if isinstance(b, _Heading) and b.level == 2]
    out: list[str] = []
    for block in blocks:
        if isinstance(block, _Heading):
            out.append(f"{'#' * block.level} {block.text}")
        elif block is _TOC:
            out.append("**Contents**\n\n" + "\n".join(
                f"{i}. [{h.text}](#{h.anchor})" for i, h in enumerate(toc, 1)))
        elif isinstance(block, _Text):
            out.append(_inline_md(block.text))
        elif isinstance(block, _Note):
            out.append(f"> **Note.** {_inline_md(block.text)}")
        elif isinstance(block, _Bullets):
            out.append("\n".join(f"- {_inline_md(i)}" for i in block.items))
        elif isinstance(block, _Table):
            out.append(_table_md(block))
        elif isinstance(block, _Panels):
            for title, table in block.items:
                out += [f"### {title}", _table_md(table)]
        elif isinstance(block, _Figures):
            out.append("\n".join(f"![{n.removesuffix('.png')}](figures/{n})" for n in block.names))
            out.append(f"*{_inline_md(block.caption)}*")
        elif isinstance(block, _Definition):
            parts = [f"**`{block.term}`** ({_inline_md(block.kind)})"]
            for para in _paragraphs(block.body):
                parts.append("\n".join(f"- {_inline_md(i)}" for i in para) if isinstance(para, list)
                             else _inline_md(para))
            out.append("\n\n".join(parts))
    return "\n\n".join(out) + "\n"


_TOC = object()  # where the table of contents goes


# ---------------------------------------------------------------------------------------------------------
# Building the report


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"


class _Pngs(dict):
    """Figure file name -> PNG bytes, names kept distinct."""

    def add(self, name: str, fig: Figure) -> str:
        base, n = name, 2
        while name in self:
            name = base.removesuffix(".png") + f"-{n}.png"
            n += 1
        buf = io.BytesIO()
        # No "Software" entry and no date: the same figure gives the same bytes.
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
        self[name] = buf.getvalue()
        return name


def _fmt_value(metric: str, value: float) -> str:
    return f"{value:.3f}" if figures.is_share(metric) else f"{value:.2f}"


def _top_table(comparison: Comparison, metric: str, n: int) -> _Table:
    top = top_heads(comparison.heads, metric=metric, n=n)
    columns: dict[str, list[str]] = {"rank": [str(i) for i in range(1, n + 1)]}
    for m in comparison.models:
        part = top[top["model"] == m.name]
        cells = []
        for row in part.itertuples():
            cell = f"{row.label}  {_fmt_value(metric, row.value)}"
            if pd.notna(row.ci_low) and pd.notna(row.ci_high):
                cell += f" [{_fmt_value(metric, row.ci_low)}, {_fmt_value(metric, row.ci_high)}]"
            if row.wide:
                cell += " †"
            cells.append(cell)
        if not cells:
            values = comparison.heads[(comparison.heads["model"] == m.name)
                                      & (comparison.heads["metric"] == metric)]["value"].dropna()
            if values.empty:
                cells = ["undefined for every head"]
            else:
                cells = [f"{_fmt_value(metric, values.iloc[0])} for every head"]
        columns[m.name] = cells + [""] * (n - len(cells))
    frame = pd.DataFrame(columns)
    frame = frame[(frame.drop(columns="rank") != "").any(axis=1)]
    return _Table(frame, numeric=("rank",))


def _provenance_blocks(comparison: Comparison) -> list:
    blocks: list = []
    for name, run in comparison.runs:
        p = run.provenance
        blocks.append(_Heading(3, f"Run {name}"))
        if not p:
            blocks.append(_Note(f"`{run.path}` has no provenance (no run.json, no parquet metadata)."))
            continue
        corpus = p.get("corpus", {}) or {}
        sha = str(corpus.get("sha256", ""))
        corpus_text = (f"{corpus.get('source', '–')} ({corpus.get('kind', '?')}, "
                       f"{_count(corpus.get('n_segments'))} segments"
                       + (f", sha256 {sha[:16]}…" if sha else "") + ")")
        config = ", ".join(f"{k}={v}" for k, v in (p.get("config") or {}).items())
        versions = ", ".join(f"{k} {v}" for k, v in (p.get("versions") or {}).items())
        rows = [
            ("folder", f"`{run.path}`" if run.path else "–"),
            ("command", f"`{p['command']}`" if p.get("command") else "–"),
            ("started", str(p.get("started", "–"))),
            ("finished", str(p.get("finished", "–"))),
            ("headscan", str(p.get("headscan_version", "–"))
             + (f" (git {str(p['git_revision'])[:12]})" if p.get("git_revision") else "")),
            ("corpus", corpus_text),
            ("config", config or "–"),
            ("versions", versions or "–"),
        ]
        blocks.append(_Table(pd.DataFrame(rows, columns=["", "value"])))
        models = []
        for info in p.get("models", []) or []:
            revision = str(info.get("revision") or "–")
            models.append({
                "model": str(info.get("name", "–")),
                "source": str(info.get("source", "–")),
                "id": f"`{info['id']}`" if info.get("id") else "–",
                "revision": revision if len(revision) <= 24 else revision[:24] + "…",
                "segments": _count(info.get("n_segments")),
                "tokens": _count(info.get("n_tokens")),
                "seconds": f"{info['seconds']:.1f}" if isinstance(info.get("seconds"), (int, float)) else "–",
            })
        if models:
            blocks.append(_Table(pd.DataFrame(models), numeric=("segments", "tokens", "seconds")))
    return blocks


# What loading a model or running it on the example may raise: headscan's own errors and the I/O or torch
# failures beneath them. Anything else is a bug and should surface.
_EXAMPLE_ERRORS = (HeadscanError, OSError, RuntimeError)


def _example_figure(comparison: Comparison, text: str, load_models: bool, pngs: _Pngs) -> list:
    """The "looking both ways" section: the figure if any model could be loaded, and why not for the rest."""
    picks = looking_both_ways_heads(comparison.heads)
    intro = _Text(
        "Each causal model's strongest previous-token head and each bidirectional model's strongest next-token "
        f"head, on one example sentence: \u201c{text}\u201d. Rows are queries, columns the keys they attend "
        "to; a causal model cannot see later tokens, so its pattern is a triangle beside the bidirectional "
        "model's full square."
    )
    if picks.empty:
        return [intro, _Note("No model has a previous-token (causal) or next-token (bidirectional) score to pick a head by.")]
    if not load_models:
        return [intro, _Note("The example attention could not be drawn: this report was made without loading the "
                             "models. Everything else here needs only the tables.")]
    from . import models, sweep  # torch and the model bridge, imported only when a report loads models

    drawn, failed, loaded = [], [], {}
    by_name = {m.name: m for m in comparison.models}
    for pick in picks.itertuples():
        m = by_name[pick.model]
        spec = model_spec(m)
        try:
            # Two runs of one model load it once; a model that failed to load is not tried again.
            if spec not in loaded:
                try:
                    loaded[spec] = models.load_model(spec, device="cpu")
                except _EXAMPLE_ERRORS as error:
                    loaded[spec] = error
            if isinstance(loaded[spec], BaseException):
                raise loaded[spec]
            tokens, pattern = sweep.example_attention(loaded[spec], text, pick.layer)  # pattern: (head, q_pos, k_pos)
            drawn.append((pick, list(tokens), np.asarray(pattern)[pick.head]))
        except _EXAMPLE_ERRORS as error:
            failed.append(f"{m.name} (`{spec}`): {type(error).__name__}: {error}")
    blocks: list = [intro]
    if drawn:
        size = max(len(tokens) for _, tokens, _ in drawn)
        side = min(max(3.6, 0.26 * size + 1.6), 9.0)
        fig = Figure(figsize=(side * len(drawn) + 0.8, side + 0.4), layout="constrained")
        axes = fig.subplots(1, len(drawn), squeeze=False)[0]
        for i, (pick, tokens, matrix) in enumerate(drawn):
            figures.attention_matrix(
                tokens, matrix, causal=pick.family == "causal", ax=axes[i], cbar=i == len(drawn) - 1,
                title=f"{pick.model} {pick.label}: {pick.metric} {pick.value:.2f}\n({pick.family})",
            )
        name = pngs.add("looking_both_ways.png", fig)
        blocks.append(_Figures([name], "Looking both ways: " + "; ".join(
            f"{p.model} {p.label} ({p.metric} {p.value:.3f} over the corpus)" for p, _, _ in drawn)
            + ". One shared 0-1 colour scale; blank cells are keys a causal model cannot see."))
    if failed:
        blocks.append(_Note(f"The example attention could not be drawn for {len(failed)} of {len(picks)} "
                            "models; everything else here needs only the tables. Why:"))
        blocks.append(_Bullets(failed))
    return blocks


def _findings_title(comparison: Comparison, model: str) -> str:
    if not model:
        return "Across runs"
    family = next((m.family for m in comparison.models if m.name == model), "")
    return f"{model} ({family})" if family else model


def _heatmap_size(n_layers: int, n_heads: int) -> tuple[float, float]:
    return (min(max(3.4, 0.36 * n_heads + 1.9), 12.0), min(max(2.2, 0.21 * n_layers + 1.1), 10.0))


def build_report(
    comparison: Comparison, *, top: int = 10, example: str | None = None, load_models: bool = True,
    title: str = "headscan report",
) -> tuple[str, str, dict[str, bytes]]:
    """Draw every figure and lay out the report.

    Returns
    -------
    html, markdown : str
        ``index.html`` (figures embedded) and ``report.md`` (figures linked as ``figures/NAME``).
    pngs : dict of str to bytes
        Each figure's file name and PNG bytes.
    """
    if top < 1:
        raise ConfigError(f"--top must be at least 1, not {top}; pass how many heads to list per metric, e.g. --top 10")
    example = example or DEFAULT_EXAMPLE
    heads, offsets = comparison.heads, comparison.offsets
    metrics = comparison.metrics
    ranked = [metric for metric in metrics if metric in METRICS]  # top_heads refuses names it does not know
    names = [m.name for m in comparison.models]
    palette = figures.model_palette(names)
    pngs = _Pngs()
    blocks: list = []

    with matplotlib.rc_context(_RC):
        blocks += [
            _Heading(1, title),
            _Text(f"{len(comparison.runs)} run{'s' if len(comparison.runs) > 1 else ''} "
                  f"({', '.join(n for n, _ in comparison.runs)}), {len(names)} model{'s' if len(names) > 1 else ''} "
                  f"({', '.join(names)}), {len(metrics)} metrics per head."
                  + (" A model in more than one run is named run:model." if any(":" in n for n in names) else "")),
            _Text("Heads are labelled L{layer}H{head}, both 0-indexed (the TransformerLens convention): "
                  "Clark et al.'s (2019) 1-indexed BERT \u201chead 3-1\u201d is L2H0 here. Shares of attention "
                  "run from 0 to 1 on one colour scale throughout; entropy is in nats and distance in tokens."),
            _TOC,
            _Heading(2, "Findings"),
            _Text("Generated from the tables; each sentence states a number in them."),
            *[block for model, sentences in findings_by_model(heads).items()
              for block in (_Heading(3, _findings_title(comparison, model)), _Bullets(sentences))],
            _Heading(2, "Runs"),
            _Text("Where each table came from: the command, the corpus, the settings and the software versions."),
            *_provenance_blocks(comparison),
            _Heading(2, "Models"),
            _Table(model_shapes(comparison), numeric=("layers", "heads", "kv heads", "width", "parameters",
                                                      "vocabulary", "context")),
            _Heading(2, "Looking both ways"),
            *_example_figure(comparison, example, load_models, pngs),
            _Heading(2, "Heatmaps"),
            _Text(f"One layer x head heatmap per metric and model: layers are rows (layer 0 at the top), heads "
                  f"columns. The {ANNOTATE_TOP} strongest heads carry their value; grey cells are undefined."),
        ]
        for metric in metrics:
            rows = heads[heads["metric"] == metric]
            share = figures.is_share(metric)
            finite = rows["value"].dropna()
            # One scale per metric across models: 0-1 for shares, 0 to the largest value otherwise.
            vmax = 1.0 if share else (float(finite.max()) if len(finite) and finite.max() > 0 else 1.0)
            files = []
            for m in comparison.models:
                part = rows[rows["model"] == m.name]
                if part.empty:
                    continue
                fig = Figure(figsize=_heatmap_size(int(part["layer"].max()) + 1, int(part["head"].max()) + 1),
                             layout="constrained")
                figures.head_heatmap(part, model=m.name, metric=metric, ax=fig.subplots(), vmin=0.0, vmax=vmax,
                                     annotate_top=ANNOTATE_TOP)
                files.append(pngs.add(f"heatmap_{metric}_{_slug(m.name)}.png", fig))
            scale = "the shared 0-1 share scale" if share else f"0 to {vmax:.2f} ({figures._value_label(metric)})"
            blocks += [_Heading(3, metric), _Figures(files, f"`{metric}` by layer and head; colour: {scale}.")]

        blocks += [
            _Heading(2, "Top heads"),
            _Text(f"The {top} highest-scoring heads of each metric in each model: label, value and, where the "
                  "sweep bootstrapped it, the 95% interval over segments."),
        ]
        blocks.append(_Panels([(f"Top {metric}", _top_table(comparison, metric, top)) for metric in ranked]))
        blocks.append(_Note(f"† marks a 95% interval wider than {WIDE_CI:g} (shares) or than {WIDE_CI:.0%} of the "
                            "value (entropy, distance): read that value with care."))

        blocks += [
            _Heading(2, "Offset profiles"),
            _Text(f"Mean attention on the key at query + d, for d from -K to K, of the {OFFSET_TOP} strongest heads of "
                  "each metric: a previous-token head peaks at -1, a next-token head at +1, a self head at 0."),
        ]
        for m in comparison.models:
            part = offsets[offsets["model"] == m.name]
            if part.empty:
                blocks.append(_Note(f"{m.name} has no offsets table rows."))
                continue
            shown = [(metric, top_heads(heads, metric=metric, n=OFFSET_TOP, model=m.name)) for metric in ranked]
            shown = [(metric, t) for metric, t in shown if not t.empty]
            if not shown:
                continue
            ncols = min(4, len(shown))
            nrows = math.ceil(len(shown) / ncols)
            fig = Figure(figsize=(3.0 * ncols, 2.5 * nrows + 0.3), layout="constrained")
            axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True).ravel()
            for ax, (metric, t) in zip(axes, shown):
                figures.offset_profiles(part, model=m.name, heads=list(t["label"]), ax=ax, title=metric)
                ax.label_outer()
            for ax in axes[len(shown):]:
                ax.set_visible(False)
            fig.suptitle(f"{m.name}: offset profiles of each metric's strongest heads")
            blocks.append(_Figures([pngs.add(f"offsets_{_slug(m.name)}.png", fig)],
                                   f"{m.name}: mean attention by relative offset; shading is the 95% interval."))

        blocks.append(_Heading(2, "Previous against next token"))
        if {"prev_token", "next_token"} <= set(metrics):
            fig = Figure(figsize=(6.0, 5.6), layout="constrained")
            figures.prev_next_scatter(heads, ax=fig.subplots(), palette=palette, ci_threshold=WIDE_CI)
            blocks.append(_Figures([pngs.add("prev_next_scatter.png", fig)],
                                   "One point per head: its previous-token share against its next-token share. "
                                   "Causal models' heads lie on the x axis (they cannot look ahead); error bars "
                                   f"show 95% intervals wider than {WIDE_CI:g}."))
        else:
            blocks.append(_Note("The tables have no prev_token and next_token metrics to compare."))

        blocks.append(_Heading(2, "Entropy by layer"))
        if "entropy" in metrics:
            n_layers = int(heads["layer"].max()) + 1
            fig = Figure(figsize=(6.4, min(max(3.2, 0.22 * n_layers + 1.6), 10.0)), layout="constrained")
            figures.entropy_by_layer(heads, ax=fig.subplots(), palette=palette)
            blocks.append(_Figures([pngs.add("entropy_by_layer.png", fig)],
                                   "Attention entropy (nats) of every head, layer by layer; the line is the "
                                   "mean over a layer's heads. Low entropy is focused attention."))
        else:
            blocks.append(_Note("The tables have no entropy metric."))

        blocks += [_Heading(2, "Metric definitions"),
                   _Text("Read from the metric registry (headscan.metrics.METRICS) of the headscan that wrote "
                         "this report, so they match the code.")]
        shown = metrics + [n for n, e in METRICS.items() if e.table == "offsets" and n not in metrics]
        for name in shown:
            entry = METRICS.get(name)
            if entry is None:
                blocks.append(_Definition(name, "not in this headscan's registry",
                                          "No definition: this metric is not registered in the installed headscan, "
                                          "so it is drawn but not ranked."))
                continue
            kind = "share, 0 to 1" if entry.bounded else "unbounded"
            blocks.append(_Definition(name, f"{kind}; {entry.table} table", entry.definition))

    return _render_html(title, blocks, pngs), _render_md(blocks), dict(pngs)


# ---------------------------------------------------------------------------------------------------------
# Writing


def _check_out(out: Path) -> None:
    """Refuse to replace a folder that is not an earlier report: --out . must never delete a project."""
    if out.exists():
        if not out.is_dir():
            raise ConfigError(f"{out}: exists and is not a folder; choose another --out")
        extra = sorted(p.name for p in out.iterdir() if p.name not in REPORT_FILES)
        if extra:
            raise ConfigError(
                f"{out}: exists and holds {extra[:5]}, which a headscan report would not; choose another "
                "--out, or remove the folder"
            )


def write_report(
    runs: Sequence[str | os.PathLike],
    out: str | os.PathLike | None = None,
    *,
    top: int = 10,
    example: str | None = None,
    load_models: bool = True,
) -> Path:
    """Write a report over one or more sweep outputs; runs are compared side by side.

    Parameters
    ----------
    runs : sequence of paths
        Sweep output folders (each holds heads.parquet, offsets.parquet and run.json).
    out : path, optional
        The report folder; ``reports/<name>`` by default, with name from the runs' folder names. An
        existing report there is replaced; any other existing folder is refused.
    top : int, default 10
        How many top heads to list per metric and model.
    example : str, optional
        The sentence for the "looking both ways" attention patterns; `DEFAULT_EXAMPLE` by default.
    load_models : bool, default True
        Load the models (``headscan.models.load_model``) to draw the example attention. Without them, or when
        one cannot be loaded, the report says so and shows everything that needs only the tables.

    Returns
    -------
    Path
        The report folder: ``index.html`` (self-contained), ``report.md`` and ``figures/*.png``.

    Raises
    ------
    TablesError
        A run folder is missing or incomplete.
    ConfigError
        No runs, `top` below 1, or `out` exists and is not a report.
    """
    paths = [Path(r) for r in runs]
    if not paths:
        raise ConfigError("report needs at least one sweep output folder (the --out of `headscan sweep`)")
    names = run_names(paths)
    tables = [load(path) for path in paths]
    out = Path(out) if out is not None else Path("reports") / _slug("+".join(names))
    _check_out(out)
    comparison = merge_runs(tables, names)
    page, markdown, pngs = build_report(
        comparison, top=top, example=example, load_models=load_models,
        title=f"headscan report: {' vs '.join(names)}",
    )

    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and swap it in at the end: a failure leaves the old report (or none), never half.
    build = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    old = None
    try:
        (build / "figures").mkdir()
        for name, data in pngs.items():
            (build / "figures" / name).write_bytes(data)
        (build / "report.md").write_text(markdown, encoding="utf-8")
        (build / "index.html").write_text(page, encoding="utf-8")
        build.chmod(0o755)  # mkdtemp makes it private; a report is meant to be read
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
            os.replace(out, old / "report")
        os.replace(build, out)
    except BaseException:
        if old is not None and not out.exists():
            os.replace(old / "report", out)
        shutil.rmtree(build, ignore_errors=True)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return out
