"""Reports over one or more sweep outputs: one HTML page, the same in Markdown, and every figure as a PNG.

`write_report` is the library behind ``headscan report``; `build_report` lays out the sections as a
`headscan.document.Document`. The numbers come from `headscan.findings` and `headscan.runs`, the drawings
from `headscan.figures`, and the example attention from `headscan.examples`, computed beforehand and handed
in: this module never loads a model.

Every finding is generated from the numbers, and every unit, striking end, structural zero and metric
definition is read from the metric registry (`headscan.metrics.METRICS`), so none can drift from the code.
Every table of the registry (`headscan.tables.TABLES`) that a run holds appears: heads and offsets in their
own sections, any other as its top rows per model. A report holds no time of its own making: regenerating
it from the same runs gives the same bytes.
"""

from __future__ import annotations

import io
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from . import figures
from .document import (FOLDER_FILES, Bullets, Contents, Definition, Document, Figures, Heading, Note, Panels, Table,
                       Text, write_folder)
from .errors import ConfigError
from .findings import WIDE_CI, findings_by_model, striking_order, top_heads, top_rows, why_structural
from .intervals import THIN_MAX_SHARE, THIN_MIN_UNITS
from .metrics import METRICS
from .runs import Comparison, merge_runs, model_shapes, model_sources, run_names, run_summary
from .tables import TABLES, SweepTables, load

if TYPE_CHECKING:  # the report only reads what headscan.examples computed; it never imports the models
    from .examples import Examples

__all__ = ["write_report", "build_report", "check_report_options"]

ANNOTATE_TOP = 3  # heads annotated in each heatmap
OFFSET_TOP = 3  # heads drawn in each offset profile
DPI = 130
DISPLAY = 0.7  # on the page, a figure's PNG pixels are shown at this scale (about 91 CSS pixels per inch)
SECTIONED = ("heads", "offsets")  # tables with sections of their own; any other gets its top rows

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


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _codes(names: Sequence[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


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


def _fmt_value(metric: str, value: float, *interval: float) -> str:
    """`value` and its interval: three decimals for 0-1 metrics and values below 1 (0.002 nats is not 0.00),
    two above."""
    digits = 3 if figures.is_bounded(metric) or abs(value) < 1 else 2
    text = f"{value:.{digits}f}"
    return text + (f" [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]" if interval else "")


def _ranked(comparison: Comparison) -> list[str]:
    """The heads-table metrics that can be ranked: those the registry knows."""
    return [m for m in comparison.metrics if m in METRICS and METRICS[m].table == "heads"]


def _model_rows(comparison: Comparison, model: str, metric: str) -> pd.DataFrame:
    heads = comparison.heads
    return heads[(heads["model"] == model) & (heads["metric"] == metric)]


def _structural(comparison: Comparison, model: str, metric: str) -> str | None:
    m = comparison.model(model)
    return why_structural(_model_rows(comparison, model, metric), metric, family=m.family, provenance=m.provenance)


# --- sections ---------------------------------------------------------------------------------------------


def _header(comparison: Comparison, title: str) -> list:
    names = [m.name for m in comparison.models]
    runs = [name for name, _ in comparison.runs]
    metrics = comparison.metrics
    units = [f"`{m}` in {figures.unit(m)}" for m in metrics if not figures.is_bounded(m)]
    return [
        Heading(1, title),
        Text(f"{_plural(len(runs), 'run')} ({', '.join(runs)}), {_plural(len(names), 'model')} ({', '.join(names)}), "
             f"{len(metrics)} metrics per head." + (" A model in more than one run is named run:model."
                                                    if any(":" in n for n in names) else "")),
        Text("Heads are labelled L{layer}H{head}, both 0-indexed (the TransformerLens convention): Clark et al.'s "
             "(2019) 1-indexed BERT \u201chead 3-1\u201d is L2H0 here. Metrics that run from 0 to 1 share one colour "
             "scale throughout" + (f"; the others keep their units: {', '.join(units)}" if units else "") + "."),
        Contents(),
    ]


def _findings_section(comparison: Comparison) -> list:
    blocks = [Heading(2, "Findings"), Text("Generated from the tables; each sentence states a number in them.")]
    provenance = {m.name: m.provenance for m in comparison.models}
    for model, sentences in findings_by_model(comparison.heads, provenance=provenance).items():
        title = f"{model} ({comparison.model(model).family})" if model else "Across runs"
        blocks += [Heading(3, title), Bullets(sentences) if sentences else Text("Nothing stands out.")]
    return blocks


def _runs_section(comparison: Comparison) -> list:
    blocks = [Heading(2, "Runs"),
              Text("Where each table came from: the command, the corpus, the settings and the software versions.")]
    for name, run in comparison.runs:
        blocks.append(Heading(3, f"Run {name}"))
        summary = run_summary(run)
        if summary is None:
            blocks.append(Note(f"`{run.path}` has no provenance (no run.json, no parquet metadata)."))
            continue
        blocks.append(Table(summary))
        sources = model_sources(run)
        if len(sources):
            blocks.append(Table(sources, numeric=("segments", "tokens", "seconds")))
    return blocks


def _models_section(comparison: Comparison) -> list:
    numeric = ("layers", "heads", "kv heads", "width", "parameters", "vocabulary", "context")
    return [Heading(2, "Models"), Table(model_shapes(comparison), numeric=numeric)]


def _examples_section(examples: Examples | None, pngs: _Pngs) -> list:
    blocks: list = [Heading(2, "Looking both ways")]
    if examples is None:
        return blocks + [Note("The example attention was not drawn: this report was made without loading the "
                              "models (`headscan report --no-models`, or `write_report` without `examples`). "
                              "Everything else here needs only the tables.")]
    stop = "" if examples.text.rstrip()[-1:] in ".!?" else "."
    blocks.append(Text(f"{examples.choice}, on one example sentence: \u201c{examples.text}\u201d{stop} Rows are "
                       "queries, columns the keys they attend to; a causal model cannot see later tokens, so its "
                       "pattern is a triangle beside the bidirectional model's full square."))
    drawn = examples.drawn
    if drawn:
        size = max(len(example.tokens) for example in drawn)
        side = min(max(3.6, 0.26 * size + 1.6), 9.0)
        fig = Figure(figsize=(side * len(drawn) + 0.8, side + 0.4), layout="constrained")
        axes = fig.subplots(1, len(drawn), squeeze=False)[0]
        for i, example in enumerate(drawn):
            figures.attention_matrix(
                example.tokens, example.pattern, causal=example.family == "causal", ax=axes[i],
                cbar=i == len(drawn) - 1,
                title=f"{example.model} {example.label}: {example.metric} {example.value:.2f}\n({example.family})",
            )
        name = pngs.add("looking_both_ways.png", fig)
        blocks.append(Figures([name], "Looking both ways: " + "; ".join(
            f"{e.model} {e.label} ({e.metric} {e.value:.3f} over the corpus)" for e in drawn)
            + ". One shared 0-1 colour scale; blank cells are keys a causal model cannot see."))
    if examples.failed:
        total = len(drawn) + len(examples.failed)
        blocks.append(Note(f"The example attention could not be drawn for {len(examples.failed)} of {total} models; "
                           "everything else here needs only the tables. Why:"))
        blocks.append(Bullets(list(examples.failed)))
    return blocks


def _heatmap_size(n_layers: int, n_heads: int) -> tuple[float, float]:
    return (min(max(3.4, 0.36 * n_heads + 1.9), 12.0), min(max(2.2, 0.21 * n_layers + 1.1), 10.0))


def _heatmaps_section(comparison: Comparison, pngs: _Pngs) -> list:
    blocks: list = [
        Heading(2, "Heatmaps"),
        Text(f"One layer x head heatmap per metric and model: layers are rows (layer 0 at the top), heads columns. "
             f"The {ANNOTATE_TOP} most striking heads carry their value: the highest, or the lowest where the "
             "registry marks low as striking. Grey cells are undefined. Where a metric is 0 or undefined for every "
             "head of a model by construction, the report says why instead of drawing it."),
    ]
    for metric in comparison.metrics:
        rows = comparison.heads[comparison.heads["metric"] == metric]
        bounded = figures.is_bounded(metric)
        files, notes = [], []
        drawable = []
        for m in comparison.models:
            part = rows[rows["model"] == m.name]
            if part.empty:
                continue
            reason = _structural(comparison, m.name, metric)
            if reason is not None:
                notes.append(f"{m.name}: {reason}.")
            elif part["value"].isna().all():
                notes.append(f"{m.name}: undefined for every head; no query of the corpus counts for it.")
            else:
                drawable.append((m, part))
        # One scale per metric across models: 0-1 for bounded metrics, 0 to the largest value otherwise.
        finite = pd.concat([part["value"] for _, part in drawable]).dropna() if drawable else pd.Series(dtype=float)
        vmax = 1.0 if bounded else (float(finite.max()) if len(finite) and finite.max() > 0 else 1.0)
        for m, part in drawable:
            fig = Figure(figsize=_heatmap_size(int(part["layer"].max()) + 1, int(part["head"].max()) + 1),
                         layout="constrained")
            figures.head_heatmap(part, model=m.name, metric=metric, ax=fig.subplots(), vmin=0.0, vmax=vmax,
                                 annotate_top=ANNOTATE_TOP)
            files.append(pngs.add(f"heatmap_{metric}_{_slug(m.name)}.png", fig))
        blocks.append(Heading(3, metric))
        if files:
            scale = "0 to 1, one scale for every model" if bounded else f"0 to {vmax:.2f}"
            blocks.append(Figures(files, f"`{metric}` by layer and head; colour: {figures.unit(metric)}, {scale}; "
                                         f"annotated: the {ANNOTATE_TOP} {striking_order(metric)} heads."))
        if notes:
            blocks.append(Bullets(notes))
    return blocks


def _top_table(comparison: Comparison, metric: str, n: int) -> Table:
    top = top_heads(comparison.heads, metric=metric, n=n)
    columns: dict[str, list[str]] = {"rank": [str(i) for i in range(1, n + 1)]}
    notes = []
    for m in comparison.models:
        cells = []
        for row in top[top["model"] == m.name].itertuples():
            interval = (row.ci_low, row.ci_high) if pd.notna(row.ci_low) and pd.notna(row.ci_high) else ()
            cell = f"{row.label}  {_fmt_value(metric, row.value, *interval)}"
            cells.append(cell + (" †" if row.wide else "") + (" ‡" if row.thin else ""))
        if not cells:
            values = _model_rows(comparison, m.name, metric)["value"].dropna()
            same = "undefined" if values.empty else _fmt_value(metric, values.iloc[0])
            cells = [f"{same} for every head"]
            reason = _structural(comparison, m.name, metric)
            if reason is not None:
                notes.append(f"{m.name}: {reason}.")
        columns[m.name] = cells + [""] * (n - len(cells))
    frame = pd.DataFrame(columns)
    frame = frame[(frame.drop(columns="rank") != "").any(axis=1)]
    return Table(frame, numeric=("rank",), note=" ".join(notes))


def _top_section(comparison: Comparison, top: int) -> list:
    ranked = _ranked(comparison)
    low = [m for m in ranked if striking_order(m) == "lowest"]
    panels = [(f"Top {metric}" + (" (lowest first)" if metric in low else ""),
               _top_table(comparison, metric, top)) for metric in ranked]
    thin = any("‡" in cell for _, table in panels for cell in table.frame.to_numpy().ravel())
    order = "The highest values come first" + (
        f", except for {_codes(low)}, whose low end the registry marks as striking: their lowest heads come first"
        if low else "")
    return [
        Heading(2, "Top heads"),
        Text(f"The {top} most striking heads of each metric in each model: label, value and, where the sweep "
             f"bootstrapped it, the 95% interval over segments. {order}."),
        Panels(panels),
        Note(f"† marks a 95% interval wider than {WIDE_CI:g} (0-1 metrics) or than {WIDE_CI:.0%} of the value "
             "(unbounded metrics; of 1 for values below 1): read that value with care."
             + (f" ‡ marks a value resting on thin support: fewer than {THIN_MIN_UNITS} segments or documents "
                f"count for it, or one of them holds more than {THIN_MAX_SHARE:.0%} of its sum; its interval "
                "cannot be trusted, and no finding rests on it." if thin else "")),
    ]


def _offsets_section(comparison: Comparison, pngs: _Pngs) -> list:
    blocks: list = [
        Heading(2, "Offset profiles"),
        Text(f"Mean attention on the key at query + d, for d from -K to K, of the {OFFSET_TOP} most striking heads "
             "of each metric: a previous-token head peaks at -1, a next-token head at +1, a self head at 0."),
    ]
    if "offsets" not in comparison.frames:
        return blocks + [Note("The runs have no offsets table.")]
    offsets, heads = comparison.offsets, comparison.heads
    for m in comparison.models:
        part = offsets[offsets["model"] == m.name]
        if part.empty:
            blocks.append(Note(f"{m.name} has no offsets table rows."))
            continue
        shown = [(metric, top_heads(heads, metric=metric, n=OFFSET_TOP, model=m.name))
                 for metric in _ranked(comparison)]
        shown = [(metric, t) for metric, t in shown if not t.empty]
        if not shown:
            continue
        ncols = min(4, len(shown))
        nrows = math.ceil(len(shown) / ncols)
        fig = Figure(figsize=(3.0 * ncols, 2.5 * nrows + 0.3), layout="constrained")
        axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True).ravel()
        for ax, (metric, t) in zip(axes, shown):
            title = metric + (" (lowest)" if striking_order(metric) == "lowest" else "")
            figures.offset_profiles(part, model=m.name, heads=list(t["label"]), ax=ax, title=title)
            ax.label_outer()
        for ax in axes[len(shown):]:
            ax.set_visible(False)
        fig.suptitle(f"{m.name}: offset profiles of each metric's most striking heads")
        blocks.append(Figures([pngs.add(f"offsets_{_slug(m.name)}.png", fig)],
                              f"{m.name}: mean attention by relative offset; shading is the 95% interval."))
    return blocks


def _other_tables_section(comparison: Comparison, top: int) -> list:
    others = [name for name in comparison.frames if name not in SECTIONED]
    if not others:
        return []
    blocks: list = [Heading(2, "Other tables"),
                    Text(f"Tables this report has no section of its own for: the {top} most striking rows of each "
                         "model (and metric), in the metric's striking order.")]
    for name in others:
        table = TABLES[name]
        keys = [key for key in table.keys if key != "metric"]
        rows = top_rows(comparison[name], keys=list(table.keys), n=top)
        cells = pd.DataFrame({
            "model": rows["model"].astype(str),
            **({"metric": rows["metric"].astype(str)} if "metric" in table.keys else {}),
            "head": rows["label"].astype(str),
            **{key: rows[key].astype(str) for key in keys},
            "value": [f"{v:.3g}" for v in rows["value"]],
            "95% interval": ["" if pd.isna(lo) or pd.isna(hi) else f"[{lo:.3g}, {hi:.3g}]"
                             for lo, hi in zip(rows["ci_low"], rows["ci_high"])],
        })
        blocks += [Heading(3, f"{name} ({table.file})"), Text(f"{table.description.capitalize()}.")]
        blocks.append(Table(cells, numeric=("value",)) if len(cells) else Note(f"{name} has no defined rows."))
    return blocks


def _prev_next_section(comparison: Comparison, palette: dict, pngs: _Pngs) -> list:
    blocks: list = [Heading(2, "Previous against next token")]
    if not {"prev_token", "next_token"} <= set(comparison.metrics):
        return blocks + [Note("The tables have no prev_token and next_token metrics to compare.")]
    fig = Figure(figsize=(6.0, 5.6), layout="constrained")
    figures.prev_next_scatter(comparison.heads, ax=fig.subplots(), palette=palette, ci_threshold=WIDE_CI)
    return blocks + [Figures([pngs.add("prev_next_scatter.png", fig)],
                             "One point per head: its previous-token share against its next-token share. Causal "
                             "models' heads lie on the x axis (they cannot look ahead); error bars show 95% intervals "
                             f"wider than {WIDE_CI:g}.")]


def _entropy_section(comparison: Comparison, palette: dict, pngs: _Pngs) -> list:
    blocks: list = [Heading(2, "Entropy by layer")]
    if "entropy" not in comparison.metrics:
        return blocks + [Note("The tables have no entropy metric.")]
    n_layers = int(comparison.heads["layer"].max()) + 1
    fig = Figure(figsize=(6.4, min(max(3.2, 0.22 * n_layers + 1.6), 10.0)), layout="constrained")
    figures.entropy_by_layer(comparison.heads, ax=fig.subplots(), palette=palette)
    return blocks + [Figures([pngs.add("entropy_by_layer.png", fig)],
                             f"Attention entropy ({figures.unit('entropy')}) of every head, layer by layer; the line "
                             "is the mean over a layer's heads. Low entropy is focused attention.")]


def _definitions_section(comparison: Comparison) -> list:
    blocks: list = [Heading(2, "Metric definitions"),
                    Text("Read from the metric registry (headscan.metrics.METRICS) of the headscan that wrote this "
                         "report, so they match the code.")]
    shown = comparison.metrics + [name for name, entry in METRICS.items()
                                  if entry.table != "heads" and entry.table in comparison.frames]
    for name in shown:
        entry = METRICS.get(name)
        if entry is None:
            blocks.append(Definition(name, "not in this headscan's registry",
                                     "No definition: this metric is not registered in the installed headscan, so it "
                                     "is drawn but not ranked.", anchor=f"metric-{name}"))
            continue
        kind = entry.unit + (", 0 to 1" if entry.bounded else "") + f"; {entry.table} table"
        kind += "; low is striking" if not entry.ranks_high() else ""
        blocks.append(Definition(name, kind, entry.definition, anchor=f"metric-{name}"))
    return blocks


def build_report(comparison: Comparison, *, top: int = 10, examples: Examples | None = None,
                 title: str = "headscan report") -> Document:
    """Draw every figure and lay out the report's sections.

    Parameters
    ----------
    comparison : Comparison
        The runs side by side (`headscan.runs.merge_runs`).
    top : int, default 10
        How many heads to list per metric and model.
    examples : Examples, optional
        Example attention computed beforehand (`headscan.examples.compute_examples`); without it the report
        says the example was not drawn.
    title : str, default "headscan report"
        The page's title and first heading.

    Returns
    -------
    Document
        Its blocks and the PNG bytes of every figure (`headscan.document.to_html`, `to_markdown`).
    """
    check_report_options(top=top)
    palette = figures.model_palette([m.name for m in comparison.models])
    pngs = _Pngs()
    with matplotlib.rc_context(_RC):
        blocks = [
            *_header(comparison, title),
            *_findings_section(comparison),
            *_runs_section(comparison),
            *_models_section(comparison),
            *_examples_section(examples, pngs),
            *_heatmaps_section(comparison, pngs),
            *_top_section(comparison, top),
            *_offsets_section(comparison, pngs),
            *_other_tables_section(comparison, top),
            *_prev_next_section(comparison, palette, pngs),
            *_entropy_section(comparison, palette, pngs),
            *_definitions_section(comparison),
        ]
    return Document(title, blocks, dict(pngs))


# --- writing ----------------------------------------------------------------------------------------------


def check_report_options(*, top: int, out: str | os.PathLike | None = None) -> None:
    """Refuse a `top` below 1, and an `out` that is not a folder or holds anything but an earlier report.

    `write_report` calls it; call it first to fail before slow work, such as loading models for the examples.
    An earlier report in `out` is replaced; refusing anything else means ``out="."`` never deletes a project.
    """
    if top < 1:
        raise ConfigError(f"top must be at least 1, not {top}; pass how many heads to list per metric, e.g. 10",
                          setting="top")
    if out is None or not Path(out).exists():
        return
    out = Path(out)
    if not out.is_dir():
        raise ConfigError(f"out {out}: exists and is not a folder; choose another", setting="out")
    extra = sorted(p.name for p in out.iterdir() if p.name not in FOLDER_FILES)
    if extra:
        raise ConfigError(f"out {out}: exists and holds {extra[:5]}, which a headscan report would not; choose "
                          "another, or remove the folder", setting="out")


def write_report(
    runs: Sequence[str | os.PathLike | SweepTables],
    out: str | os.PathLike | None = None,
    *,
    top: int = 10,
    examples: Examples | None = None,
) -> Path:
    """Write a report over one or more sweep outputs; runs are compared side by side.

    Parameters
    ----------
    runs : sequence of paths or SweepTables
        Sweep output folders, or their tables as `headscan.tables.load` returns them.
    out : path, optional
        The report folder; ``reports/<name>`` by default, with name from the runs' folder names. An
        existing report there is replaced; any other existing folder is refused.
    top : int, default 10
        How many top heads to list per metric and model.
    examples : Examples, optional
        Example attention patterns, computed beforehand with the models by
        `headscan.examples.compute_examples` (as ``headscan report`` does unless ``--no-models``). Without
        them the report says so; everything else needs only the tables.

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
    runs = list(runs)
    if not runs:
        raise ConfigError("report needs at least one sweep output folder (the --out of `headscan sweep`)")
    check_report_options(top=top, out=out)
    loaded = [run if isinstance(run, SweepTables) else load(run) for run in runs]
    names = run_names([run.path or f"run{i + 1}" for i, run in enumerate(loaded)])
    out = Path(out) if out is not None else Path("reports") / _slug("+".join(names))
    check_report_options(top=top, out=out)
    document = build_report(merge_runs(loaded, names), top=top, examples=examples,
                            title=f"headscan report: {' vs '.join(names)}")
    write_folder(document, out, image_scale=DISPLAY)
    return out
