"""Which control is each metric's null, and why: one table from the metric registry, for the docs and the report.

Per registered metric: its table; what its rows are tested against in a run with random-init controls and in one
without (`headscan.metrics.nulls` tests the rows of ``heads``, ``value`` and ``syntax``; the other tables' rows
are described, or held against a yardstick that is not a null); what its score on the shuffled-words control
says (`Metric.shuffled`: position against content); and why, from the registry's ``null_why``.

This module tests nothing and runs no model: it reads the registry.
"""

from __future__ import annotations

import pandas as pd

from .nulls import FINDING_TABLES as TESTED  # the tables whose rows the sweep tests
from .registry import METRICS, SHUFFLED, Metric

__all__ = ["NULL_POLICY_COLUMNS", "null_policy", "null_policy_markdown"]

NULL_POLICY_COLUMNS = ("metric", "table", "with random-init controls", "without them", "shuffled words", "why")
# What the rows of a table the sweep does not test are held against, and why no null is needed or none exists
UNTESTED = {
    "offsets": ("none: described beside uniform chance, not tested",
                "the offset profile describes where heads look; the claims about positions are made on heads.parquet "
                "(prev_token, self, next_token), which are tested"),
    "positions": ("none: described beside uniform chance, and beside the random-init controls' heads of the same "
                  "layer where the run holds them; not tested",
                  "a profile along the context, one row per bucket: the report describes it and makes no finding"),
    "retrieval": ("none: Wu et al.'s threshold (0.1), a definition, not a null; `headscan retrieval` sweeps no "
                  "control",
                  "a retrieval head is a head above Wu et al.'s threshold; no untrained model is decoded, so the "
                  "report says the count describes and is not tested"),
    "importance": ("0, the change made by a head that changes nothing (an ablation's own null), on the calibrated "
                   "interval",
                   "no attention pattern enters importance: there is no null head, and the question is whether "
                   "removing the head changes the target at all"),
}
VALUE_NOTE = ("value.parquet's rows other than `moved` are heads.parquet's metrics on value-weighted attention: each "
              "takes its metric's null, in a false-discovery family of its own.")
_SHUFFLED_SAID = {"position": "kept: follows position; lost: follows the words",
                  "content": "kept: follows the words; lost: needs the word order"}


def _with_controls(metric: Metric) -> str:
    if metric.table not in TESTED:
        return UNTESTED.get(metric.table, ("none: not tested", ""))[0]
    said = "random-init controls' heads of the same layer"
    if metric.null == "uniform":
        said += ", and uniform chance"
    if metric.table == "syntax":
        said += ", and the best fixed offset on the same words"
    return said


def _without(metric: Metric) -> str:
    if metric.table not in TESTED:
        return UNTESTED.get(metric.table, ("none: not tested", ""))[0]
    if metric.table == "syntax":
        return "the best fixed offset on the same words"
    if metric.null == "uniform":
        return "uniform chance: \"beyond uniform attention only\", never a finding (untrained heads leave it too)"
    return "none: not tested"


def _why(metric: Metric) -> str:
    if metric.table not in TESTED:
        return UNTESTED.get(metric.table, ("", "the sweep tests no row of this table"))[1]
    return " ".join(metric.null_why.split())


def null_policy(metrics=None) -> pd.DataFrame:
    """One row per metric (`metrics`, default every registered one): `NULL_POLICY_COLUMNS`.

    >>> policy = null_policy().set_index("metric")
    >>> policy.loc["prev_token", "with random-init controls"]
    "random-init controls' heads of the same layer, and uniform chance"
    >>> policy.loc["entropy", "without them"], policy.loc["syntax", "shuffled words"]
    ('none: not tested', 'kept: follows the words; lost: needs the word order')
    """
    chosen = list(METRICS.values()) if metrics is None else [METRICS[name] for name in metrics]
    return pd.DataFrame([{"metric": m.name, "table": m.table, "with random-init controls": _with_controls(m),
                          "without them": _without(m), "shuffled words": _SHUFFLED_SAID.get(m.shuffled, "–"),
                          "why": _why(m)} for m in chosen], columns=list(NULL_POLICY_COLUMNS))


def null_policy_markdown() -> str:
    """`null_policy` as a Markdown table, with what the shuffled-words column means, for docs/controls.md."""
    frame = null_policy()
    lines = ["| " + " | ".join(NULL_POLICY_COLUMNS) + " |", "|" + "---|" * len(NULL_POLICY_COLUMNS)]
    for row in frame.itertuples(index=False):
        cells = [f"`{row[0]}`", f"{row[1]}.parquet", *[str(c).replace("|", "\\|") for c in row[2:]]]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- *{kind}*: {why}." for kind, why in SHUFFLED.items()]
    return ("\n".join(lines) + f"\n\n{VALUE_NOTE}\n\nThe shuffled-words column, where filled (`Metric.shuffled`):\n"
            + "\n".join(notes) + "\n")
