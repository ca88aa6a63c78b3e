"""Which rows are discoveries: false-discovery control over a family of p-values, and the verdict columns.

A row of a table is a test of "does this head score beyond what a head that learned nothing scores?".
`headscan.intervals.pvalues` turns each row into a one-sided p-value against its metric's null; this module
corrects over the family of every row tested, so that a count of findings is a count with a stated
false-discovery rate:

- `q_values`: Benjamini-Hochberg (BH) or Benjamini-Yekutieli (BY) adjusted p-values over a family; a row is a
  discovery at level q when its q-value is at most q.
- `add_discoveries`: the columns ``null_kind``, ``null_low``, ``null_high``, ``p_value``, ``q_value`` and
  ``finding`` added to a tidy table, given a null per metric, and the family and rule in ``attrs``.

Which correction? BH controls the false-discovery rate at q for independent or positively dependent p-values
(PRDS; Benjamini & Yekutieli 2001), which covers rows sharing one control sample or one corpus as far as
anyone checks in practice; BY holds under any dependence at the cost of a factor sum_{i<=m} 1/i (about 6.8 for
500 tests). What the family is decides what the rate is about: all rows of a run (every head x metric) by
default, the count "k findings" then has at most q k false ones in expectation.

What this cannot do: the resolution of a rank p-value is 1 / (m + 1). With m control values and a family of n
tests, BH can only call a row whose p-value is at most q k / n, k the number of discoveries, so an empirical null
of m values finds nothing unless m + 1 >= n / (q k): with 5 seeds x 12 heads of one layer (m = 60) and q = 0.05,
only in a family of which at least a third (n / 3.05) are discoveries. Grow the sample (more seeds, neighbouring
layers), or test against the sample's range by the row's own SE (``control_test="t"`` in `add_discoveries`).

References
----------
Benjamini, Y. & Hochberg, Y. (1995). Controlling the false discovery rate. JRSS B 57(1), 289-300.
Benjamini, Y. & Yekutieli, D. (2001). The control of the false discovery rate in multiple testing under
dependency. Ann. Statist. 29(4), 1165-1188.

This module runs no model and wires nothing into the sweep or the report: it takes arrays and tables.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

import numpy as np
import pandas as pd

from ..errors import ConfigError
from .pvalues import check_side, interval_se, rank_p_value, t_p_value

__all__ = ["DISCOVERY_COLUMNS", "NULL_KINDS", "FDR_METHODS", "q_values", "add_discoveries"]

# The columns `add_discoveries` adds, in order.
DISCOVERY_COLUMNS = ("null_kind", "null_low", "null_high", "p_value", "q_value", "finding")
NULL_KINDS = (
    "uniform",  # the row's own ``chance`` column: uniform attention's value on the same queries (a point)
    "range",  # a fixed [low, high] given for the metric
    "controls",  # a sample of control heads' values at the same relative layer depth (rank p-value)
)
FDR_METHODS = ("bh", "by")


def q_values(p, *, method: str = "bh") -> np.ndarray:
    """Benjamini-Hochberg or Benjamini-Yekutieli adjusted p-values (q-values) over one family, vectorised.

    With the m finite p-values sorted, p_(1) <= ... <= p_(m): q_(i) = min_{j >= i} min(1, c m p_(j) / j), c = 1
    for BH and c = sum_{k <= m} 1 / k for BY. Rejecting the rows with q <= q* is the step-up procedure at level q*.
    Tied p-values get one q-value, that of the last of them (the largest rank). NaN p-values are no test: they
    stay NaN and do not count in m.

    Examples
    --------
    >>> q_values(np.array([0.01, 0.04, 0.03, np.nan, 0.5])).round(4).tolist()
    [0.04, 0.0533, 0.0533, nan, 0.5]
    >>> q_values(np.array([0.01, 0.04, 0.03, np.nan, 0.5]), method="by").round(4).tolist()
    [0.0833, 0.1111, 0.1111, nan, 1.0]
    """
    if method not in FDR_METHODS:
        raise ConfigError(f"unknown false-discovery method {method!r}; available: {', '.join(FDR_METHODS)} "
                          "(Benjamini-Hochberg, Benjamini-Yekutieli)")
    p = np.asarray(p, dtype=np.float64)
    flat = p.ravel()
    finite = np.flatnonzero(~np.isnan(flat))
    m = len(finite)
    out = np.full(flat.shape, np.nan)
    if m == 0:
        return out.reshape(p.shape)
    if np.any((flat[finite] < 0) | (flat[finite] > 1)):
        raise ValueError("p-values must lie between 0 and 1")
    order = finite[np.argsort(flat[finite], kind="stable")]
    rank = np.arange(1, m + 1)
    factor = 1.0 if method == "bh" else float(np.sum(1.0 / rank))
    scaled = np.minimum(1.0, factor * m * flat[order] / rank)
    out[order] = np.minimum.accumulate(scaled[::-1])[::-1]  # the min over j >= i; ties share the last one's
    return out.reshape(p.shape)


def _depth(rows: pd.DataFrame) -> pd.Series:
    """Relative layer depth, layer / (layers - 1) of each row's model (0 for a one-layer model)."""
    last = rows.groupby("model", sort=False)["layer"].transform("max") if "model" in rows.columns else rows["layer"].max()
    return (rows["layer"] / np.maximum(last, 1)).astype(float)


def _control_null(rows: pd.DataFrame, controls: pd.DataFrame, side: np.ndarray) -> tuple[np.ndarray, ...]:
    """Rank p-values of `rows` against the control values at the nearest relative depth, and that sample's range."""
    controls = controls[controls["value"].notna()]
    n = len(rows)
    p, low, top = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    if controls.empty:
        return p, low, top
    depth, control_depth = _depth(rows).to_numpy(), _depth(controls).to_numpy()
    levels = np.unique(control_depth)
    nearest = levels[np.abs(depth[:, None] - levels[None, :]).argmin(1)]
    values = controls["value"].to_numpy(dtype=np.float64)
    for level in levels:  # one sample per depth: a loop over layers, not heads
        mine = nearest == level
        if mine.any():
            sample = values[control_depth == level]
            p[mine] = rank_p_value(rows["value"].to_numpy(dtype=np.float64)[mine], sample, side=side[mine])
            low[mine], top[mine] = sample.min(), sample.max()
    return p, low, top


def add_discoveries(rows: pd.DataFrame, nulls: Mapping, *, q: float = 0.05, method: str = "bh",
                    striking="high", by=None, control_test: str = "rank") -> pd.DataFrame:
    """`rows` with the columns of `DISCOVERY_COLUMNS`: each row's null, p-value, q-value and verdict.

    For each metric named in `nulls`, its rows are tested against that null:

    - ``"uniform"``: the row's ``chance`` column, a point null (``null_kind`` "uniform"), by `t_p_value`;
    - ``(low, high)``: a fixed range (``"range"``), by `t_p_value` at its end on the striking side;
    - a DataFrame of control rows (``layer``, ``value``, and ``model`` to tell their depths apart): the values of
      heads that learned nothing (``"controls"``), by `rank_p_value` against the sample at the row's nearest
      relative layer depth; ``null_low`` and ``null_high`` are that sample's smallest and largest value. With
      `control_test` "t", by `t_p_value` against that range instead: beyond every control head, by the row's
      own SE, which can reach p-values below 1 / (m + 1) (see the module docstring).

    The t-test reads the row's ``se`` column where there is one, else the SE its interval implies
    (`interval_se` from ``ci_low``, ``ci_high`` and ``variance_df``). Rows of other metrics, and rows without
    what their test needs, get a NaN p-value: they are no test. ``q_value`` is `q_values` over the family: every
    row with a p-value, or every such row of one group of `by` (a column name or list of them). ``finding`` is
    q_value <= `q` and, where the table records ``thin``, the row not thin: a thin row's interval cannot be
    assessed, so it stays in the family (the count of tests is not lowered by it) but is never a finding.
    ``rows.attrs["discoveries"]`` says the rule, q, and each family's size.

    Parameters
    ----------
    rows : DataFrame
        A tidy table: ``metric``, ``value``, and the columns the nulls need.
    nulls : mapping of metric name -> "uniform", (low, high) or DataFrame
    q : float
        The false-discovery rate, between 0 and 1.
    method : "bh" or "by"
    striking : "high", "low", a mapping of metric -> side, or a Series aligned with `rows`

    Examples
    --------
    >>> rows = pd.DataFrame({"model": "m", "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
    ...                      "metric": ["prev_token", "prev_token", "dla", "dla"], "value": [0.9, 0.2, 0.5, 0.01],
    ...                      "se": [0.01, 0.05, 0.1, 0.1], "variance_df": 30.0, "chance": [0.15, 0.15, 0.0, 0.0]})
    >>> controls = pd.DataFrame({"model": "c", "layer": [0, 1] * 100, "value": np.linspace(-0.3, 0.3, 200)})
    >>> out = add_discoveries(rows, {"prev_token": "uniform", "dla": controls})
    >>> shown = out[["metric", "null_kind", "null_high", "p_value", "q_value", "finding"]]
    >>> print(shown.round({"p_value": 4, "q_value": 4}).to_string(index=False))
        metric null_kind  null_high  p_value  q_value  finding
    prev_token   uniform       0.15   0.0000   0.0000     True
    prev_token   uniform       0.15   0.1627   0.2169    False
           dla  controls       0.30   0.0099   0.0198     True
           dla  controls       0.30   0.4950   0.4950    False
    >>> out.attrs["discoveries"]["family"]
    'all 4 rows with a null (prev_token, dla)'
    """
    if not isinstance(q, numbers.Real) or not 0 < q < 1:
        raise ConfigError(f"the false-discovery rate q must be between 0 and 1 (0.05 for 5%), got {q!r}")
    q_values([], method=method)  # an unknown method raises here, with the choices
    if len(rows) and not set(nulls) & set(rows["metric"]):
        raise ConfigError(f"no rows of the metrics the nulls name ({', '.join(map(str, nulls))}); "
                          f"the table has {', '.join(map(str, dict.fromkeys(rows['metric'])))}")
    if control_test not in ("rank", "t"):
        raise ConfigError(f"control_test must be 'rank' or 't', got {control_test!r}")
    kind, low, top, p = _tests(rows, nulls, _sides(rows, striking), control_test)
    qs, sizes = np.full(len(rows), np.nan), []
    groups = ([np.arange(len(rows))] if by is None
              else list(rows.reset_index(drop=True).groupby(by, sort=False).indices.values()))
    for members in groups:
        qs[members] = q_values(p[members], method=method)
        sizes.append(int(np.isfinite(p[members]).sum()))
    thin = (rows["thin"].astype("boolean").fillna(False).to_numpy(dtype=bool) if "thin" in rows.columns
            else np.zeros(len(rows), dtype=bool))
    out = rows.assign(null_kind=pd.array(kind, dtype="string"), null_low=low, null_high=top, p_value=p,
                      q_value=qs, finding=(qs <= q) & ~thin)
    tested = [m for m in nulls if (rows["metric"] == m).any()]
    what = f"all {sum(sizes)} rows with a null ({', '.join(map(str, tested))})"
    if by is not None:
        what += f", one family per {by if isinstance(by, str) else ', '.join(by)} ({', '.join(map(str, sizes))} rows)"
    rule = {"bh": "Benjamini-Hochberg", "by": "Benjamini-Yekutieli"}[method]
    out.attrs = {**rows.attrs, "discoveries": {"rule": rule, "q": float(q), "family": what, "sizes": sizes}}
    return out


def _sides(rows: pd.DataFrame, striking) -> np.ndarray:
    """Each row's striking side, "high" or "low", from a side, a mapping of metric -> side, or a Series."""
    if isinstance(striking, pd.Series):
        side = striking.reindex(rows.index)
    elif isinstance(striking, Mapping):
        side = rows["metric"].map(lambda m: striking.get(m, "high"))
    else:
        side = pd.Series(striking, index=rows.index)
    sides = side.to_numpy(dtype=object)
    check_side(sides)
    return sides


def _standard_errors(rows: pd.DataFrame, value: np.ndarray) -> np.ndarray:
    """The ``se`` column, else the SE the interval implies (`interval_se`), else NaN (no test)."""
    if "se" in rows.columns:
        return rows["se"].to_numpy(dtype=np.float64)
    if {"ci_low", "ci_high", "variance_df"} <= set(rows.columns):
        return interval_se(value, *(rows[c].to_numpy(dtype=np.float64) for c in ("ci_low", "ci_high", "variance_df")))
    return np.full(len(rows), np.nan)


def _tests(rows: pd.DataFrame, nulls: Mapping, sides: np.ndarray, control_test: str) -> tuple[np.ndarray, ...]:
    """Each row's null kind, null range and p-value against its metric's null (None and NaN where none)."""
    n = len(rows)
    kind = np.full(n, None, dtype=object)
    low, top, p = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    value = rows["value"].to_numpy(dtype=np.float64)
    se = _standard_errors(rows, value)
    df = rows["variance_df"].to_numpy(dtype=np.float64) if "variance_df" in rows.columns else np.full(n, np.nan)
    metric = rows["metric"].to_numpy(dtype=object)
    for name, null in nulls.items():
        mine = metric == name
        if not mine.any():
            continue
        if isinstance(null, pd.DataFrame):
            kind[mine] = "controls"
            p[mine], low[mine], top[mine] = _control_null(rows[mine], null, sides[mine])
            if control_test == "rank":
                continue
        if isinstance(null, str) and null == "uniform":
            if "chance" not in rows.columns:
                raise ConfigError(f"metric {name!r} is tested against uniform attention, but the table has no "
                                  "chance column; sweep again with this headscan, or give its null as (low, high)")
            kind[mine] = "uniform"
            low[mine] = top[mine] = rows["chance"].to_numpy(dtype=np.float64)[mine]
        elif isinstance(null, tuple) and len(null) == 2:
            kind[mine] = "range"
            low[mine], top[mine] = float(null[0]), float(null[1])
        elif not isinstance(null, pd.DataFrame):
            raise ConfigError(f"the null of metric {name!r} must be 'uniform', a (low, high) pair or a DataFrame "
                              f"of control rows, got {null!r}")
        p[mine] = t_p_value(value[mine], se[mine], df[mine], low[mine], top[mine], side=sides[mine])
    return kind, low, top, p
