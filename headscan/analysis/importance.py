"""Does the head matter? Each head's importance beside its pattern scores, the heads whose pattern and effect
disagree, and attribution patching against exact ablation.

A head's *effect* is its row of importance.parquet (`headscan.metrics.importance`): the exact mean ablation where
the sweep ran it, else its AtP estimate. Its *strongest pattern* is the largest of its attention shares on one
kind of key (`PATTERN_METRICS`). Chance for an effect is 0, a head whose removal changes nothing; an effect
*matters* when its 95% interval clears 0 and it is at least `MATTERS` of the model's largest, and is *nil* when
its whole interval lies within `NEGLIGIBLE` of the model's largest around 0. Both are said of exact ablations
only, on the scale of the largest exact one: AtP is a first-order screen that misjudges early heads badly, so
it chooses heads to ablate and never makes a finding (`agreement` measures how well it screens). A control model is measured on its
trained model's scale (`scale_of`): an untrained copy's largest effect is no yardstick, since every head of it
changes the output by about as little. Flags rest only on values whose
support is not thin (`headscan.tables.thin_rows`), for both the effect and the pattern.

This module draws nothing and loads no model.

>>> round(spearman([1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 40.0, 30.0]), 6)
0.8
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..intervals.calibration import BASES, calibrate, calibrated_interval
from ..tables import thin_rows

__all__ = ["PATTERN_METRICS", "PAIRS", "STRIKING", "MATTERS", "NEGLIGIBLE", "FLAGS", "spearman", "effects",
           "strongest_pattern", "matter_table", "agreement"]

# Attention shares on one kind of key: the patterns a head is named after.
PATTERN_METRICS = ("prev_token", "next_token", "self", "first_token", "sep", "duplicate_token", "induction")
PAIRS = (("atp_mean", "mean_ablation"), ("atp_zero", "zero_ablation"))  # (estimate, exact)
STRIKING = 0.5  # a striking pattern: the lower end of its 95% interval puts at least half the attention there
MATTERS = 0.1  # an effect that matters: interval clear of 0, and at least this share of the model's largest
NEGLIGIBLE = 0.02  # a nil effect: the whole interval within this share of the model's largest, around 0
FLAGS = ("striking pattern, no effect", "effect, no striking pattern")


def spearman(x, y) -> float:
    """Spearman's rank correlation of two equally long sequences (ties get their average rank); NaN for fewer
    than 3 pairs or a constant one. The pairs where either is NaN are left out."""
    frame = pd.DataFrame({"x": np.asarray(x, float), "y": np.asarray(y, float)}).dropna()
    if len(frame) < 3:
        return float("nan")
    ranks = frame.rank(method="average")
    if ranks["x"].std() == 0 or ranks["y"].std() == 0:
        return float("nan")
    return float(np.corrcoef(ranks["x"], ranks["y"])[0, 1])


def effects(importance: pd.DataFrame) -> pd.DataFrame:
    """One row per head: its exact mean ablation where defined, else its AtP estimate of it (``exact`` says
    which), with the interval, support and ``thin``. Heads with neither are left out."""
    columns = ["model", "layer", "head", "label", "target", "method", "value", "ci_low", "ci_high", "units",
               "top_unit_share", "thin"]
    rows = importance[importance["method"].isin(["mean_ablation", "atp_mean"]) & importance["value"].notna()]
    rows = rows.assign(_exact=rows["method"] == "mean_ablation")
    rows = rows.sort_values("_exact", ascending=False, kind="stable").drop_duplicates(["model", "layer", "head"])
    rows = rows.sort_values(["model", "layer", "head"], kind="stable")
    out = rows[[c for c in columns if c in rows.columns]].reset_index(drop=True)
    out["exact"] = out["method"] == "mean_ablation"
    out["thin"] = thin_rows(out).to_numpy()
    return out


def strongest_pattern(heads: pd.DataFrame) -> pd.DataFrame:
    """One row per head: which of `PATTERN_METRICS` it scores highest on (``pattern``), that value, its interval
    and ``pattern_thin``."""
    rows = heads[heads["metric"].isin(PATTERN_METRICS) & heads["value"].notna()]
    rows = rows.sort_values(["value"], ascending=False, kind="stable").drop_duplicates(["model", "layer", "head"])
    out = rows[["model", "layer", "head", "metric", "value", "ci_low", "ci_high"]].rename(
        columns={"metric": "pattern", "value": "pattern_value", "ci_low": "pattern_low", "ci_high": "pattern_high"})
    out["pattern_thin"] = thin_rows(rows).to_numpy()
    return out.reset_index(drop=True)


def matter_table(heads: pd.DataFrame, importance: pd.DataFrame, scale_of: dict[str, str] | None = None
                 ) -> pd.DataFrame:
    """Each head's effect beside its strongest pattern, with ``matters``, ``nil``, ``striking`` and ``flag``
    (one of `FLAGS`, or ""): a striking pattern with a nil effect, or an effect that matters without any
    pattern reaching `STRIKING` (the upper end of every pattern's interval below it). Thin values flag nothing,
    and neither do AtP estimates: ``matters`` and ``nil`` are False on a row whose ``exact`` is False.
    `scale_of` maps a model (a control) to the model whose largest exact effect sets its scale (its trained
    model).

    >>> heads = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 1, 2], "metric": "prev_token",
    ...                       "value": [0.9, 0.1, 0.2], "ci_low": [0.88, 0.05, 0.15], "ci_high": [0.92, 0.15, 0.25]})
    >>> importance = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 1, 2], "label": ["L0H0", "L0H1", "L0H2"],
    ...     "target": "next_token_loss", "method": "mean_ablation", "value": [0.001, 0.5, 0.002],
    ...     "ci_low": [-0.002, 0.4, 0.001], "ci_high": [0.003, 0.6, 0.004], "units": 318})
    >>> matter_table(heads, importance)[["label", "flag"]].to_dict("records")
    [{'label': 'L0H0', 'flag': 'striking pattern, no effect'}, {'label': 'L0H1', 'flag': 'effect, no striking pattern'}, {'label': 'L0H2', 'flag': ''}]
    """
    table = effects(importance).merge(strongest_pattern(heads), how="left", on=["model", "layer", "head"])
    largest_of = table["value"].abs().where(table["exact"]).groupby(table["model"]).max()  # NaN: none exact
    scale = {model: (scale_of or {}).get(model, model) for model in largest_of.index}
    largest = table["model"].map({model: largest_of.get(scale[model], largest_of[model]) for model in scale})
    # an exact ablation's claim reads its interval widened by what its family needed at its size
    # (headscan.intervals.calibration); on fewer units than any size measured it makes none
    factor, basis = calibrate("importance", (table["method"] + ":" + table["target"]).to_numpy(dtype=object),
                              table["units"] if "units" in table else np.full(len(table), np.nan))
    table["cal_low"], table["cal_high"] = calibrated_interval(table["value"], table["ci_low"], table["ci_high"], factor)
    table["cal_basis"] = basis
    table["too_few_units"] = table["exact"] & (basis == BASES[2])
    clear = (table["cal_low"] > 0) | (table["cal_high"] < 0)
    sure = table["exact"] & ~table["thin"] & ~table["too_few_units"]
    table["matters"] = clear & (table["value"].abs() >= MATTERS * largest) & sure
    table["nil"] = (table[["cal_low", "cal_high"]].abs().max(axis=1) <= NEGLIGIBLE * largest) & sure
    sure = ~table["pattern_thin"].fillna(True).astype(bool)
    table["striking"] = (table["pattern_low"] >= STRIKING) & sure
    faint = (table["pattern_high"] < STRIKING) & sure
    table["flag"] = np.where(table["striking"] & table["nil"], FLAGS[0],
                             np.where(table["matters"] & faint, FLAGS[1], ""))
    return table


def agreement(importance: pd.DataFrame) -> pd.DataFrame:
    """Per model and pair of (AtP, exact ablation) methods, AtP as a screen: how many heads have both,
    Spearman's rank correlation of their values, and how many of the exact ablation's ten (``top_shared``) and
    twenty (``top20_shared``) largest |effects| AtP also puts in its ten or twenty largest: its recall."""
    rows = []
    for model, part in importance.groupby("model", sort=False):
        wide = part.pivot_table(index=["layer", "head"], columns="method", values="value", dropna=False)
        for estimate, exact in PAIRS:
            if estimate not in wide or exact not in wide:
                continue
            both = wide[[estimate, exact]].dropna()
            shared = {}
            for n in (10, 20):
                k = min(n, len(both))
                top_exact = set(both[exact].abs().nlargest(k).index)
                shared[n] = (k, len(top_exact & set(both[estimate].abs().nlargest(k).index)))
            rows.append({"model": model, "target": part["target"].iloc[0], "estimate": estimate, "exact": exact,
                         "heads": len(both), "spearman": spearman(both[estimate], both[exact]),
                         "top": shared[10][0], "top_shared": shared[10][1],
                         "top20": shared[20][0], "top20_shared": shared[20][1]})
    return pd.DataFrame(rows, columns=["model", "target", "estimate", "exact", "heads", "spearman", "top",
                                       "top_shared", "top20", "top20_shared"])
