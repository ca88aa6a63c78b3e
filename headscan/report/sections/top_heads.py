"""The sections "Top heads" (each metric's most striking heads per model, beside their controls) and "Other tables"
(the top rows of every table of the registry that no section of its own draws).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ...analysis import movement, positions
from ...analysis.ranking import (
    WIDE_CI,
    fmt_bucket,
    fmt_score,
    striking_order,
    thin_note,
    thin_passed,
    top_heads,
    top_rows,
)
from ...analysis.runs import Comparison
from ...intervals import MIN_EFFECTIVE_UNITS, MIN_SPARSE_EVENNESS, MIN_VARIANCE_DF, THIN_MAX_SHARE, THIN_MIN_UNITS
from ...metrics import METRICS
from ...tables import TABLES
from ..document import Heading, Note, Panels, Table, Text
from ..figures import structural
from . import Context, register_section

__all__ = ["top_section", "other_tables_section", "shown_elsewhere"]

SECTIONED = ("heads", "offsets", "syntax", "importance", "retrieval", "retrieval_trials", "similarity",  # with sections
             "examples", "composition", "retrieval_masking", "retrieval_masking_trials")  # of their own (examples: each head's units, read per head, not ranked across heads);
# any other table gets its top rows
# positions, value and weights rows get sections of their own where there is enough to draw (`shown_elsewhere`);
# the rest of them are listed with the other tables.


def _codes(names: Sequence[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def _ranked(comparison: Comparison) -> list[str]:
    """The heads-table metrics that can be ranked: those the registry knows."""
    return [m for m in comparison.metrics if m in METRICS and METRICS[m].table == "heads"]


def _top_table(comparison: Comparison, metric: str, n: int) -> Table:
    """One metric's top heads, model by model: value, interval ends and chance in columns of their own, so they
    sort; why a head carries no claim ("at chance", "thin support"); each control's value for the same head. Heads
    on thin support rank after the supported ones, and the note names those that their value alone would rank
    among the `n`."""
    top = top_heads(comparison.heads, metric=metric, n=n, thin_last=True)
    passed = thin_passed(comparison.heads, metric=metric, n=n)
    controls = comparison.control_map()
    kinds = {c: _control_kind(comparison, c) for names in controls.values() for c in names}
    heads = comparison.heads[comparison.heads["metric"] == metric].set_index(["model", "layer", "head"])
    rows, notes = [], []
    for m in comparison.models:
        part = top[top["model"] == m.name]
        for row in part.itertuples():
            cells = {"model": m.name, "rank": str(row.rank), "head": row.label,
                     "value": fmt_score(metric, row.value), "95% low": fmt_score(metric, row.ci_low, row.value),
                     "95% high": fmt_score(metric, row.ci_high, row.value),
                     "chance": fmt_score(metric, row.chance, row.value),
                     # the interval that holds for all heads at once: a head picked as the top may claim this one
                     "all heads, low": fmt_score(metric, getattr(row, "joint_low", float("nan")), row.value),
                     "all heads, high": fmt_score(metric, getattr(row, "joint_high", float("nan")), row.value),
                     "no claim": row.unsupported, "mark": ("†" if row.wide else "") + ("‡" if row.thin else "")}
            for control in controls.get(m.name, []):
                value = heads["value"].get((control, row.layer, row.head), float("nan"))
                cells[kinds[control]] = fmt_score(metric, value, row.value)
            rows.append(cells)
        if part.empty and (comparison.heads["model"] == m.name).any():
            values = _model_rows(comparison, m.name, metric)["value"].dropna()
            same = "undefined" if values.empty else fmt_score(metric, values.iloc[0])
            reason = structural(comparison, m.name, metric)
            notes.append(f"{m.name}: {same} for every head" + (f"; {reason}." if reason else "."))
        if m.name in passed:
            notes.append(thin_note(m.name, metric, passed[m.name]))
    columns = ["model", "rank", "head", "value", "95% low", "95% high", "all heads, low", "all heads, high", "chance",
               *dict.fromkeys(kinds.values()), "no claim", "mark"]
    frame = pd.DataFrame(rows, columns=columns).fillna("")
    if "joint_low" not in top.columns or top["joint_low"].isna().all():  # a table written before, or no bootstrap
        frame = frame.drop(columns=["all heads, low", "all heads, high"])
    if len(comparison.models) == 1:
        frame = frame.drop(columns="model")
    if not frame["mark"].astype(bool).any():
        frame = frame.drop(columns="mark")
    if not frame["no claim"].astype(bool).any():
        frame = frame.drop(columns="no claim")
    numeric = tuple(c for c in ("rank", "value", "95% low", "95% high", "all heads, low", "all heads, high", "chance",
                                *dict.fromkeys(kinds.values())) if c in frame.columns)
    return Table(frame, numeric=numeric, note=" ".join(notes), sortable=True)


def _control_kind(comparison: Comparison, name: str) -> str:
    """A control's column heading: what kind of control it is ("random init", "shuffled words")."""
    kind = comparison.model(name).provenance.control or "control"
    return kind.replace("-", " ")


def _model_rows(comparison: Comparison, model: str, metric: str) -> pd.DataFrame:
    heads = comparison.heads
    return heads[(heads["model"] == model) & (heads["metric"] == metric)]


def top_section(comparison: Comparison, top: int) -> list:
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
             f"keys each query sees on the same queries. {order}; but a head on thin support (‡) ranks after every "
             "supported head whatever its value, and a line under its table names those whose value alone would "
             "have ranked them higher. A head listed here is not a finding unless its "
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


def other_tables_section(comparison: Comparison, top: int) -> list:
    shown = shown_elsewhere(comparison)  # rows drawn in "Attention along the context", "What heads move"
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


def shown_elsewhere(comparison: Comparison) -> dict[str, set[str]]:
    """Table name -> the metrics of it that `context_section` and `movement_section` show, so that the report's
    "other tables" leaves them out."""
    out: dict[str, set[str]] = {}
    if "positions" in comparison.frames and positions.long_models(comparison["positions"]):
        out["positions"] = {positions.SINK, positions.DISTANCE}
    if "value" in comparison.frames and len(movement.value_means(comparison.heads, comparison["value"])):
        out["value"] = set(movement.value_means(comparison.heads, comparison["value"])["metric"])
    if "weights" in comparison.frames:
        weights = comparison["weights"]
        if ((weights["metric"] == movement.COPYING) & weights["value"].notna()).any():
            out["weights"] = {movement.COPYING}
    return out


@register_section("top heads", order=60)
def top_heads_part(context: Context) -> list:
    return [*top_section(context.comparison, context.top), *other_tables_section(context.comparison, context.top)]
