"""Inactive heads, checked by ablation: the heads that write little (``output_norm``) beside the effect of removing
them (importance.parquet).

A head is *quiet* when the upper end of its ``output_norm`` interval lies below `QUIET` of its layer's mean
head, on support that is not thin. Writing little should mean mattering little (Guo et al. 2024, "Active-dormant
attention heads"; Gu et al., ICLR 2025): ablation is the check. A quiet head is *confirmed* when its exact mean
ablation's effect is nil (`headscan.analysis.importance.matter_table`), *contradicted* when its effect matters,
and *undecided* otherwise (an effect neither nil nor mattering, an AtP estimate only, or not ablated). A
dormant head can still matter: the inputs that wake it may be rare, and a head that writes little into a
direction the model reads closely can still move its output.

This module draws nothing and loads no model.
"""

from __future__ import annotations

import pandas as pd

from ..tables import thin_rows
from .importance import matter_table

__all__ = ["QUIET", "VERDICTS", "quiet_heads", "inactive_against_ablation", "inactive_sentence"]

QUIET = 0.25  # quiet: output_norm's interval below a quarter of what the layer's mean head writes
VERDICTS = ("confirmed", "contradicted", "undecided")


def quiet_heads(heads: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``output_norm`` whose 95% interval lies wholly below `QUIET`, on support that is not thin, by
    model and value (quietest first).

    >>> heads = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 1], "label": ["L0H0", "L0H1"],
    ...     "metric": "output_norm", "value": [0.05, 1.1], "ci_low": [0.04, 1.0], "ci_high": [0.06, 1.2]})
    >>> quiet_heads(heads)["label"].tolist()
    ['L0H0']
    """
    rows = heads[(heads["metric"] == "output_norm") & heads["value"].notna()]
    rows = rows[(rows["ci_high"] < QUIET) & ~thin_rows(rows).to_numpy()]
    return rows.sort_values(["model", "value"], kind="stable").reset_index(drop=True)


def inactive_against_ablation(heads: pd.DataFrame, importance: pd.DataFrame,
                              scale_of: dict[str, str] | None = None) -> pd.DataFrame:
    """Each quiet head (`quiet_heads`) with its effect (`matter_table`) and ``verdict``, one of `VERDICTS`."""
    quiet = quiet_heads(heads)
    keys = ["model", "layer", "head"]
    effect = matter_table(heads, importance, scale_of)[keys + ["method", "exact", "matters", "nil"]].rename(
        columns={"method": "effect_method"})
    table = quiet.merge(effect, how="left", on=keys)
    nil, matters = table["nil"].eq(True), table["matters"].eq(True)  # a head not ablated: NaN, neither
    table["verdict"] = [VERDICTS[0] if n else VERDICTS[1] if m else VERDICTS[2] for n, m in zip(nil, matters)]
    return table


def _labels(rows: pd.DataFrame) -> str:
    return ", ".join(f"{r.label} ({r.value:.2f})" for r in rows.itertuples())


def inactive_sentence(table: pd.DataFrame, model: str) -> str | None:
    """One sentence on `model`'s quiet heads and what ablation says of them; None when it has none.

    >>> table = pd.DataFrame({"model": "m", "label": ["L3H1", "L5H0"], "value": [0.08, 0.2],
    ...                       "verdict": ["confirmed", "contradicted"]})
    >>> print(inactive_sentence(table, "m"))  # doctest: +NORMALIZE_WHITESPACE
    m: 2 quiet heads (output_norm's interval below 0.25 of its layer's mean head); ablation confirms L3H1 (0.08)
    (nil effect) and contradicts L5H0 (0.20) (its effect matters).
    """
    part = table[table["model"] == model]
    if part.empty:
        return None
    said = []
    for verdict, words in zip(VERDICTS, ("confirms {} (nil effect)", "contradicts {} (its effect matters)",
                                         "neither confirms nor contradicts {} (an effect neither nil nor clearly "
                                         "mattering, an AtP estimate only, or not ablated)")):
        rows = part[part["verdict"] == verdict]
        if not rows.empty:
            said.append(words.format(_labels(rows)))
    return (f"{model}: {len(part)} quiet heads (output_norm's interval below {QUIET:g} of its layer's mean head); "
            f"ablation {' and '.join(said) if len(said) < 3 else ', '.join(said[:-1]) + ' and ' + said[-1]}.")
