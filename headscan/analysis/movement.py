"""What heads move, not only where they look: the value and weights tables and the heads table's direct logit
attribution, read per model, layer and head.

- ``value.parquet`` holds the heads.parquet metrics on value-weighted attention (Kobayashi et al. 2020:
  ``A[q, k] ||f(x_k)||`` renormalised per query, ``f(x_k) = (x_k W_V + b_V) W_O`` for the head): a sink that
  draws attention but whose value vectors are near 0 moves little, and loses its share there.
- ``weights.parquet`` holds each head's OV copying score in [-1, 1] (Olsson et al. 2022), read off the weights
  alone (sum and count NaN).
- the heads table may hold ``dla`` (mean direct logit attribution of the head to the actual next token, in
  logits; causal models) and ``dla_positive`` (the share of queries where it is positive).

Every function takes tables and returns a DataFrame, so tests check them number by number. This module draws
nothing (see `headscan.plots`), lays out nothing (see `headscan.report`) and imports no model.

>>> heads = pd.DataFrame({"model": "m", "family": "bidirectional", "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
...     "label": ["L0H0", "L0H1", "L1H0", "L1H1"], "metric": "first_token", "value": [0.75, 0.25, 0.5, 0.5]})
>>> value = heads.assign(value=[0.125, 0.125, 0.0, 0.25])
>>> sink_summary(heads, value)[["model", "metric", "attention", "value_weighted", "heads"]].to_dict("records")
[{'model': 'm', 'metric': 'first_token', 'attention': 0.5, 'value_weighted': 0.125, 'heads': 4}]
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .claims import why_not

__all__ = ["SINKS", "COPYING", "DLA", "DLA_POSITIVE", "COPYING_HIGH", "paired", "layer_pairs", "sink_summary",
           "value_means", "copying_heads", "copying_counts", "dla_heads"]

SINKS = ("first_token", "sep")  # the sink metrics whose share value weighting is expected to shrink
COPYING = "copying"  # the weights table's OV copying score, -1 to 1
DLA = "dla"  # heads table: mean direct logit attribution to the actual next token, in logits
DLA_POSITIVE = "dla_positive"  # heads table: share of queries where that attribution is positive
COPYING_HIGH = 0.5  # a head whose copying score is above this is counted as a copying head

_KEYS = ["model", "family", "layer", "head", "label"]


def _order(frame: pd.DataFrame, models: list[str]) -> pd.DataFrame:
    where = {name: i for i, name in enumerate(models)}
    return frame.sort_values(["model", "layer", "head"], key=lambda c: c.map(where) if c.name == "model" else c,
                             kind="stable").reset_index(drop=True)


def paired(heads: pd.DataFrame, value: pd.DataFrame, *, metric: str) -> pd.DataFrame:
    """Each head's `metric` attention-weighted (heads table) beside value-weighted (value table).

    Returns
    -------
    DataFrame
        Columns ``model, family, layer, head, label, attention, value_weighted``: the heads that have both
        values defined, in the heads table's order of models, then by layer and head.
    """
    a = heads.loc[(heads["metric"] == metric) & heads["value"].notna(), _KEYS + ["value"]]
    v = value.loc[(value["metric"] == metric) & value["value"].notna(), ["model", "layer", "head", "value"]]
    both = a.rename(columns={"value": "attention"}).merge(v.rename(columns={"value": "value_weighted"}),
                                                          on=["model", "layer", "head"])
    both = both.astype({"model": str, "family": str, "label": str})
    return _order(both, [str(m) for m in dict.fromkeys(heads["model"])])


def layer_pairs(heads: pd.DataFrame, value: pd.DataFrame, *, metric: str = "first_token") -> pd.DataFrame:
    """Per model and layer: the mean over its heads of `metric`, attention-weighted and value-weighted.

    Returns
    -------
    DataFrame
        Columns ``model, layer, layers, depth, attention, value_weighted``; ``depth`` is layer / (layers - 1)
        (0 in a one-layer model), ``layers`` the model's number of layers in the heads table.
    """
    both = paired(heads, value, metric=metric)
    out = both.groupby(["model", "layer"], sort=False, as_index=False)[["attention", "value_weighted"]].mean()
    layers = heads.groupby("model", sort=False)["layer"].max() + 1
    out["layers"] = out["model"].map({str(k): int(v) for k, v in layers.items()}).astype("int64")
    out["depth"] = out["layer"] / (out["layers"] - 1).clip(lower=1)
    return out[["model", "layer", "layers", "depth", "attention", "value_weighted"]]


def sink_summary(heads: pd.DataFrame, value: pd.DataFrame, *, metrics=SINKS) -> pd.DataFrame:
    """Per model and sink metric: the mean share over its heads, attention-weighted and value-weighted, and
    the head whose share falls most; only where both tables define it.

    Returns
    -------
    DataFrame
        Columns ``model, metric, attention, value_weighted, heads, drop_label, drop_attention, drop_value``
        (``heads``: how many heads the means are over; ``drop_*``: the head whose attention-weighted minus
        value-weighted share is largest), model by model, metrics in `metrics` order.
    """
    rows = []
    for metric in metrics:
        both = paired(heads, value, metric=metric)
        for model, part in both.groupby("model", sort=False):
            worst = part.loc[(part["attention"] - part["value_weighted"]).idxmax()]
            rows.append({"model": model, "metric": metric, "attention": float(part["attention"].mean()),
                         "value_weighted": float(part["value_weighted"].mean()), "heads": len(part),
                         "drop_label": worst["label"], "drop_attention": float(worst["attention"]),
                         "drop_value": float(worst["value_weighted"])})
    columns = ["model", "metric", "attention", "value_weighted", "heads", "drop_label", "drop_attention", "drop_value"]
    out = pd.DataFrame(rows, columns=columns)
    models = {name: i for i, name in enumerate(dict.fromkeys(heads["model"]))}
    return out.sort_values("model", key=lambda c: c.map(models), kind="stable").reset_index(drop=True)


def value_means(heads: pd.DataFrame, value: pd.DataFrame) -> pd.DataFrame:
    """Per model and every metric both tables have, the mean over heads attention-weighted and value-weighted.

    Returns
    -------
    DataFrame
        Columns ``model, metric, attention, value_weighted, change`` (value-weighted minus attention-weighted),
        model by model, metrics in the value table's order.
    """
    metrics = [m for m in dict.fromkeys(value["metric"]) if (heads["metric"] == m).any()]
    return sink_summary(heads, value, metrics=metrics).assign(
        change=lambda f: f["value_weighted"] - f["attention"])[["model", "metric", "attention", "value_weighted",
                                                                 "change"]]


def copying_heads(weights: pd.DataFrame, *, n: int = 3) -> pd.DataFrame:
    """Each model's `n` heads with the highest OV copying score; ties to the lower layer, then head.

    Returns
    -------
    DataFrame
        Columns ``model, label, layer, head, value, embedding`` (``embedding``: "tied" or "untied", where the
        table records it), `n` rows per model at most, in table order.
    """
    rows = weights[(weights["metric"] == COPYING) & weights["value"].notna()]
    top = rows.sort_values(["value", "layer", "head"], ascending=[False, True, True], kind="stable")
    models = {name: i for i, name in enumerate(dict.fromkeys(weights["model"]))}
    top = top.groupby("model", sort=False).head(n)
    top = top.sort_values("model", key=lambda c: c.map(models), kind="stable")
    if "embedding" not in top:
        top = top.assign(embedding=pd.NA)
    return top[["model", "label", "layer", "head", "value", "embedding"]].astype(
        {"model": str, "label": str}).reset_index(drop=True)


def copying_counts(weights: pd.DataFrame, *, threshold: float = COPYING_HIGH) -> pd.DataFrame:
    """Per model: how many heads have a copying score, how many above 0, and how many above `threshold`.

    >>> w = pd.DataFrame({"model": "m", "metric": COPYING, "value": [0.9, 0.2, -0.4, float("nan")]})
    >>> copying_counts(w).to_dict("records")
    [{'model': 'm', 'heads': 3, 'positive': 2, 'high': 1, 'mean': 0.2333333333333333}]
    """
    rows = weights[(weights["metric"] == COPYING) & weights["value"].notna()]
    out = rows.groupby("model", sort=False)["value"].agg(
        heads="size", positive=lambda v: int((v > 0).sum()), high=lambda v: int((v > threshold).sum()),
        mean="mean").reset_index()
    return out.astype({"model": str, "heads": "int64", "positive": "int64", "high": "int64"})


def dla_heads(heads: pd.DataFrame, *, n: int = 5) -> pd.DataFrame:
    """Each causal model's `n` heads with the largest mean direct logit attribution, with the share of queries
    where it is positive; ties to the lower layer, then head.

    Returns
    -------
    DataFrame
        Columns ``model, label, layer, head, dla, ci_low, ci_high, chance, positive, unsupported`` (and the
        sweep's ``null_kind, null_low, null_high, q_value`` where the table records them)
        (``positive``: the head's ``dla_positive``, NaN where the table has none; ``chance``: the null head's dla,
        its output replaced by the mean of the values it could see; ``unsupported``: why the row cannot carry a
        claim, `headscan.analysis.claims.why_not`), `n` rows per model at most, in table order.
    """
    rows = heads[(heads["metric"] == DLA) & heads["value"].notna()]
    if "family" in rows:
        rows = rows[rows["family"] == "causal"]
    share = heads[heads["metric"] == DLA_POSITIVE].set_index(["model", "layer", "head"])["value"]
    top = rows.sort_values(["value", "layer", "head"], ascending=[False, True, True], kind="stable")
    top = top.groupby("model", sort=False).head(n)
    models = {name: i for i, name in enumerate(dict.fromkeys(heads["model"]))}
    top = top.sort_values("model", key=lambda c: c.map(models), kind="stable")
    positive = [share.get((m, lay, h), np.nan) for m, lay, h in zip(top["model"], top["layer"], top["head"])]
    chance = top["chance"] if "chance" in top.columns else pd.Series(np.nan, index=top.index)
    out = top.rename(columns={"value": "dla"}).assign(positive=positive, chance=chance,
                                                      unsupported=why_not(top) if len(top) else "")
    verdict = [c for c in ("null_kind", "null_low", "null_high", "q_value") if c in out.columns]  # for null_text
    return out[["model", "label", "layer", "head", "dla", "ci_low", "ci_high", "chance", "positive",
                "unsupported", *verdict]].astype({"model": str, "label": str, "positive": float}).reset_index(drop=True)
