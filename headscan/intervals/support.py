"""Whether to trust an interval: the support columns (units, effective units, the variance's df) and the thin rules.
"""

from __future__ import annotations

import numpy as np

from .methods import replicate_variances, replicates_of, slabs_of
from .moments import MOMENT_INDEX, bootstrap_weights, replicate_moments, unit_moments  # noqa: F401 (doctests)

__all__ = ["THIN_MIN_UNITS", "THIN_MAX_SHARE", "MIN_EFFECTIVE_UNITS", "MIN_VARIANCE_DF", "MIN_SPARSE_EVENNESS",
           "BOUND_WIDTH", "support", "effective_units", "variance_df", "at_bound", "thin", "thin_support"]

# thin_support: an interval resting on fewer contributing units, or with one unit holding a larger share of
# sum |s_u|, is flagged. The numbers behind them are in thin_support's docstring.
THIN_MIN_UNITS = 15
THIN_MAX_SHARE = 0.25


def support(moments) -> tuple[np.ndarray, np.ndarray]:
    """How many units an interval rests on: (contributing units, largest unit's share of sum |s_u|).

    The share is max |s_u| / sum |s_u|, NaN where every s_u is 0.

    Examples
    --------
    >>> contributing, share = support(unit_moments(np.array([[1.0], [3.0], [0.0]]), np.array([[2.0], [4.0], [0.0]])))
    >>> contributing.tolist(), share.tolist()
    ([2.0], [0.75])
    """
    moments = np.asarray(moments, dtype=np.float64)
    total = moments[MOMENT_INDEX["abs_s"]]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(total > 0, moments[MOMENT_INDEX["max_abs_s"]] / total, np.nan)
    return moments[MOMENT_INDEX["contributing"]], share


def effective_units(moments) -> np.ndarray:
    """Kish's effective number of units of the sum, n_eff = (sum_u |s_u|)^2 / sum_u s_u^2; NaN where every s_u is 0.

    Between 1 (one unit holds the whole sum) and the number of units with s_u != 0 (all hold the same);
    read from the power sums ``abs_s`` and ``ss``, so it merges exactly.

    Examples
    --------
    >>> effective_units(unit_moments(np.array([[1.0, 0.0], [1.0, 0.0], [2.0, 0.0]]), np.ones((3, 2)))).tolist()
    [2.6666666666666665, nan]
    """
    moments = np.asarray(moments, dtype=np.float64)
    squares = moments[MOMENT_INDEX["ss"]]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(squares > 0, moments[MOMENT_INDEX["abs_s"]] ** 2 / np.where(squares > 0, squares, 1.0), np.nan)


def variance_df(replicate_sums, replicate_counts, replicate_power) -> np.ndarray:
    """The bootstrap's degrees of freedom of the variance, 2 mean(V*)^2 / var(V*) over the finite replicates.

    V*_b is each replicate's own linearised variance (`replicate_variances`). A scaled chi-square with d degrees
    of freedom has exactly this ratio d (Satterthwaite 1946), so it says on how many units' worth of spread an
    SE rests, as the bootstrap sees it: for n units of one count about 2 (sum U^2)^2 / sum U^4, which is 2n/3
    for normal U (Poisson weights vary sum_u w_u U_u^2 by sum U^4, uncentred), and near 1 when one or two
    units make all the spread, by their residual U_u or by a count that moves C*_b. NaN with fewer than two
    finite replicates; inf where no replicate varies.

    Examples
    --------
    >>> s = np.arange(1.0, 31.0)[:, None]
    >>> w = bootstrap_weights(range(30), 200, seed=0)
    >>> float(np.round(variance_df(w @ s, w @ np.ones_like(s), replicate_moments(w, s, np.ones_like(s)))[0]))
    31.0
    """
    shape = tuple(np.shape(replicate_sums))[1:]
    slabs = slabs_of(shape, replicates_of(replicate_sums, replicate_counts, replicate_power, shape))
    if len(slabs) > 1:  # small temporaries, as `interval`
        sums, counts, power = (np.asarray(x) for x in (replicate_sums, replicate_counts, replicate_power))
        return np.concatenate([variance_df(sums[:, rows], counts[:, rows], power[:, :, rows]) for rows in slabs])
    variances = replicate_variances(replicate_sums, replicate_counts, replicate_power)
    finite = np.isfinite(variances)
    n = finite.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(finite, variances, 0.0).sum(0) / n
        spread = (np.where(finite, variances - mean, 0.0) ** 2).sum(0) / n
        df = 2 * mean * mean / spread
    return np.where(n >= 2, np.where(spread > 0, df, np.inf), np.nan)


# thin: the thresholds of the support rule for the studentized interval (see its docstring for the numbers).
MIN_EFFECTIVE_UNITS = 5.0
MIN_VARIANCE_DF = 4.0
MIN_SPARSE_EVENNESS = 0.8
# thin: an interval this narrow (a share of the metric's range) that reaches its bound is at the bound, where a
# low df means that the units agree, not that the SE rests on few of them.
BOUND_WIDTH = 0.01


def at_bound(value, low, high, bounds, *, width: float = BOUND_WIDTH) -> np.ndarray:
    """True where a value sits at an end of its metric's range: its interval is at most `width` of the range wide
    and the end lies within one interval width of the value.

    `bounds` is (low end, high end) of the range, each broadcastable to the value's shape; an infinite end is
    never reached, and where either end is infinite `width` is taken as an absolute width. NaN is never at a
    bound.

    >>> at_bound(np.array([0.99997, 0.6, 0.5, 0.001]), np.array([0.99983, 0.45, 0.49, 0.0]),
    ...          np.array([1.0, 1.0, 0.51, 0.003]), (0.0, 1.0)).tolist()
    [True, False, False, True]
    """
    value, low, high = (np.asarray(x, dtype=np.float64) for x in (value, low, high))
    floor, ceiling = (np.asarray(b, dtype=np.float64) for b in bounds)
    span = ceiling - floor
    allowed = width * np.where(np.isfinite(span), span, 1.0)
    spread = high - low
    with np.errstate(invalid="ignore"):
        narrow = spread <= allowed
        near = (np.isfinite(floor) & (value - floor <= spread)) | (np.isfinite(ceiling) & (ceiling - value <= spread))
    return narrow & near


def thin(n_eff, df, contributing, *, sparse=False, min_effective: float = MIN_EFFECTIVE_UNITS,
         min_df: float = MIN_VARIANCE_DF, min_evenness: float = MIN_SPARSE_EVENNESS, value=None, low=None,
         high=None, bounds=None) -> np.ndarray:
    """True where an interval should not be trusted, from the data's own heaviness.

    Flagged: the sum rests on fewer than `min_effective` effective units (`effective_units`; NaN, a sum of
    0, is flagged too), or the SE on fewer than `min_df` degrees of freedom (`variance_df`), or, for a
    `sparse` metric (one whose queries are picked by the text's content, such as ``induction`` and
    ``duplicate_token``: a few rare units can hold most of the population's sum without being in the sample),
    a sum spread less evenly than `min_evenness` of the contributing units.

    Ceiling-aware, where `value`, `low`, `high` and `bounds` are given: a value at an end of its metric's range
    (`at_bound`: its interval at most `BOUND_WIDTH` of the range wide and reaching the end) is not flagged for a
    low df. There the units agree: a unit holding a share p of the count lies within the interval's width / p of
    the end, since it moves the value by p times its own distance; almost every unit's residual is 0, so the
    bootstrap's variance rests on the one or two that differ slightly, and its df is low for lack of variance,
    not of units (minilm's L0H2 ``positional_prev`` on EWT dev: 0.99997 [0.99983, 1], 318 documents, 95
    effective, df 1.9). The effective units and, for a sparse metric, the evenness are still asked of it.

    Parameters
    ----------
    n_eff, df, contributing : arrays of one shape
        `effective_units`, `variance_df`, and units with count > 0 (`support`).
    sparse : bool or bool array broadcastable to that shape
    value, low, high : arrays of that shape, optional
        The value and its interval.
    bounds : (low end, high end), each broadcastable to that shape, optional
        The metric's range (0 and 1 for a share of attention); without it no row is at a bound.

    Examples
    --------
    >>> thin(np.array([30.0, 3.0, 30.0, 12.0, np.nan]), np.array([20.0, 20.0, 2.0, 20.0, 20.0]),
    ...      np.array([30.0, 30.0, 30.0, 30.0, 30.0]), sparse=np.array([False, False, False, True, False])).tolist()
    [False, True, True, True, True]
    >>> ceiling = dict(value=np.array([0.99997, 0.99997, 0.6]), low=np.array([0.99983, 0.99983, 0.45]),
    ...                high=np.array([1.0, 1.0, 1.0]))
    >>> thin(np.array([95.5, 3.0, 95.5]), np.array([1.9, 1.9, 1.9]), 318.0, bounds=(0.0, 1.0), **ceiling).tolist()
    [False, True, True]
    """
    n_eff, df, contributing = (np.asarray(x, dtype=np.float64) for x in (n_eff, df, contributing))
    few_df = ~(df >= min_df)
    if bounds is not None and value is not None and low is not None and high is not None:
        few_df &= ~at_bound(value, low, high, bounds)
    flagged = ~(n_eff >= min_effective) | few_df
    return flagged | (np.asarray(sparse, dtype=bool) & ~(n_eff >= min_evenness * contributing))


def thin_support(moments, *, min_units: int = THIN_MIN_UNITS, max_share: float = THIN_MAX_SHARE) -> np.ndarray:
    """True where an interval rests on too few units to be trusted.

    Flagged: fewer than `min_units` contributing units, or one unit holding more than `max_share` of
    sum |s_u| (see `support`).

    The thresholds come from ``experiments/interval_simulation.py`` (BCa, 200 replicates), pooling the
    scenarios whose problem the sample itself shows (light, few, sparse, clustered resampled by document;
    24,000 intervals):

    =====================  =====  =====  =====  =====  =====  =====
    contributing units      < 5   5-9    10-14  15-29  30-99  >= 100
    coverage                0.78  0.86   0.92   0.92   0.93   0.94
    =====================  =====  =====  =====  =====  =====  =====

    =====================  =====  ========  =========  ========  =====
    largest unit's share   < 0.1  0.1-0.2   0.2-0.25   0.25-0.5  >= 0.5
    coverage                0.94  0.92      0.90       0.89      0.84
    =====================  =====  ========  =========  ========  =====

    With these thresholds the unflagged intervals of every such scenario and size covered at least 0.91
    (0.913 with 16 documents, 0.919 with about 32 contributing units, 0.927-0.947 otherwise), and the
    flagged ones 0.885. A minimum of 10 units instead left 0.884 unflagged in the few
    scenario with 100 segments (about 8 contributing units each).

    What it cannot flag: a rare kind of unit missing from the sample. On the induction-like population
    (0.4% of segments carry 46% of the sum) the samples whose interval misses are those that lack such
    units, and they look *better* supported, so unflagged coverage is lower than overall: 0.20 against 0.52
    with 100 segments, 0.42 against 0.77 with 400. Flagged intervals over-cover there.

    Examples
    --------
    >>> s = np.arange(1.0, 41.0)[:, None]
    >>> thin_support(unit_moments(s, s + 1)).tolist(), thin_support(unit_moments(s[:5], s[:5] + 1)).tolist()
    ([False], [True])
    """
    contributing, share = support(moments)
    return (contributing < min_units) | (share > max_share)
