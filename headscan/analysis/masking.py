"""The masking test of retrieval heads read back: needle accuracy with the top retrieval heads masked against
random heads of the same layers and against no mask, and how the masked heads overlap sink and induction heads.

The tables are ``retrieval_masking`` and ``retrieval_masking_trials`` (`headscan.scan.masking` writes them); the
random condition is read from its pooled rows (draw <NA>: the mean over draws per trial). This module computes;
`headscan.plots.masking` draws and the report's retrieval section shows.

>>> rows = pd.DataFrame({"model": "m", "condition": ["none", "top", "random", "random"], "draw": [pd.NA, pd.NA, 0, pd.NA],
...     "length": pd.array([pd.NA] * 4, dtype="Int64"), "depth": float("nan"), "k": [0, 2, 2, 2],
...     "value": [0.9, 0.2, 0.8, 0.8], "ci_low": [0.8, 0.1, 0.7, 0.7], "ci_high": [1.0, 0.3, 0.9, 0.9],
...     "count": 8, "drop": [float("nan"), -0.7, -0.1, -0.1], "drop_low": [float("nan"), -0.8, -0.2, -0.2],
...     "drop_high": [float("nan"), -0.6, 0.0, 0.0]})
>>> masking_by_condition(rows)[["condition", "value", "drop"]].to_dict("list")
{'condition': ['none', 'top', 'random'], 'value': [0.9, 0.2, 0.8], 'drop': [nan, -0.7, -0.1]}
>>> print(masking_lines(rows)[0])
m, every trial (8): none 0.90 [0.80, 1.00]; top 2 masked 0.20 [0.10, 0.30], drop -0.70 [-0.80, -0.60]; random 2 masked 0.80 [0.70, 0.90], drop -0.10 [-0.20, 0.00]
"""

from __future__ import annotations

import pandas as pd

__all__ = ["CONDITIONS", "masking_by_condition", "masking_lines", "masked_heads", "overlap"]

CONDITIONS = ("none", "top", "random")


def masking_by_condition(masking: pd.DataFrame) -> pd.DataFrame:
    """The rows that compare conditions: none, top, and random pooled over its draws (draw <NA>), in that order
    within each (model, length, depth); the rows pooling every trial (length <NA>) last."""
    rows = masking[masking["draw"].isna()].copy()
    rows["order"] = rows["condition"].map({c: i for i, c in enumerate(CONDITIONS)})
    rows["pooled"] = rows["length"].isna()
    models = {m: i for i, m in enumerate(dict.fromkeys(masking["model"]))}
    rows["model_order"] = rows["model"].map(models)
    rows = rows.sort_values(["model_order", "pooled", "length", "depth", "order"], kind="stable")
    return rows.drop(columns=["order", "pooled", "model_order"]).reset_index(drop=True)


def _interval(value, low, high) -> str:
    if pd.isna(low) or pd.isna(high):
        return f"{value:.2f}"
    return f"{value:.2f} [{low:.2f}, {high:.2f}]"


def masking_lines(masking: pd.DataFrame) -> list[str]:
    """Per model, one line over every trial: each condition's accuracy, and the paired drop of the masked ones."""
    rows = masking_by_condition(masking)
    lines = []
    for model, part in rows[rows["length"].isna()].groupby("model", sort=False):
        said = []
        for row in part.itertuples():
            text = f"{row.condition}" + (f" {int(row.k)} masked" if row.condition != "none" else "")
            text += " " + _interval(row.value, row.ci_low, row.ci_high)
            if row.condition != "none":
                text += ", drop " + _interval(row.drop, row.drop_low, row.drop_high)
            said.append(text)
        lines.append(f"{model}, every trial ({int(part['count'].iloc[0])}): " + "; ".join(said))
    return lines


def masked_heads(trials: pd.DataFrame, model: str) -> list[str]:
    """The heads masked in condition top for `model`, as L{layer}H{head} labels."""
    top = trials[(trials["model"] == model) & (trials["condition"] == "top")]
    return str(top["heads"].iloc[0]).split() if len(top) else []


def overlap(heads: pd.DataFrame, model: str, masked: list[str], metrics=("first_token", "induction")) -> dict:
    """How many of `masked` are among `model`'s as many highest heads by each of `metrics` (heads.parquet rows of
    a sweep); a metric the sweep did not score maps to None.

    >>> heads = pd.DataFrame({"model": "m", "label": ["L0H0", "L0H1", "L1H0"], "metric": "induction",
    ...                       "value": [0.9, 0.1, 0.5]})
    >>> overlap(heads, "m", ["L1H0", "L0H1"])
    {'first_token': None, 'induction': 1}
    """
    found = {}
    for metric in metrics:
        part = heads[(heads["model"] == model) & (heads["metric"] == metric) & heads["value"].notna()]
        if part.empty or not masked:
            found[metric] = None
            continue
        highest = part.sort_values("value", ascending=False, kind="stable").head(len(masked))["label"]
        found[metric] = len(set(highest) & set(masked))
    return found
