"""The report's last sections: the runs (command, corpus, settings, versions), the models' shapes and every metric's
definition, read from the metric registry so that they match the code.
"""

from __future__ import annotations

from ...analysis.formats import code
from ...analysis.runs import Comparison, model_shapes, model_sources, run_summary
from ...metrics import METRICS
from ...metrics.null_policy import VALUE_NOTE, null_policy
from ..document import Definition, Heading, Note, Table, Text
from . import LAST, Context, register_section

__all__ = ["runs_section", "models_section", "definitions_section", "nulls_part"]


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
    recorded = {name: origin for _, tables in comparison.runs
                for name, origin in tables.provenance.extra.get("custom_metrics", {}).items()}
    for name in shown:
        entry = METRICS.get(name)
        if entry is None and name in recorded:  # a user's metric, defined in a module this process did not load
            origin = recorded[name]
            where = origin.get("module") or "Python"
            blocks.append(Definition(name, f"your own metric, from {where} (sha256 {str(origin.get('sha256'))[:12]})",
                                     f"{origin.get('definition', '')}\n\nChance: {origin.get('chance', '')}",
                                     anchor=f"metric-{name}"))
            continue
        if entry is None:
            blocks.append(Definition(name, "not in this headscan's registry",
                                     "No definition: this metric is not registered in the installed headscan, so it "
                                     "is drawn but not ranked.", anchor=f"metric-{name}"))
            continue
        kind = entry.unit + (", 0 to 1" if entry.bounded else "") + f"; {entry.table} table"
        kind += "; low is striking" if not entry.ranks_high() else ""
        kind += f"; your own, from {entry.origin.get('module') or 'Python'}" if entry.origin else ""
        body = f"{entry.definition}\n\nChance: {entry.chance_definition}"
        blocks.append(Definition(name, kind, body, anchor=f"metric-{name}"))
    return blocks + nulls_part([name for name in shown if name in METRICS])


def nulls_part(metrics: list[str]) -> list:
    """Which control is each shown metric's null, and why (`headscan.metrics.null_policy`, from the registry)."""
    if not metrics:
        return []
    return [Heading(3, "Each metric's null"),
            Text("What each metric's rows are tested against, in a run with random-init controls and in one without; "
                 "what its score on the shuffled-words control says; and why. Read from the metric registry "
                 "(headscan.metrics.null_policy), so it matches the code."),
            Table(null_policy(metrics), note=VALUE_NOTE)]


@register_section("provenance", order=LAST)
def provenance(context: Context) -> list:
    return [*runs_section(context.comparison), *models_section(context.comparison),
            *definitions_section(context.comparison)]
