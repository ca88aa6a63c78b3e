"""One-sided p-values that a head's value lies beyond what a head that learned nothing scores.

- `t_p_value`: against a null *range* [null_low, null_high] (a point where they are equal, such as uniform
  attention's ``chance``), from the row's estimate, its linearised standard error and the bootstrap's degrees of
  freedom of that SE (`standard_error`, `variance_df`, as the studentized intervals use them): the chance that a
  t-distributed statistic lies as far beyond the null's end on the striking side. `interval_se` recovers the SE
  from a table's interval where no SE was recorded.
- `bootstrap_t_p_value`: the same test read off the bootstrap's studentized replicates instead of Student's t,
  where the sweep still holds them.
- `rank_p_value`: against an *empirical* null, a sample of values that heads which learned nothing score (say,
  the heads of random-init controls at the same layer depth): (1 + #{null values at least as striking}) / (1 + m),
  the permutation p-value with its +1, exact for a value exchangeable with the sample.

Which p-value? Measured by ``benchmarks/discoveries_calibration.py`` (200 heads x 20 corpora a cell, 1,000
replicates; ``tests/test_discoveries.py`` checks the first row), units' ratios Beta-distributed around the null
with concentration 20: P(p <= 0.05) and P(p <= 0.01) for a true null, nominally 0.05 and 0.01.

==========================  ===============  ===============
units' ratios, units        `t_p_value`      bootstrap-t
==========================  ===============  ===============
symmetric (0.5), 30         0.051, 0.009     0.046, 0.009
right-skewed (0.1), 30      0.030, 0.002     0.045, 0.007
left-skewed (0.9), 30       0.077, 0.024     0.056, 0.016
left-skewed (0.9), 100      0.056, 0.013     0.045, 0.008
left-skewed (0.9), 318      0.054, 0.013     0.048, 0.010
==========================  ===============  ===============

Student's t is right where the ratio is near-symmetric; for a metric near its ceiling tested on the high side it
is anti-conservative, badly on 30 units (the SE grows with the distance from the ceiling, so the t statistic's
upper tail is long) and by about a third at the 1% level even on EWT dev's 318 documents. The bootstrap-t reads
that skew off the replicates and is within Monte Carlo error (about 0.005 and 0.002) from 100 units on.

A rank p-value's smallest value is 1 / (m + 1), and a bootstrap-t one's 1 / (B + 1): see
`headscan.intervals.discoveries` for what that means for a false-discovery correction.

References
----------
Phipson, B. & Smyth, G. K. (2010). Permutation p-values should never be zero. Stat. Appl. Genet. Mol. Biol. 9(1).

This module runs no model and knows nothing of tables: it takes arrays.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from ..errors import ConfigError
from .methods import ratio_variances, standard_error

__all__ = ["SIDES", "t_p_value", "bootstrap_t_p_value", "rank_p_value", "interval_se", "check_side"]

SIDES = ("high", "low")  # the striking side of a metric: where its values say "more than chance"


def _student_sf(t, df) -> np.ndarray:
    """P(T > t) for Student's t with `df` degrees of freedom (df > 0; inf is the normal), vectorised; NaN where t
    or df is NaN or df is not positive. scipy's `stdtr` (the incomplete beta) and `ndtr` (erfc: exact far out).

    >>> [round(float(p), 6) for p in _student_sf(np.array([0.0, 2.0, -2.0, 2.0]), np.array([5.0, 5.0, 5.0, np.inf]))]
    [0.5, 0.05097, 0.94903, 0.02275]
    """
    t, df = np.broadcast_arrays(np.asarray(t, dtype=np.float64), np.asarray(df, dtype=np.float64))
    with np.errstate(invalid="ignore"):
        finite = np.where(df > 0, df, np.nan)  # stdtr is NaN for NaN or non-positive df
        return np.where(np.isposinf(df), special.ndtr(-t), special.stdtr(np.where(np.isposinf(df), 1.0, finite), -t))


def check_side(side) -> np.ndarray:
    side = np.asarray(side, dtype=object)
    bad = sorted({str(s) for s in np.ravel(side)} - set(SIDES))
    if bad:
        raise ConfigError(f"the striking side must be 'high' or 'low', got {bad[0]!r}")
    return side == "high"


def t_p_value(value, se, df, null_low, null_high=None, *, side="high") -> np.ndarray:
    """One-sided p-values that each value lies beyond its null's end on the striking side, from a t statistic.

    With side "high": p = P(T_df > (value - null_high) / se); with "low": p = P(T_df < (value - null_low) / se),
    T_df Student's t on the row's `df` (`variance_df`: the bootstrap's degrees of freedom of the SE; inf is the
    normal). A range null is tested at its far end, so p is at most what a point null there gives. Where the SE
    is 0 the value is exact: p is 0 beyond the end and 1 otherwise. NaN where value, SE, df or the null's end is
    NaN, or df is not positive: such a row is not a test.

    Parameters
    ----------
    value, se, df : arrays of one shape
        The estimate, its standard error (`standard_error`) and the SE's degrees of freedom.
    null_low, null_high : arrays broadcastable to it
        The null's range; `null_high` defaults to `null_low` (a point null).
    side : "high", "low", or an array of them broadcastable to it

    Examples
    --------
    >>> t_p_value(np.array([0.30, 0.12, 0.10]), np.array([0.05, 0.05, 0.0]), 20.0, 0.10).round(4).tolist()
    [0.0004, 0.3467, 1.0]
    >>> t_p_value(np.array([0.5]), np.array([0.1]), np.inf, 0.9, side="low").round(5).tolist()  # 4 SE below
    [3e-05]
    """
    high = check_side(side)
    value, se, df = (np.asarray(v, dtype=np.float64) for v in (value, se, df))
    null_low = np.asarray(null_low, dtype=np.float64)
    null_high = null_low if null_high is None else np.asarray(null_high, dtype=np.float64)
    end = np.where(high, null_high, null_low)
    value, se, df, end, high = np.broadcast_arrays(value, se, df, end, high)
    tested = ~(np.isnan(value) | np.isnan(se) | np.isnan(end)) & (df > 0)
    # the tail only where the row is a test: a table's untested rows (no null) cost nothing
    value, se, df, end, high = value[tested], se[tested], df[tested], end[tested], high[tested]
    beyond = np.where(high, value - end, end - value)  # > 0 on the striking side
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, beyond / np.where(se > 0, se, 1.0), np.where(beyond > 0, np.inf, -np.inf))
    p = np.full(tested.shape, np.nan)
    p[tested] = _student_sf(t, df)
    return p


def bootstrap_t_p_value(value, replicate_sums, replicate_counts, replicate_power, moments, null_low,
                        null_high=None, *, side="high") -> np.ndarray:
    """One-sided bootstrap-t p-values: the share of replicates' T*_b at least as far out as the row's t.

    t = (R - end) / SE as in `t_p_value`, with the end of the null on the striking side, and T*_b = (R*_b - R) /
    SE*_b the studentized replicates of the ``"studentized"`` interval (`headscan.intervals.interval`); p =
    (1 + #{T*_b >= t}) / (1 + B) on the high side, (1 + #{T*_b <= t}) / (1 + B) on the low side, over the B
    finite replicates. It reads the statistic's own skew where `t_p_value` assumes Student's t, so it stays
    calibrated where units' ratios are skewed and few (30 units near a ceiling), but its smallest value is
    1 / (B + 1): with 200 replicates it cannot pass a false-discovery correction over thousands of rows unless
    hundreds of them are discoveries. p is at most 0.025 exactly when the equal-tailed studentized interval
    (with quantiles at (B + 1) q) lies beyond the null's end, up to the interpolation between replicates.

    Parameters
    ----------
    value : array of shape `shape`
    replicate_sums, replicate_counts : arrays of shape (replicate, *shape)
    replicate_power : array of shape (3, replicate, *shape)
        `replicate_moments` over the same units and weights.
    moments : array of shape (len(MOMENT_TERMS), *shape)
    null_low, null_high, side
        As in `t_p_value`.

    Examples
    --------
    >>> from headscan.intervals import bootstrap_weights, replicate_moments, unit_moments
    >>> rng = np.random.default_rng(0)
    >>> c = rng.integers(20, 60, (30, 2)).astype(float)
    >>> s = c * rng.beta(2.0, 18.0, (30, 2))  # shares around 0.1
    >>> w = bootstrap_weights(range(30), 200, seed=0)
    >>> m = unit_moments(s, c)
    >>> value = s.sum(0) / c.sum(0)
    >>> p = bootstrap_t_p_value(value, w @ s, w @ c, replicate_moments(w, s, c), m, [0.05, 0.1])
    >>> p.round(3).tolist()
    [0.005, 0.299]
    """
    high = check_side(side)
    value = np.asarray(value, dtype=np.float64)
    null_low = np.asarray(null_low, dtype=np.float64)
    null_high = null_low if null_high is None else np.asarray(null_high, dtype=np.float64)
    end = np.where(high, null_high, null_low)
    se = standard_error(value, moments)
    counts = np.asarray(replicate_counts, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        replicates = np.asarray(replicate_sums, dtype=np.float64) / counts
        variances = ratio_variances(replicates, counts, replicate_power)
        difference = replicates - value
        # as the studentized interval: a replicate with no spread is +-inf, or 0 where it equals R
        t_star = np.where(variances > 0, difference / np.sqrt(variances),
                          np.where(difference == 0, 0.0, np.sign(difference) * np.inf))
        t = np.where(se > 0, (value - end) / np.where(se > 0, se, 1.0),
                     np.where(value > end, np.inf, np.where(value < end, -np.inf, 0.0)))
    finite = np.isfinite(replicates)
    beyond = np.where(high, t_star >= t, t_star <= t) & finite
    n = finite.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = (1.0 + beyond.sum(0)) / (1.0 + n)
    return np.where(np.isnan(value) | np.isnan(end) | (n == 0), np.nan, p)


def rank_p_value(value, null_values, *, side="high") -> np.ndarray:
    """Permutation p-values against an empirical null: (1 + #{null values at least as striking}) / (1 + m).

    m counts the non-NaN null values of each row. For a value exchangeable with them (a head that learned
    nothing, like the control heads) P(p <= k / (m + 1)) = k / (m + 1): the +1 keeps the test exact and no
    p-value 0 (Phipson & Smyth 2010). Ties count against the row. NaN where the value is NaN or m is 0.

    Parameters
    ----------
    value : array of shape (n,)
    null_values : array of shape (n, m) (each row its own sample, NaN-padded) or (m,) (one sample for all)
    side : "high", "low", or an array of shape (n,) of them

    Examples
    --------
    >>> rank_p_value(np.array([0.9, 0.5, np.nan]), np.array([0.1, 0.2, 0.5, 0.7])).tolist()
    [0.2, 0.6, nan]
    >>> rank_p_value(np.array([0.05]), np.array([[0.1, 0.2, np.nan]]), side="low").tolist()
    [0.3333333333333333]
    """
    high = check_side(side)
    value = np.asarray(value, dtype=np.float64)
    null = np.asarray(null_values, dtype=np.float64)
    null = np.broadcast_to(null, (len(value), null.shape[-1])) if null.ndim == 1 else null
    if null.shape[0] != len(value):
        raise ValueError(f"null_values has {null.shape[0]} rows for {len(value)} values")
    present = ~np.isnan(null)
    high = np.broadcast_to(high, value.shape)[:, None]
    as_striking = np.where(high, null >= value[:, None], null <= value[:, None]) & present
    m = present.sum(1)
    p = (1.0 + as_striking.sum(1)) / (1.0 + m)
    return np.where(np.isnan(value) | (m == 0), np.nan, p)


def interval_se(value, low, high, df, *, level: float = 0.95) -> np.ndarray:
    """The SE a symmetric t-type interval implies: its wider half-width over t_{df, (1 + level) / 2}.

    For a table that records the interval but no SE. The wider half, since the interval is clipped into the
    metric's range on one side at most. It is the SE for which a t-test at the interval's end gives p equal to
    (1 - level) / 2, so a row's p-value agrees with whether its interval holds the null; the bootstrap-t's own
    quantile can differ from Student's, so where the sweep has the moments use `standard_error` instead.

    >>> float(np.round(interval_se(0.5, 0.4, 0.6, np.inf), 4))  # 0.1 / 1.96
    0.051
    """
    value, low, high, df = (np.asarray(v, dtype=np.float64) for v in (value, low, high, df))
    half = np.fmax(value - low, high - value)
    with np.errstate(invalid="ignore", divide="ignore"):
        return half / _student_quantile((1 + level) / 2, df)


def _student_quantile(probability: float, df) -> np.ndarray:
    """t_{df, probability} (inf df: the normal's), NaN where df is NaN or not positive: scipy's `stdtrit`, `ndtri`.

    >>> _student_quantile(0.975, np.array([np.inf, 12.0, 0.0])).round(4).tolist()
    [1.96, 2.1788, nan]
    """
    df = np.asarray(df, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        finite = np.where(np.isposinf(df), 1.0, np.where(df > 0, df, np.nan))
        return np.where(np.isposinf(df), special.ndtri(probability), special.stdtrit(finite, probability))
