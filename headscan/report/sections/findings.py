"""The sections "Findings" (sentences generated from the tables, model by model and across models) and the
encoder-versus-decoder summary (each model's strongest previous- and next-token heads).
"""

from __future__ import annotations

import pandas as pd

from ...analysis.across import family_findings, family_summary
from ...analysis.claims import run_gate_text
from ...analysis.findings import findings_by_model
from ...analysis.ranking import fmt_score
from ...analysis.roles import role_for
from ...analysis.runs import Comparison
from ..document import Bullets, Heading, Table, Text
from ..figures import structural
from . import Context, register_section

__all__ = ["findings_section", "summary_section"]


def findings_section(comparison: Comparison) -> list:
    blocks = [Heading(2, "Findings"),
              Text("Generated from the tables; each sentence states a number in them, with its 95% interval, its "
                   "chance level (uniform attention over the keys each query sees, on the same queries) and, where "
                   "the sweep tested it, its null and q-value. " + run_gate_text(comparison.runs)
                   + " Where a model has a control (an untrained copy, or the corpus with its words shuffled), each "
                   "sentence about a head says whether the control shows it too.")]
    blocks += _few_units(comparison)
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


# Measured by experiments/interval_coverage.py (minilm, EWT test, parts of whole documents; docs/intervals.md):
# the default interval on the rows the thin rule trusts, overall and the weakest metric family.
FEW_UNITS = 100
_MEASURED = ("on parts of 30 documents the default intervals of the rows the thin rule trusts covered 0.95 overall "
             "but 0.91 to 0.93 for distance, prev_token, self, positional_prev and sep; on parts of 10, 0.87 overall "
             "and 0.25 for distance; from 100 documents on, at least 0.95 for every family")


def _few_units(comparison: Comparison) -> list:
    """A warning where a run's intervals rest on fewer than `FEW_UNITS` units: below that, measured coverage falls
    short of 95% for some metrics, so the intervals quoted here are approximate."""
    units = comparison.heads["units"] if "units" in comparison.heads.columns else pd.Series(dtype=float)
    most = units.max() if len(units) else float("nan")
    if pd.isna(most) or most >= FEW_UNITS:
        return []
    return [Text(f"Read the intervals below as approximate: they rest on at most {int(most)} bootstrap units "
                 f"(segments or documents), and {_MEASURED} (experiments/interval_coverage.py).")]


def _depth(value: float) -> str:
    return "–" if pd.isna(value) else f"{value:.2f}"


def summary_section(comparison: Comparison) -> list:
    """The encoder-versus-decoder table: each model's strongest previous- and next-token heads."""
    metrics = tuple(m for m in ("prev_token", "next_token") if m in comparison.metrics)
    if not metrics:
        return []
    summary = family_summary(comparison.heads, metrics=metrics)
    tested = comparison.tested
    names = {"prev_token": "previous-token", "next_token": "next-token"}
    frame = pd.DataFrame({"model": summary["model"], "family": summary["family"],
                          "layers": summary["layers"].astype(str), "heads": summary["heads"].astype(str)})
    notes = []
    for metric in metrics:
        structural_zero = {row.model: structural(comparison, row.model, metric) for row in summary.itertuples()}
        frame[f"strongest {names[metric]} head"] = summary[f"{metric}_head"].replace("", "–")
        frame[metric] = summary[metric].map(lambda v, metric=metric: fmt_score(metric, v))
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
                 f"claim (not thin, {'a finding beyond its null' if tested else 'beyond chance'}), where it sits by relative depth (layer / (layers - 1): 0 the first "
                 "layer, 1 the last), and how many of the model's heads hold the role ("
                 + "; ".join(f"{role_for(m).name}: {role_for(m).rule(tested)}" for m in metrics) + ")."),
            Table(frame, numeric=numeric, sortable=True, note=" ".join(notes))]


@register_section("findings", order=20)
def findings(context: Context) -> list:
    return [*findings_section(context.comparison), *summary_section(context.comparison)]
