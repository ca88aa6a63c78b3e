"""The masking test of retrieval heads read back: needle accuracy with the top retrieval heads masked against
random heads of the same layers and against no mask, the top drop's rank among the random draws' drops, and how
the masked heads (top and each random draw) overlap the run's own top retrieval heads and sink and induction heads.

The tables are ``retrieval_masking`` and ``retrieval_masking_trials`` (`headscan.scan.masking` writes them); the
random condition is read from its pooled rows (draw <NA>: the mean over draws per trial). This module computes;
`headscan.plots.masking` draws and the report's retrieval section shows.

>>> rows = pd.DataFrame({"model": "m", "condition": ["none", "top", "random", "random"], "draw": [pd.NA, pd.NA, 0, pd.NA],
...     "length": pd.array([pd.NA] * 4, dtype="Int64"), "depth": float("nan"), "k": [0, 2, 2, 2],
...     "value": [0.9, 0.2, 0.8, 0.8], "ci_low": [0.8, 0.1, 0.7, 0.7], "ci_high": [1.0, 0.3, 0.9, 0.9],
...     "count": 8, "units": 4, "drop": [float("nan"), -0.7, -0.1, -0.1], "drop_low": [float("nan"), -0.8, -0.2, -0.2],
...     "drop_high": [float("nan"), -0.6, 0.0, 0.0], "p_value": [float("nan"), 0.5, float("nan"), float("nan")]})
>>> masking_by_condition(rows)[["condition", "value", "drop"]].to_dict("list")
{'condition': ['none', 'top', 'random'], 'value': [0.9, 0.2, 0.8], 'drop': [nan, -0.7, -0.1]}
>>> print(masking_lines(rows)[0])
m, every trial (8 trials of 4 needles): none 0.90 [0.80, 1.00]; top 2 masked 0.20 [0.10, 0.30], drop -0.70 [-0.80, -0.60]; random 2 masked 0.80 [0.70, 0.90], drop -0.10 [-0.20, 0.00]; the top drop ranked among 1 random draw's drops: permutation p = 0.50 (the smallest 1 draw allows: 0.50)
"""

from __future__ import annotations

import pandas as pd

__all__ = ["CONDITIONS", "masking_by_condition", "masking_lines", "masked_heads", "overlap", "draw_overlap"]

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
    """Per model, one line over every trial: each condition's accuracy, the paired drop of the masked ones, and the
    top drop's permutation p-value among the random draws' drops."""
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
        draws = masking[(masking["model"] == model) & (masking["condition"] == "random") & masking["draw"].notna()
                        & masking["length"].isna()]
        top = part[part["condition"] == "top"]
        if len(draws) and len(top) and "p_value" in top and pd.notna(top["p_value"].iloc[0]):
            n = len(draws)
            said.append(f"the top drop ranked among {n} random {'draws' + chr(39) if n > 1 else 'draw' + chr(39) + 's'} drops: permutation p = "
                        f"{top['p_value'].iloc[0]:.2f} (the smallest {n} draw{'s' if n > 1 else ''} allow"
                        f"{'' if n > 1 else 's'}: {1 / (n + 1):.2f})")
        units = f" trials of {int(part['units'].iloc[0])} needles" if "units" in part and pd.notna(part["units"].iloc[0]) \
            else " trials"
        lines.append(f"{model}, every trial ({int(part['count'].iloc[0])}{units}): " + "; ".join(said))
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


def draw_overlap(masking: pd.DataFrame, trials: pd.DataFrame, model: str, *, retrieval: pd.DataFrame | None = None,
                 heads: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per masked set of `model` (top, then each random draw): its heads, its drop over every masked trial,
    and how many of its heads are among the run's own top k retrieval heads over all its trials (``run_top``: k
    the top set's size; the gated score where any trial passed, else the ungated one) and among the k highest
    sink (``first_token``) and ``induction`` heads of a sweep (None where not scored).

    >>> masking = pd.DataFrame({"model": "m", "condition": ["top", "random"], "draw": pd.array([pd.NA, 0], dtype="Int64"),
    ...     "length": pd.array([pd.NA, pd.NA], dtype="Int64"), "drop": [-0.5, -0.1]})
    >>> trials = pd.DataFrame({"model": "m", "condition": ["top", "random"], "draw": pd.array([pd.NA, 0], dtype="Int64"),
    ...                        "heads": ["L1H0", "L1H2"]})
    >>> retrieval = pd.DataFrame({"model": "m", "metric": "retrieval", "label": ["L1H0", "L1H2", "L0H0"],
    ...                           "layer": [1, 1, 0], "head": [0, 2, 0], "value": [0.2, 0.9, 0.1]})
    >>> draw_overlap(masking, trials, "m", retrieval=retrieval)[["set", "heads", "drop", "run_top"]].to_dict("records")
    [{'set': 'top', 'heads': 'L1H0', 'drop': -0.5, 'run_top': 0}, {'set': 'random 0', 'heads': 'L1H2', 'drop': -0.1, 'run_top': 1}]
    """
    mine = trials[trials["model"] == model].drop_duplicates(["condition", "draw"])
    mine = mine[mine["condition"] != "none"]
    pooled = masking[(masking["model"] == model) & masking["length"].isna()]
    drops = {(c, -1 if pd.isna(d) else int(d)): v for c, d, v in zip(pooled["condition"], pooled["draw"], pooled["drop"])}
    k = len(str(mine.loc[mine["condition"] == "top", "heads"].iloc[0]).split()) if (mine["condition"] == "top").any() \
        else len(str(mine["heads"].iloc[0]).split()) if len(mine) else 0
    run_top = None
    if retrieval is not None and len(retrieval[retrieval["model"] == model]):
        part = retrieval[retrieval["model"] == model]
        metric = "retrieval" if part.loc[part["metric"] == "retrieval", "value"].notna().any() else "retrieval_ungated"
        part = part[(part["metric"] == metric) & part["value"].notna()].sort_values(["layer", "head"])
        run_top = set(part.sort_values("value", ascending=False, kind="stable").head(k)["label"])
    rows = []
    for row in mine.itertuples():
        masked = str(row.heads).split()
        draw = -1 if pd.isna(row.draw) else int(row.draw)
        found = overlap(heads, model, masked) if heads is not None else {"first_token": None, "induction": None}
        rows.append({"set": row.condition if draw < 0 else f"{row.condition} {draw}", "heads": " ".join(masked),
                     "drop": drops.get((row.condition, draw), float("nan")),
                     "run_top": None if run_top is None else len(run_top & set(masked)),
                     "sink": found["first_token"], "induction": found["induction"]})
    return pd.DataFrame(rows, columns=["set", "heads", "drop", "run_top", "sink", "induction"])
