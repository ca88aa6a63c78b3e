"""The sections "Findings" (sentences generated from the tables, model by model and across models) and the
encoder-versus-decoder summary (each model's strongest previous- and next-token heads).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...analysis.across import family_findings, family_summary
from ...analysis.claims import no_controls_text, run_gate_text
from ...analysis.findings import findings_by_model
from ...analysis.ranking import fmt_score
from ...analysis.roles import role_for
from ...analysis.runs import Comparison
from ...analysis.shuffled import shuffled_sentences
from ...intervals import calibration
from ...intervals.verdicts import TOO_FEW
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
    if comparison.tested and (bare := no_controls_text(comparison.heads["model"].astype(str))):
        blocks.append(Text(bare))
    provenance = {m.name: m.provenance for m in comparison.models}
    by_model = findings_by_model(comparison.heads, provenance=provenance, controls=comparison.control_map(),
                                 weights=comparison.frames.get("weights"))
    across = family_findings(comparison.heads) + by_model.pop("", [])
    # position against content, where a model has its shuffled-words control (headscan.analysis.shuffled)
    for model, sentence in shuffled_sentences(comparison.heads, comparison.frames.get("syntax")).items():
        by_model.setdefault(model, []).append(sentence)
    for model, sentences in by_model.items():
        title = f"{model} ({comparison.model(model).family})"
        blocks += [Heading(3, title), Bullets(sentences) if sentences else Text("Nothing stands out.")]
    if across:
        blocks += [Heading(3, "Across models" if len(comparison.runs) == 1 else "Across models and runs"),
                   Bullets(across)]
    return blocks


FEW_UNITS = 100  # below this many units the calibration widens most families' intervals by more than a little


def _few_units(comparison: Comparison) -> list:
    """Where a run's intervals rest on fewer than `FEW_UNITS` units: how far the calibration widens each family's
    intervals at that size (`headscan.intervals.calibration`), or that the run is too small to assess at all."""
    units = comparison.heads["units"] if "units" in comparison.heads.columns else pd.Series(dtype=float)
    most = units.max() if len(units) else float("nan")
    if pd.isna(most) or most >= FEW_UNITS:
        return []
    table = calibration.calibration_table()
    smallest = calibration.smallest_size(table)
    if most < smallest:
        return [Text(f"This run is too small to assess: its rows rest on at most {int(most)} bootstrap units "
                     f"(segments or documents), fewer than the {smallest} at which any interval's coverage was "
                     "measured (experiments/interval_calibration.py), so no row is tested and none is a finding "
                     f"(\"{TOO_FEW}\"). Sweep at least {smallest} documents, or more segments.")]
    families = sorted(set(table["family"]))
    factor, _ = calibration.calibrate("heads", np.array(families, dtype=object), np.full(len(families), float(most)),
                                      table)
    order = np.argsort(-factor)
    widest = ", ".join(f"{families[i]} x{factor[i]:.2f}" for i in order[:4])
    return [Text(f"Read the intervals below with care: they rest on at most {int(most)} bootstrap units (segments or "
                 f"documents). At that size the default 95% intervals held the truth less often than 95% on real "
                 f"text, so every finding is tested on its interval widened by what its family needed "
                 f"(experiments/interval_calibration.py): the widest here are {widest}; a family never measured takes "
                 f"the widest. From {FEW_UNITS} units on, the factors are close to 1.")]


def _depth(value: float) -> str:
    return "–" if pd.isna(value) else f"{value:.2f}"


# what the summary's heads are, in a run whose tables record no verdicts: beyond chance, which is no null
_UNTESTED = "beyond chance; not tested: the tables record no null, and untrained heads leave uniform attention too"


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
                 f"claim (not thin, {'a finding beyond its null' if tested else _UNTESTED}), where it sits by relative "
                 "depth (layer / (layers - 1): 0 the first "
                 "layer, 1 the last), and how many of the model's heads hold the role ("
                 + "; ".join(f"{role_for(m).name}: {role_for(m).rule(tested)}" for m in metrics) + ")."),
            Table(frame, numeric=numeric, sortable=True, note=" ".join(notes))]


@register_section("findings", order=20)
def findings(context: Context) -> list:
    return [*findings_section(context.comparison), *summary_section(context.comparison)]
