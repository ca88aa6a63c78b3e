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

from .methods import SLAB_BYTES

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
    value = np.asarray(value, dtype=np.float64)
    se = np.broadcast_to(np.asarray(se, dtype=np.float64), value.shape)
    sums, counts = np.asarray(replicate_sums), np.asarray(replicate_counts)
    last = value.ndim - 1
    # columns apart, in slabs whose replicate arrays stay within SLAB_BYTES (as `interval`'s): a column's
    # factor reads that column alone, so the result is the same to the bit, with temporaries a fraction the size
    width = SLAB_BYTES // (8 * max(sums[..., 0].size, 1)) if sums.shape[1:] == value.shape and value.ndim else 0
    if last not in over and 0 < width < value.shape[-1]:
        ends = (None if bounds is None else np.broadcast_to(bounds[0], value.shape),
                None if bounds is None else np.broadcast_to(bounds[1], value.shape))
        parts = [_joint(value[..., k], sums[..., k], counts[..., k], se[..., k], level,
                        None if bounds is None else (ends[0][..., k], ends[1][..., k]), over)
                 for k in (slice(i, i + width) for i in range(0, value.shape[-1], width))]
        return np.concatenate([low for low, _ in parts], -1), np.concatenate([high for _, high in parts], -1)
    return _joint(value, sums, counts, se, level, bounds, over)


def _joint(value, replicate_sums, replicate_counts, se, level, bounds, over):
    with np.errstate(invalid="ignore", divide="ignore"):
        deviation = np.asarray(replicate_sums, dtype=np.float64) / np.asarray(replicate_counts, dtype=np.float64)
        deviation -= value  # in place: |R*_b - R| / SE, (replicate, layer, head, column)
        np.abs(deviation, out=deviation)
        deviation /= se
    deviation[~np.isfinite(deviation)] = -np.inf  # an undefined head takes no part in the largest
    largest = deviation.max(axis=tuple(a + 1 for a in over), keepdims=True)
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
