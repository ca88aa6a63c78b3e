"""Reports over one or more sweep outputs: one HTML page, the same in Markdown, and every figure as a PNG.

`write_report` is the library behind ``headscan report``; `build_report` lays out the sections as a
`headscan.report.document.Document`: first the head atlas (`headscan.report.atlas`, interactive, in the HTML
only), then the findings, the encoder-versus-decoder summary and the figure sections
(`headscan.report.sections`, `headscan.report.table_sections`), the top heads and the provenance. The numbers
come from `headscan.analysis`, the drawings from `headscan.plots`, and the example attention from
`headscan.report.examples`, computed beforehand and handed in: this module never loads a model.

Every finding is generated from the numbers, and every unit, striking end, structural zero and metric
definition is read from the metric registry (`headscan.metrics.METRICS`), so none can drift from the code.
Every table of the registry (`headscan.tables.TABLES`) that a run holds appears: heads, offsets, syntax and
importance in their own sections (positions, value and weights too, where they hold enough to draw), any other
as its top rows per model. A report holds no time of its own making: regenerating it from the same runs gives the same
bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib
import numpy as np
import pandas as pd
import seaborn as sns

from ..analysis.claims import gate_text
from ..analysis.findings import family_findings, family_summary, findings_by_model
from ..analysis.formats import code
from ..analysis.roles import role_for
from ..analysis.ranking import WIDE_CI, fmt_bucket, fmt_score, striking_order, top_heads, top_rows
from ..analysis.runs import Comparison, merge_runs, model_shapes, model_sources, run_names, run_summary
from ..errors import ConfigError
from ..intervals import MIN_EFFECTIVE_UNITS, MIN_SPARSE_EVENNESS, MIN_VARIANCE_DF, THIN_MAX_SHARE, THIN_MIN_UNITS
from ..metrics import METRICS, describe
from ..plots.style import model_palette
from ..tables import TABLES, SweepTables, folders, load
from . import atlas, families, importance, sections, table_sections, whole_context
from . import series as training
from .document import Bullets, Contents, Definition, Document, Heading, Note, Panels, Raw, Table, Text, write_folder
from .inputs import check_report_options, check_runs, report_folder
from .sections import DISPLAY, Pngs, structural

if TYPE_CHECKING:  # the report only reads what headscan.report.examples computed; it never imports the models
    from .examples import Examples

__all__ = ["write_report", "build_report", "check_report_options", "check_runs"]

SECTIONED = ("heads", "offsets", "syntax", "importance", "retrieval", "retrieval_trials", "similarity")  # with sections of their own;
# any other table gets its top rows
# positions, value and weights rows get sections of their own where there is enough to draw
# (`headscan.report.table_sections.shown_elsewhere`); the rest of them are listed with the other tables.

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


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _codes(names: Sequence[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def _fmt_value(metric: str, value: float, like: float | None = None) -> str:
    return fmt_score(metric, value, like)


def _ranked(comparison: Comparison) -> list[str]:
    """The heads-table metrics that can be ranked: those the registry knows."""
    return [m for m in comparison.metrics if m in METRICS and METRICS[m].table == "heads"]


# --- sections ---------------------------------------------------------------------------------------------


def _header(comparison: Comparison, title: str) -> list:
    names = [m.name for m in comparison.models]
    runs = [name for name, _ in comparison.runs]
    metrics = comparison.metrics
    units = [f"`{m}` in {describe(m).unit}" for m in metrics if not describe(m).bounded]
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


def _atlas_section(comparison: Comparison, examples: Examples | None) -> list:
    return [
        Heading(2, "Head atlas"),
        Text("Every head of every model, one grid per model: layers are rows (layer 0 at the top), heads columns, "
             "each grid as tall as the others, so models of different depth line up by relative depth (0 is the "
             "first layer, 1 the last). Choose what colours the grid; hover a head for its value and 95% interval; "
             "click it for all its scores, ranks, offset profile and attention on the example sentence. A "
             "checkpoint series is one grid with a slider over its training steps (the last first). Where the runs "
             "have a similarity table, a head map under each grid places the heads by how alike they attend (as in "
             "Head families; a point opens its head), and the grid can be coloured by head family (cluster)."),
        Raw(atlas.atlas_html(comparison, examples),
            markdown="The interactive head atlas is in `index.html` beside this file; its role rules follow."),
        Text("Roles, from the numbers, by the rules findings use too: a role needs its metric at the role's "
             "threshold and the value beyond chance (its 95% interval's low end above uniform attention's value, "
             "support not thin); colouring by role shows a head's first role in this order. The atlas can also be "
             "coloured by lift over chance: value \u2212 chance, or value / chance for shares."),
        Bullets(atlas.role_rules()),
        Text(gate_text()),
    ]


def _findings_section(comparison: Comparison) -> list:
    blocks = [Heading(2, "Findings"),
              Text("Generated from the tables; each sentence states a number in them, with its 95% interval and its "
                   "chance level (uniform attention over the keys each query sees, on the same queries). " + gate_text()
                   + " Where a model has a control (an untrained copy, or the corpus with its words shuffled), each "
                   "sentence about a head says whether the control shows it too.")]
    provenance = {m.name: m.provenance for m in comparison.models}
    by_model = findings_by_model(comparison.heads, provenance=provenance, controls=comparison.control_map(),
                                 weights=comparison.frames.get("weights"))
    across = family_findings(comparison.heads) + by_model.pop("", [])
    for model, sentences in by_model.items():
        title = f"{model} ({comparison.model(model).family})"
        blocks += [Heading(3, title), Bullets(sentences) if sentences else Text("Nothing stands out.")]
    if across:
        blocks += [Heading(3, "Across models" if len(comparison.runs) == 1 else "Across models and runs"),
                   Bullets(across)]
    return blocks


def _depth(value: float) -> str:
    return "–" if pd.isna(value) else f"{value:.2f}"


def _summary_section(comparison: Comparison) -> list:
    """The encoder-versus-decoder table: each model's strongest previous- and next-token heads."""
    metrics = tuple(m for m in ("prev_token", "next_token") if m in comparison.metrics)
    if not metrics:
        return []
    summary = family_summary(comparison.heads, metrics=metrics)
    names = {"prev_token": "previous-token", "next_token": "next-token"}
    frame = pd.DataFrame({"model": summary["model"], "family": summary["family"],
                          "layers": summary["layers"].astype(str), "heads": summary["heads"].astype(str)})
    notes = []
    for metric in metrics:
        structural_zero = {row.model: structural(comparison, row.model, metric) for row in summary.itertuples()}
        frame[f"strongest {names[metric]} head"] = summary[f"{metric}_head"].replace("", "–")
        frame[metric] = summary[metric].map(lambda v: _fmt_value(metric, v))
        frame[f"{metric} depth"] = summary[f"{metric}_depth"].map(_depth)
        frame[f"{names[metric]} heads"] = [
            "–" if pd.isna(v) or structural_zero[model] else str(int(v))
            for model, v in zip(summary["model"], summary[f"{metric}_above"])]
        notes += [f"{model}'s `{metric}`: {reason}." for model, reason in structural_zero.items() if reason]
    numeric = tuple(c for c in frame.columns if c not in ("model", "family") and not c.startswith("strongest"))
    title = ("Encoder versus decoder" if {"causal", "bidirectional"} <= set(summary["family"])
             else "Strongest heads by model")
    return [Heading(2, title),
            Text("Each model's strongest previous-token and next-token head among those whose value may carry a "
                 "claim (not thin, beyond chance), where it sits by relative depth (layer / (layers - 1): 0 the first "
                 "layer, 1 the last), and how many of the model's heads hold the role ("
                 + "; ".join(f"{role_for(m).name}: {role_for(m).rule()}" for m in metrics) + ")."),
            Table(frame, numeric=numeric, sortable=True, note=" ".join(notes))]


def _runs_section(comparison: Comparison) -> list:
    blocks = [Heading(2, "Runs"),
              Text("Where each table came from: the command, the corpus, the settings and the software versions.")]
    for name, run in comparison.runs:
        blocks.append(Heading(3, f"Run {name}"))
        summary = run_summary(run)
        if summary is None:
            blocks.append(Note(f"{code(run.path)} has no provenance (no run.json, no parquet metadata)."))
            continue
        blocks.append(Table(summary))
        sources = model_sources(run)
        if len(sources):
            blocks.append(Table(sources, numeric=("segments", "tokens", "seconds")))
    return blocks


def _models_section(comparison: Comparison) -> list:
    numeric = ("layers", "heads", "kv heads", "width", "parameters", "vocabulary", "context")
    return [Heading(2, "Models"), Table(model_shapes(comparison), numeric=numeric)]


def _top_table(comparison: Comparison, metric: str, n: int) -> Table:
    """One metric's top heads, model by model: value, interval ends and chance in columns of their own, so they
    sort; why a head carries no claim ("at chance", "thin support"); each control's value for the same head."""
    top = top_heads(comparison.heads, metric=metric, n=n)
    controls = comparison.control_map()
    kinds = {c: _control_kind(comparison, c) for names in controls.values() for c in names}
    heads = comparison.heads[comparison.heads["metric"] == metric].set_index(["model", "layer", "head"])
    rows, notes = [], []
    for m in comparison.models:
        part = top[top["model"] == m.name]
        for row in part.itertuples():
            cells = {"model": m.name, "rank": str(row.rank), "head": row.label,
                     "value": _fmt_value(metric, row.value), "95% low": _fmt_value(metric, row.ci_low, row.value),
                     "95% high": _fmt_value(metric, row.ci_high, row.value),
                     "chance": _fmt_value(metric, row.chance, row.value),
                     "no claim": row.unsupported, "mark": ("†" if row.wide else "") + ("‡" if row.thin else "")}
            for control in controls.get(m.name, []):
                value = heads["value"].get((control, row.layer, row.head), float("nan"))
                cells[kinds[control]] = _fmt_value(metric, value, row.value)
            rows.append(cells)
        if part.empty and (comparison.heads["model"] == m.name).any():
            values = _model_rows(comparison, m.name, metric)["value"].dropna()
            same = "undefined" if values.empty else _fmt_value(metric, values.iloc[0])
            reason = structural(comparison, m.name, metric)
            notes.append(f"{m.name}: {same} for every head" + (f"; {reason}." if reason else "."))
    columns = ["model", "rank", "head", "value", "95% low", "95% high", "chance", *dict.fromkeys(kinds.values()),
               "no claim", "mark"]
    frame = pd.DataFrame(rows, columns=columns).fillna("")
    if len(comparison.models) == 1:
        frame = frame.drop(columns="model")
    if not frame["mark"].astype(bool).any():
        frame = frame.drop(columns="mark")
    if not frame["no claim"].astype(bool).any():
        frame = frame.drop(columns="no claim")
    numeric = ("rank", "value", "95% low", "95% high", "chance", *dict.fromkeys(kinds.values()))
    return Table(frame, numeric=numeric, note=" ".join(notes), sortable=True)


def _control_kind(comparison: Comparison, name: str) -> str:
    """A control's column heading: what kind of control it is ("random init", "shuffled words")."""
    kind = comparison.model(name).provenance.control or "control"
    return kind.replace("-", " ")


def _model_rows(comparison: Comparison, model: str, metric: str) -> pd.DataFrame:
    heads = comparison.heads
    return heads[(heads["model"] == model) & (heads["metric"] == metric)]


def _top_section(comparison: Comparison, top: int) -> list:
    ranked = _ranked(comparison)
    low = [m for m in ranked if striking_order(m) == "lowest"]
    panels = [(f"Top {metric}" + (" (lowest first)" if metric in low else ""),
               _top_table(comparison, metric, top)) for metric in ranked]
    thin = any("‡" in str(cell) for _, table in panels for cell in table.frame.to_numpy().ravel())
    order = "The highest values come first" + (
        f", except for {_codes(low)}, whose low end the registry marks as striking: their lowest heads come first"
        if low else "")
    return [
        Heading(2, "Top heads"),
        Text(f"The {top} most striking heads of each metric in each model: label, value and, where the sweep "
             f"bootstrapped it, the ends of the 95% interval, and chance, the value of uniform attention over the "
             f"keys each query sees on the same queries. {order}. A head listed here is not a finding unless its "
             "value may carry a claim: \u201cno claim\u201d says why not (at chance: its interval holds chance; "
             "thin support). Where a model has a control, its value for the same head stands beside it. Click a "
             "column's heading to sort by it."),
        Panels(panels),
        Note(f"† marks a 95% interval wider than {WIDE_CI:g} (0-1 metrics) or than {WIDE_CI:.0%} of the value "
             "(unbounded metrics; of 1 for values below 1): read that value with care."
             + (f" ‡ marks a value resting on thin support: its sum rests on fewer than {MIN_EFFECTIVE_UNITS:g} "
                f"effective segments or documents, its interval's SE on fewer than {MIN_VARIANCE_DF:g} degrees of "
                f"freedom, or (induction, duplicate_token) its sum is spread less evenly than "
                f"{MIN_SPARSE_EVENNESS:.0%} of its units; in tables written before headscan recorded that, fewer "
                f"than {THIN_MIN_UNITS} units count for it or one holds more than {THIN_MAX_SHARE:.0%} of its sum. "
                "Its interval cannot be trusted, and no finding rests on it." if thin else "")),
    ]


def _other_tables_section(comparison: Comparison, top: int) -> list:
    shown = table_sections.shown_elsewhere(comparison)  # rows drawn in "Attention along the context", "What heads move"
    frames = {name: frame[~frame["metric"].isin(shown.get(name, set()))] if "metric" in frame else frame
              for name, frame in comparison.frames.items() if name not in SECTIONED}
    others = [name for name, frame in frames.items() if name not in shown or len(frame)]
    if not others:
        return []
    blocks: list = [Heading(2, "Other tables"),
                    Text(f"Tables this report has no section of its own for: the {top} most striking rows of each "
                         "model (and metric), in the metric's striking order.")]
    for name in others:
        table = TABLES[name]
        keys = [key for key in table.keys if key != "metric"]
        rows = top_rows(frames[name], keys=list(table.keys), n=top)
        cells = pd.DataFrame({
            "model": rows["model"].astype(str),
            **({"metric": rows["metric"].astype(str)} if "metric" in table.keys else {}),
            "head": rows["label"].astype(str),
            **{("positions" if key == "bucket" else key): rows[key].map(fmt_bucket) if key == "bucket"
               else rows[key].astype(str) for key in keys},
            **{extra: rows[extra].astype(str) for extra, dtype in table.extra.items() if dtype == "string"},
            "value": [f"{v:.3g}" for v in rows["value"]],
            "95% interval": ["" if pd.isna(lo) or pd.isna(hi) else f"[{lo:.3g}, {hi:.3g}]"
                             for lo, hi in zip(rows["ci_low"], rows["ci_high"])],
            "chance": ["" if pd.isna(c) else f"{c:.3g}" for c in rows.get("chance", pd.Series(np.nan, index=rows.index))],
        })
        if len(rows) and rows["count"].isna().all():  # scores read off the weights: no corpus, no interval
            cells = cells.drop(columns="95% interval")
        description = table.description[:1].upper() + table.description[1:]  # not capitalize(): it lowercases NaN
        blocks += [Heading(3, f"{name} ({table.file})"), Text(f"{description}.")]
        blocks.append(Table(cells, numeric=("value",)) if len(cells) else Note(f"{name} has no defined rows."))
    return blocks


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
        body = f"{entry.definition}\n\nChance: {entry.chance_definition}"
        blocks.append(Definition(name, kind, body, anchor=f"metric-{name}"))
    return blocks


def build_report(comparison: Comparison, *, top: int = 10, examples: Examples | None = None,
                 title: str = "headscan report", progress: Callable[[str], None] | None = None) -> Document:
    """Draw every figure and lay out the report's sections.

    Parameters
    ----------
    comparison : Comparison
        The runs side by side (`headscan.analysis.runs.merge_runs`).
    top : int, default 10
        How many heads to list per metric and model.
    examples : Examples, optional
        Example attention computed beforehand (`headscan.report.examples.compute_examples`); without it the report
        says the example was not drawn.
    title : str, default "headscan report"
        The page's title and first heading.
    progress : callable, optional
        Called with one line as each part of the report is drawn.

    Returns
    -------
    Document
        Its blocks and the PNG bytes of every figure (`headscan.report.document.to_html`, `to_markdown`).
    """
    check_report_options(top=top)
    say = progress or (lambda line: None)
    palette = model_palette([m.name for m in comparison.models])
    pngs = Pngs()
    steps = [
        ("the atlas", lambda: [*_header(comparison, title), *_atlas_section(comparison, examples)]),
        ("findings", lambda: [*_findings_section(comparison), *_summary_section(comparison)]),
        ("example attention", lambda: [*sections.examples_section(examples, pngs),
                                       *sections.induction_section(comparison, examples, pngs)]),
        ("differences between runs", lambda: sections.differences_section(comparison, pngs)),
        ("heatmaps", lambda: sections.heatmaps_section(comparison, pngs)),
        ("top heads", lambda: [*_top_section(comparison, top), *_other_tables_section(comparison, top)]),
        ("offset profiles", lambda: sections.offsets_section(comparison, pngs)),
        ("scatter and entropy", lambda: [*sections.prev_next_section(comparison, palette, pngs),
                                         *sections.entropy_section(comparison, palette, pngs)]),
        ("provenance", lambda: [*_runs_section(comparison), *_models_section(comparison),
                                *_definitions_section(comparison)]),
    ]
    if "syntax" in comparison.frames:
        steps.insert(-1, ("syntactic heads", lambda: table_sections.syntax_section(comparison, palette, pngs)))
    if "positions" in comparison.frames:
        steps.insert(-1, ("attention along the context", lambda: table_sections.context_section(comparison, pngs)))
    if whole_context.shown(comparison):
        steps.insert(-1, ("which heads need the whole context",
                          lambda: whole_context.whole_context_section(comparison, palette, pngs)))
    if {"value", "weights"} & set(comparison.frames) or "dla" in comparison.metrics:
        steps.insert(-1, ("what heads move", lambda: table_sections.movement_section(comparison, palette, pngs)))
    if "importance" in comparison.frames:
        steps.insert(-1, ("does the head matter", lambda: importance.importance_section(comparison, pngs)))
    if families.shown(comparison):
        steps.insert(-1, ("head families", lambda: families.families_section(comparison, pngs)))
    if training.shown(comparison):
        steps.insert(-1, ("heads over training", lambda: training.series_section(comparison, pngs)))
    blocks = []
    with matplotlib.rc_context(_RC):
        for what, make in steps:
            say(f"report: {what}")
            blocks += make()
    return Document(title, blocks, dict(pngs), verbatim=_verbatim(comparison, examples))


def _verbatim(comparison: Comparison, examples: Examples | None) -> tuple[str, ...]:
    """What the user named, which the report shows as it is wherever it appears (`Document.verbatim`): model
    names, ids and the folders they came from, run names and folders, corpora, the example sentence."""
    names = [examples.text if examples else None]
    for m in comparison.models:
        names += [m.name, m.run, m.model, m.provenance.name, m.provenance.id]
    for name, run in comparison.runs:
        names += [name, run.path, run.provenance.corpus.source]
    return tuple(sorted({str(n) for n in names if n}))


# --- writing ----------------------------------------------------------------------------------------------


def write_report(
    runs: Sequence[str | os.PathLike | SweepTables],
    out: str | os.PathLike | None = None,
    *,
    top: int = 10,
    examples: Examples | None = None,
    progress: Callable[[str], None] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a report over one or more sweep outputs; runs are compared side by side.

    Parameters
    ----------
    runs : sequence of paths or SweepTables
        Sweep output folders, or their tables as `headscan.tables.load` returns them.
    out : path, optional
        The report folder; by default ``NAME-report`` beside the first run's folder (NAME from the runs' folder
        names), or in the current folder for tables that were never written.
    overwrite : bool, default False
        Replace a report already in `out` (never a folder that holds anything else).
    top : int, default 10
        How many top heads to list per metric and model.
    examples : Examples, optional
        Example attention patterns, computed beforehand with the models by
        `headscan.report.examples.compute_examples` (as ``headscan report`` does unless ``--no-models``). Without
        them the report says so; everything else needs only the tables.
    progress : callable, optional
        Called with one line as each part of the report is drawn and when it is written.

    Returns
    -------
    Path
        The report folder: ``index.html`` (self-contained), ``report.md`` and ``figures/*.png``.

    Raises
    ------
    TablesError
        A run folder is missing or incomplete.
    ConfigError
        No runs, a run given twice (`check_runs`), `top` below 1, or `out` exists and is not a report (or is one,
        without `overwrite`).
    """
    runs = list(runs)
    if not runs:
        raise ConfigError("report needs at least one sweep output folder (the --out of `headscan sweep`)")
    check_report_options(top=top, out=out, overwrite=overwrite)
    check_runs(runs)
    loaded = [run if isinstance(run, SweepTables) else load(run) for run in runs]
    check_runs(loaded)
    names = run_names([run.path or f"run{i + 1}" for i, run in enumerate(loaded)])
    out = report_folder(loaded, out)
    with folders.lock(out):
        check_report_options(top=top, out=out, overwrite=overwrite)
        document = build_report(merge_runs(loaded, names), top=top, examples=examples,
                                title=f"headscan report: {' vs '.join(names)}", progress=progress)
        if progress is not None:
            progress(f"report: writing {out}")
        write_folder(document, out, image_scale=DISPLAY)
    return out
