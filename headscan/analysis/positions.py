"""Attention along the context: the positions table (``positions.parquet``) read per model, layer and head.

The positions table holds a metric per query-position bucket: bucket ``b`` is the queries whose position lies
in ``[b, 2b)`` (bucket 0: position 0 alone), so buckets run 0, 1, 2, 4, 8, ... up to the sweep's ``max_len``.
Two metrics fill it: ``first_token_by_position`` (the attention-sink share on the first token, BOS or [CLS])
and ``distance_by_position`` (mean sum_{k >= 1} A[q, k] |q - k|, in tokens, the first token left out). Every
row carries its chance, uniform attention's value on the same queries; statements are made only at buckets
whose rows are mostly not thin, and about rows that may carry a claim (`headscan.analysis.claims`). Every function here takes that table
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

from .. import tables
from .claims import supported, why_not

__all__ = ["SINK", "DISTANCE", "MIN_BUCKETS", "filled_buckets", "long_models", "layer_profiles", "chance_profile",
           "solid_buckets", "sink_heads", "reach"]

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


def chance_profile(positions: pd.DataFrame, *, metric: str) -> pd.DataFrame:
    """Per model and non-empty bucket, the chance level of `metric` (uniform attention over the keys each query
    sees, averaged over the bucket's queries: for the first-token share of a causal model whose every token
    counts, the mean of 1/(q+1)), from the table's ``chance`` column; no rows where it was not recorded.

    Returns
    -------
    DataFrame
        Columns ``model, bucket, chance``, in the table's order of models, then by bucket.
    """
    rows = _defined(positions[positions["metric"] == metric])
    if "chance" not in rows.columns:
        return pd.DataFrame({"model": pd.Series(dtype=str), "bucket": pd.Series(dtype="int64"),
                             "chance": pd.Series(dtype=float)})
    rows = rows[rows["chance"].notna()]
    out = rows.groupby(["model", "bucket"], sort=False, as_index=False)["chance"].mean()
    models = {name: i for i, name in enumerate(dict.fromkeys(positions["model"]))}
    out = out.assign(model=out["model"].astype(str)).sort_values(
        ["model", "bucket"], key=lambda c: c.map(models) if c.name == "model" else c, kind="stable")
    return out.reset_index(drop=True)


def solid_buckets(rows: pd.DataFrame) -> pd.Series:
    """Per (model, bucket) of `rows` (one metric's), whether most of its heads' rows rest on support that is
    not thin (`headscan.tables.thin_rows`): a bucket a statement may be made at."""
    flagged = rows.assign(_thin=tables.thin_rows(rows))
    return ~flagged.groupby(["model", "bucket"], sort=False)["_thin"].mean().gt(0.5)


def _statable(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` (defined, bucket >= 1) at the buckets where statements may be made (`solid_buckets`)."""
    if rows.empty:
        return rows
    solid = solid_buckets(rows)
    keep = [bool(solid.get((m, b), False)) for m, b in zip(rows["model"], rows["bucket"])]
    return rows[keep]


def sink_heads(positions: pd.DataFrame, *, n: int = 3) -> pd.DataFrame:
    """Each model's `n` heads with the largest first-token share at its longest bucket that is not thin
    (`solid_buckets`), among the rows that may carry a claim (`headscan.analysis.claims`: not thin, beyond
    chance), with their share at the first such bucket after position 0 to compare, and both chance levels.

    Ties go to the lower layer, then head.

    Returns
    -------
    DataFrame
        Columns ``model, label, layer, head, bucket, value, ci_low, ci_high, chance, early_bucket, early,
        early_chance`` (``value`` at ``bucket``, ``early`` at ``early_bucket``), `n` rows per model at most,
        in table order.
    """
    rows = _statable(_with_chance(_defined(positions[positions["metric"] == SINK])))
    rows = rows[rows["bucket"] >= 1] if len(rows) else rows  # position 0 attends to itself: 1 for a causal model
    parts = []
    for _, part in rows.groupby("model", sort=False):
        last, early = int(part["bucket"].max()), int(part["bucket"].min())
        at_last = part[part["bucket"] == last]
        top = at_last[supported(at_last)].sort_values(["value", "layer", "head"], ascending=[False, True, True],
                                                      kind="stable").head(n)
        first = part[part["bucket"] == early].set_index(["layer", "head"])
        top = top.assign(early_bucket=early,
                         early=[first["value"].get((lay, h), np.nan) for lay, h in zip(top["layer"], top["head"])],
                         early_chance=[first["chance"].get((lay, h), np.nan) for lay, h in zip(top["layer"], top["head"])])
        parts.append(top)
    columns = ["model", "label", "layer", "head", "bucket", "value", "ci_low", "ci_high", "chance", "early_bucket",
               "early", "early_chance"]
    if not parts:
        return pd.DataFrame({c: [] for c in columns})
    out = pd.concat(parts, ignore_index=True)[columns]
    return out.astype({"model": str, "label": str, "bucket": "int64", "early_bucket": "int64"})


def _with_chance(rows: pd.DataFrame) -> pd.DataFrame:
    return rows if "chance" in rows.columns else rows.assign(chance=np.nan)


def reach(positions: pd.DataFrame) -> pd.DataFrame:
    """Each head's reach at its model's longest bucket that is not thin (`solid_buckets`): its mean distance
    attended over past the first token (`distance_by_position`) divided by the same under uniform attention over
    the keys each query sees (the row's chance).

    The first token is left out of the distance, so a sink head, whose attention sits on it, does not read as
    looking far back: it reaches near 0, and the first-token share shows it. A head that looks a fixed number of
    tokens back keeps its distance as the context grows, so its reach falls towards 0; one that spreads its
    attention evenly over everything before the query reaches about 1, and one that looks further back than
    that, above 1. ``far`` and ``near`` say why a head cannot be called further (or nearer) than uniform
    attention (`headscan.analysis.claims.why_not` on the high and the low side), "" where it can.

    Returns
    -------
    DataFrame
        Columns ``model, layer, head, label, bucket, distance, ci_low, ci_high, chance, distance_early,
        early_bucket, value, far, near`` (``value``: the reach), one row per head that has the bucket, in table
        order; none for a table that recorded no chance.

    >>> rows = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 0, 1, 1], "label": ["L0H0"] * 2 + ["L0H1"] * 2,
    ...     "metric": DISTANCE, "bucket": [1, 64, 1, 64], "value": [1.0, 1.0, 0.5, 48.0], "count": 4.0,
    ...     "ci_low": [0.9, 0.9, 0.4, 45.0], "ci_high": [1.1, 1.1, 0.6, 50.0], "chance": [0.5, 40.0, 0.5, 40.0]})
    >>> reach(rows)[["label", "distance", "value", "far", "near"]].to_dict("records")
    [{'label': 'L0H0', 'distance': 1.0, 'value': 0.025, 'far': 'below chance', 'near': ''}, {'label': 'L0H1', 'distance': 48.0, 'value': 1.2, 'far': '', 'near': 'above chance'}]
    """
    rows = _with_chance(_defined(positions[positions["metric"] == DISTANCE]))
    rows = rows[(rows["bucket"] >= 1) & rows["chance"].gt(0)]
    rows = _statable(rows)
    parts = []
    for _, part in rows.groupby("model", sort=False):
        last, early = int(part["bucket"].max()), int(part["bucket"].min())
        at = part[part["bucket"] == last].sort_values(["layer", "head"], kind="stable")
        first = part[part["bucket"] == early].set_index(["layer", "head"])["value"]
        parts.append(pd.DataFrame({
            "model": at["model"].astype(str), "layer": at["layer"], "head": at["head"], "label": at["label"].astype(str),
            "bucket": last, "distance": at["value"], "ci_low": at["ci_low"], "ci_high": at["ci_high"],
            "chance": at["chance"],
            "distance_early": [first.get((lay, h), np.nan) for lay, h in zip(at["layer"], at["head"])],
            "early_bucket": early, "value": at["value"] / at["chance"],
            "far": why_not(at, striking="high"), "near": why_not(at, striking="low"),
        }))
    columns = ["model", "layer", "head", "label", "bucket", "distance", "ci_low", "ci_high", "chance",
               "distance_early", "early_bucket", "value", "far", "near"]
    if not parts:
        return pd.DataFrame({c: [] for c in columns})
    return pd.concat(parts, ignore_index=True)[columns]
