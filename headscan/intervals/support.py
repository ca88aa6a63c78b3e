"""Whether to trust an interval: the support columns (units, effective units, the variance's df) and the thin rules.
"""

from __future__ import annotations

import numpy as np

from .methods import _replicates_of, _slabs, replicate_variances
from .moments import _TERM, bootstrap_weights, replicate_moments, unit_moments  # noqa: F401 (doctests)

__all__ = ["THIN_MIN_UNITS", "THIN_MAX_SHARE", "MIN_EFFECTIVE_UNITS", "MIN_VARIANCE_DF", "MIN_SPARSE_EVENNESS",
           "support", "effective_units", "variance_df", "thin", "thin_support"]

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
    total = moments[_TERM["abs_s"]]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(total > 0, moments[_TERM["max_abs_s"]] / total, np.nan)
    return moments[_TERM["contributing"]], share


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
    squares = moments[_TERM["ss"]]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(squares > 0, moments[_TERM["abs_s"]] ** 2 / np.where(squares > 0, squares, 1.0), np.nan)


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
    slabs = _slabs(shape, _replicates_of(replicate_sums, replicate_counts, replicate_power, shape))
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


def thin(n_eff, df, contributing, *, sparse=False, min_effective: float = MIN_EFFECTIVE_UNITS,
         min_df: float = MIN_VARIANCE_DF, min_evenness: float = MIN_SPARSE_EVENNESS) -> np.ndarray:
    """True where an interval should not be trusted, from the data's own heaviness.

    Flagged: the sum rests on fewer than `min_effective` effective units (`effective_units`; NaN, a sum of
    0, is flagged too), or the SE on fewer than `min_df` degrees of freedom (`variance_df`), or, for a
    `sparse` metric (one whose queries are picked by the text's content, such as ``induction`` and
    ``duplicate_token``: a few rare units can hold most of the population's sum without being in the sample),
    a sum spread less evenly than `min_evenness` of the contributing units.

    Parameters
    ----------
    n_eff, df, contributing : arrays of one shape
        `effective_units`, `variance_df`, and units with count > 0 (`support`).
    sparse : bool or bool array broadcastable to that shape

    Examples
    --------
    >>> thin(np.array([30.0, 3.0, 30.0, 12.0, np.nan]), np.array([20.0, 20.0, 2.0, 20.0, 20.0]),
    ...      np.array([30.0, 30.0, 30.0, 30.0, 30.0]), sparse=np.array([False, False, False, True, False])).tolist()
    [False, True, True, True, True]
    """
    n_eff, df, contributing = (np.asarray(x, dtype=np.float64) for x in (n_eff, df, contributing))
    flagged = ~(n_eff >= min_effective) | ~(df >= min_df)
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
