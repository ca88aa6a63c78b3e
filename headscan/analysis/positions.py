"""Attention along the context: the positions table (``positions.parquet``) read per model, layer and head.

The positions table holds a metric per query-position bucket: bucket ``b`` is the queries whose position lies
in ``[b, 2b)`` (bucket 0: position 0 alone), so buckets run 0, 1, 2, 4, 8, ... up to the sweep's ``max_len``.
Two metrics fill it: ``first_token_by_position`` (the attention-sink share on the first token, BOS or [CLS])
and ``distance_by_position`` (mean sum_k A[q, k] |q - k|, in tokens). Every function here takes that table
(or its rows of one model) and returns a DataFrame, so tests check them number by number.

This module draws nothing (see `headscan.plots`), lays out nothing (see `headscan.report`) and imports no
model; like `headscan.analysis.runs`, it reads metric names only.

>>> rows = pd.DataFrame({"model": "m", "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "label": ["L0H0", "L0H1",
...     "L1H0", "L1H1"], "metric": "first_token_by_position", "bucket": 8, "value": [0.25, 0.75, 0.5, 0.0],
...     "count": 5.0})
>>> layer_profiles(rows, metric="first_token_by_position")[["layer", "bucket", "value"]].to_dict("records")
[{'layer': 0, 'bucket': 8, 'value': 0.5}, {'layer': 1, 'bucket': 8, 'value': 0.25}]
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["SINK", "DISTANCE", "MIN_BUCKETS", "filled_buckets", "long_models", "layer_profiles", "sink_heads",
           "reach"]

SINK = "first_token_by_position"  # attention on the first token, by query position
DISTANCE = "distance_by_position"  # mean distance attended over, in tokens, by query position
MIN_BUCKETS = 5  # a model's context is drawn only with at least this many non-empty buckets (positions 0..15+)


def _defined(positions: pd.DataFrame) -> pd.DataFrame:
    """Rows of the two metrics that some query counts for (count > 0) and that have a value."""
    rows = positions[positions["metric"].isin([SINK, DISTANCE]) & positions["value"].notna()]
    return rows[rows["count"].fillna(0) > 0] if "count" in rows else rows


def filled_buckets(positions: pd.DataFrame) -> pd.Series:
    """How many buckets of each model some query counts for, on either metric: model -> int, in table order.

    >>> rows = pd.DataFrame({"model": ["a", "a", "a", "b"], "metric": DISTANCE, "bucket": [0, 1, 2, 0],
    ...                      "value": [0.0, 1.0, float("nan"), 0.0], "count": [3.0, 3.0, 0.0, 2.0]})
    >>> filled_buckets(rows).to_dict()
    {'a': 2, 'b': 1}
    """
    models = list(dict.fromkeys(positions["model"]))
    counts = _defined(positions).groupby("model", sort=False)["bucket"].nunique()
    return pd.Series({m: int(counts.get(m, 0)) for m in models}, dtype="int64")


def long_models(positions: pd.DataFrame, *, min_buckets: int = MIN_BUCKETS) -> list[str]:
    """The models with at least `min_buckets` non-empty buckets: those whose context is long enough to show."""
    filled = filled_buckets(positions)
    return [m for m, n in filled.items() if n >= min_buckets]


def layer_profiles(positions: pd.DataFrame, *, metric: str) -> pd.DataFrame:
    """Per model, layer and non-empty bucket, the mean of `metric` over the layer's heads.

    Returns
    -------
    DataFrame
        Columns ``model, layer, layers, bucket, value`` (``layers``: the model's number of layers), sorted by
        model (table order), layer and bucket.
    """
    rows = _defined(positions[positions["metric"] == metric])
    models = {name: i for i, name in enumerate(dict.fromkeys(positions["model"]))}
    out = rows.groupby(["model", "layer", "bucket"], sort=False, as_index=False)["value"].mean()
    out["model"] = out["model"].astype(str)
    layers = positions.groupby("model", sort=False)["layer"].max() + 1
    out["layers"] = out["model"].map({str(k): int(v) for k, v in layers.items()}).astype("int64")
    out = out.sort_values(["model", "layer", "bucket"], key=lambda c: c.map(models) if c.name == "model" else c,
                          kind="stable")
    return out[["model", "layer", "layers", "bucket", "value"]].reset_index(drop=True)


def _last_bucket(rows: pd.DataFrame) -> pd.Series:
    """model -> its longest non-empty bucket among `rows`."""
    return _defined(rows).groupby("model", sort=False)["bucket"].max()


def sink_heads(positions: pd.DataFrame, *, n: int = 3) -> pd.DataFrame:
    """Each model's `n` heads with the largest first-token share at its longest non-empty bucket, with their
    share at the first bucket after position 0 that counts (bucket 1 where the table has it) to compare.

    Ties go to the lower layer, then head.

    Returns
    -------
    DataFrame
        Columns ``model, label, layer, head, bucket, value, ci_low, ci_high, early_bucket, early`` (``value``
        at ``bucket``, ``early`` at ``early_bucket``), `n` rows per model at most, in table order.
    """
    rows = _defined(positions[positions["metric"] == SINK])
    rows = rows[rows["bucket"] >= 1]  # position 0 attends to itself, the first token: 1 for a causal model
    parts = []
    for model, part in rows.groupby("model", sort=False):
        last, early = int(part["bucket"].max()), int(part["bucket"].min())
        top = part[part["bucket"] == last].sort_values(["value", "layer", "head"], ascending=[False, True, True],
                                                       kind="stable").head(n)
        first = part[part["bucket"] == early].set_index(["layer", "head"])["value"]
        top = top.assign(early_bucket=early, early=[first.get((lay, h), np.nan)
                                                    for lay, h in zip(top["layer"], top["head"])])
        parts.append(top)
    columns = ["model", "label", "layer", "head", "bucket", "value", "ci_low", "ci_high", "early_bucket", "early"]
    if not parts:
        return pd.DataFrame({c: [] for c in columns})
    out = pd.concat(parts, ignore_index=True)[columns]
    return out.astype({"model": str, "label": str, "bucket": "int64", "early_bucket": "int64"})


def reach(positions: pd.DataFrame) -> pd.DataFrame:
    """Each head's mean distance at its model's longest non-empty bucket, divided by that bucket's first position.

    A head that looks a fixed number of tokens back keeps the same distance wherever the query is, so its reach
    falls towards 0 as the context grows; a head that spreads its attention over everything before the query
    looks further the later the query, so its reach stays near 1 (uniform causal attention over positions
    [b, 2b) gives about 0.75).

    Returns
    -------
    DataFrame
        Columns ``model, layer, head, label, bucket, distance, distance_early, early_bucket, value`` (``value``:
        the reach, distance / bucket), one row per head that has the longest bucket, in table order.

    >>> rows = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 0, 1, 1], "label": ["L0H0"] * 2 + ["L0H1"] * 2,
    ...     "metric": DISTANCE, "bucket": [1, 64, 1, 64], "value": [1.0, 1.0, 0.5, 48.0], "count": 4.0})
    >>> reach(rows)[["label", "distance", "value"]].to_dict("records")
    [{'label': 'L0H0', 'distance': 1.0, 'value': 0.015625}, {'label': 'L0H1', 'distance': 48.0, 'value': 0.75}]
    """
    rows = _defined(positions[positions["metric"] == DISTANCE])
    rows = rows[rows["bucket"] >= 1]
    parts = []
    for _, part in rows.groupby("model", sort=False):
        last, early = int(part["bucket"].max()), int(part["bucket"].min())
        at = part[part["bucket"] == last].sort_values(["layer", "head"], kind="stable")
        first = part[part["bucket"] == early].set_index(["layer", "head"])["value"]
        parts.append(pd.DataFrame({
            "model": at["model"].astype(str), "layer": at["layer"], "head": at["head"], "label": at["label"].astype(str),
            "bucket": last, "distance": at["value"],
            "distance_early": [first.get((lay, h), np.nan) for lay, h in zip(at["layer"], at["head"])],
            "early_bucket": early, "value": at["value"] / last,
        }))
    columns = ["model", "layer", "head", "label", "bucket", "distance", "distance_early", "early_bucket", "value"]
    if not parts:
        return pd.DataFrame({c: [] for c in columns})
    return pd.concat(parts, ignore_index=True)[columns]
