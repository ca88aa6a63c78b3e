"""Reports over one or more sweep outputs: one HTML page, the same in Markdown, and every figure as a PNG.

`write_report` is the library behind ``headscan report`` (and ``headscan.report(runs, out=...)``); `build_report`
lays out the report as a `headscan.report.document.Document`: it builds every registered section
(`headscan.report.sections`) that the runs have, in the sections' order: first the head atlas
(`headscan.report.atlas`, interactive, in the HTML only), then the findings, the figure sections, the top heads and
the provenance. The numbers come from `headscan.analysis`, the drawings from `headscan.plots`, and the example
attention from `headscan.report.examples`, computed beforehand and handed in: this module never loads a model.

Every finding is generated from the numbers, and every unit, striking end, structural zero and metric
definition is read from the metric registry (`headscan.metrics.METRICS`), so none can drift from the code.
Every table of the registry (`headscan.tables.TABLES`) that a run holds appears: heads, offsets, syntax and
importance in their own sections (positions, value and weights too, where they hold enough to draw), any other
as its top rows per model. A report holds no time of its own making: regenerating it from the same runs gives the
same bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib
import seaborn as sns

from ..analysis.runs import Comparison, compare_runs, run_names
from ..errors import ConfigError
from ..plots.style import model_palette
from ..tables import SweepTables, folders, load
from .document import Document, write_folder
from .figures import DISPLAY, Pngs
from .inputs import check_report_options, check_runs, report_folder
from .sections import Context, shown_sections

# The built-in sections register themselves when imported; their order is each one's own.
from .sections import (  # noqa: F401  isort: skip
    head_atlas, findings, example_attention, differences, heatmaps, top_heads, offsets, scatter, syntax, context,
    whole_context, movement, importance, families, training, provenance, composition, patching,
)

if TYPE_CHECKING:  # the report only reads what headscan.report.examples computed; it never imports the models
    from .examples import Examples

__all__ = ["write_report", "build_report"]

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


def build_report(comparison: Comparison, *, top: int = 10, examples: Examples | None = None,
                 title: str = "headscan report", progress: Callable[[str], None] | None = None) -> Document:
    """Build every registered section the runs have (`headscan.report.sections`), in order: draw every figure
    and lay out the report.

    Parameters
    ----------
    comparison : Comparison
        The runs side by side (`headscan.analysis.runs.compare_runs`).
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
    shared = Context(comparison, Pngs(), palette=model_palette([m.name for m in comparison.models]), top=top,
                     examples=examples, title=title)
    blocks = []
    with matplotlib.rc_context(_RC):
        for section in shown_sections(comparison):
            say(f"report: {section.name}")
            blocks += section.build(shared)
    return Document(title, blocks, dict(shared.pngs), verbatim=_verbatim(comparison, examples))


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
    models: bool = False,
    example: str | None = None,
    progress: Callable[[str], None] | None = None,
    failed: Callable[[str], None] | None = None,
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
        `headscan.report.examples.compute_examples`. Without them (and without `models`) the report says so;
        everything else needs only the tables.
    models : bool, default False
        Load each model of the runs once, on the CPU, and compute every head's attention on `example` (default:
        a short English sentence) after the runs and options are checked, under the report folder's lock (as
        ``headscan report`` does unless ``--no-models``); a model that cannot be loaded is left out, named
        through `failed`.
    progress : callable, optional
        Called with one line as each part of the report is drawn and when it is written.
    failed : callable, optional
        Called with one line per model whose example attention could not be computed (``models``).

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
    if models:
        from .examples import check_example
        example = check_example(example)
    check_runs(runs)
    loaded = [run if isinstance(run, SweepTables) else load(run) for run in runs]
    if progress is not None:
        progress(f"read {len(runs)} run{'s' if len(runs) > 1 else ''}")
    check_runs(loaded)
    names = run_names([run.path or f"run{i + 1}" for i, run in enumerate(loaded)])
    out = report_folder(loaded, out)
    with folders.lock(out):  # held from here, so that a second writer is refused before the models load
        check_report_options(top=top, out=out, overwrite=overwrite)
        if models and examples is None:
            from .examples import compute_examples

            examples = compute_examples(loaded, example, progress=progress)
            for line in examples.failed if failed is not None else ():
                failed(f"no example attention for {line}")
        document = build_report(compare_runs(loaded, names), top=top, examples=examples,
                                title=f"headscan report: {' vs '.join(names)}", progress=progress)
        if progress is not None:  # the models are loaded and the examples computed: what is left is writing
            progress(f"report: writing {out}")
        write_folder(document, out, image_scale=DISPLAY)
    return out
