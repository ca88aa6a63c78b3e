"""Simultaneous intervals over a model's heads: what a "top head" may claim after it was picked as the top.

A head picked because it scores highest among 144 is picked partly for its luck: its own 95% interval covers
its value 95% of the time when the head is fixed in advance, less when the data chose it (the winner's curse).
`joint_interval` widens every head's interval of one column by one common factor, the 95% quantile over the
bootstrap's replicates of the largest studentized deviation among the heads, max_h |R*_bh - R_h| / SE_h (the
single-step max-t method of Romano & Wolf 2005): all heads' intervals then hold together 95% of the time, so
the one that was picked is covered whichever it is.

References
----------
Romano, J. P. & Wolf, M. (2005). Exact and approximate stepdown methods for multiple hypothesis testing.
JASA 100(469), 94-108.

This module runs no model and knows nothing of tables: it takes arrays.
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["joint_interval"]


def joint_interval(value, replicate_sums, replicate_counts, se, *, level: float = 0.95, bounds=None,
                   over: tuple[int, ...] = (0, 1)) -> tuple[np.ndarray, np.ndarray]:
    """Simultaneous `level` intervals, value -/+ c SE, with one c per column for all heads of the column.

    `value` and `se` have shape (layer, head, column), the replicates (replicate, layer, head, column); `over`
    are the axes of `value` the intervals hold jointly over (layer and head). c is the `level` quantile over
    replicates of max over those axes of |R*_b - R| / SE, ignoring heads with an undefined value, SE or
    replicate. NaN where the value or SE is undefined or no replicate is; where SE is 0 the interval is the
    value. Clipped into `bounds` (low, high), each broadcastable to `value`, as the row's own interval is.

    Examples
    --------
    Two heads whose replicates lie 1 and 3 SE from their values, in turn: the largest deviation is 3 SE in every
    replicate, so the joint interval is 3 SE wide on each side, for both heads.

    >>> value, se = np.array([[[0.5], [0.2]]]), np.array([[[0.1], [0.01]]])     # (layer, head, column)
    >>> sums = np.array([[[[0.6], [0.23]]], [[[0.8], [0.21]]]] * 2)            # (replicate, layer, head, column)
    >>> low, high = joint_interval(value, sums, np.ones_like(sums), se, level=0.75)
    >>> low.round(3).ravel().tolist(), high.round(3).ravel().tolist()
    ([0.2, 0.17], [0.8, 0.23])
    """
    value, se = np.asarray(value, dtype=np.float64), np.asarray(se, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = np.asarray(replicate_sums, dtype=np.float64) / np.asarray(replicate_counts, dtype=np.float64)
        deviation = np.abs(ratios - value) / se  # (replicate, layer, head, column)
    deviation = np.where(np.isfinite(deviation), deviation, np.nan)
    axes = tuple(a + 1 for a in over)
    largest = np.fmax.reduce(np.where(np.isnan(deviation), -np.inf, deviation), axis=axes, keepdims=True)
    largest = np.where(np.isneginf(largest), np.nan, largest)  # (replicate, 1, 1, column)
    with warnings.catch_warnings():  # a column no head defines: NaN, said by the result
        warnings.simplefilter("ignore", RuntimeWarning)
        factor = np.nanquantile(largest, level, axis=0)  # (1, 1, column)
    factor = np.where(se > 0, factor, 0.0)  # an exact value's interval is the value
    low, high = value - factor * se, value + factor * se
    if bounds is not None:
        low, high = np.maximum(low, bounds[0]), np.minimum(high, bounds[1])
    undefined = np.isnan(value) | np.isnan(se) | np.isnan(factor)
    return np.where(undefined, np.nan, low), np.where(undefined, np.nan, high)
