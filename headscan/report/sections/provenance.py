"""The report's last sections: the runs (command, corpus, settings, versions), the models' shapes and every metric's
definition, read from the metric registry so that they match the code.
"""

from __future__ import annotations

from ...analysis.formats import code
from ...analysis.runs import Comparison, model_shapes, model_sources, run_summary
from ...metrics import METRICS
from ..document import Definition, Heading, Note, Table, Text
from . import LAST, Context, register_section

__all__ = ["runs_section", "models_section", "definitions_section"]


def runs_section(comparison: Comparison) -> list:
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


def models_section(comparison: Comparison) -> list:
    numeric = ("layers", "heads", "kv heads", "width", "parameters", "vocabulary", "context")
    return [Heading(2, "Models"), Table(model_shapes(comparison), numeric=numeric)]


def definitions_section(comparison: Comparison) -> list:
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


@register_section("provenance", order=LAST)
def provenance(context: Context) -> list:
    return [*runs_section(context.comparison), *models_section(context.comparison),
            *definitions_section(context.comparison)]
