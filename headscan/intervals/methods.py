"""Interval methods: (low, high) for each ratio from the replicate totals, their power sums and the units' moments.

See the package docstring (`headscan.intervals`) for which method to use and why.
"""

from __future__ import annotations

import difflib
import numbers
import warnings

import numpy as np
from scipy import special

from ..errors import ConfigError
from .moments import MOMENT_INDEX, MOMENT_TERMS, REPLICATE_TERMS, bootstrap_weights, replicate_moments, unit_moments  # noqa: F401 (doctests)

__all__ = ["METHODS", "DEFAULT_METHOD", "interval", "nan_percentile", "standard_error", "replicate_variances",
           "order_quantile", "replicates_of", "slabs_of", "ratio_variances"]

METHODS = ("studentized", "studentized_symmetric", "bca", "percentile", "delta")
DEFAULT_METHOD = "studentized_symmetric"

def nan_percentile(values, q):
    """Percentiles over the leading axis skipping NaN, vectorised: np.nanpercentile's linear interpolation.

    Unlike np.nanpercentile, `q` may differ per column (BCa needs that). Non-finite values are skipped too
    (a replicate ratio is non-finite only when its count is 0).

    Parameters
    ----------
    values : array of shape (n, *shape)
    q : float or array broadcastable to `shape`
        Percent, 0 to 100.

    Returns
    -------
    numpy.ndarray of shape `shape`; NaN where a column has no finite value.

    Examples
    --------
    >>> nan_percentile(np.array([[1.0, np.nan], [2.0, np.nan], [np.nan, 5.0], [4.0, np.nan]]), 50)
    array([2., 5.])
    """
    values = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(values)
    ordered = np.sort(np.where(finite, values, np.nan), axis=0)  # NaN sorts last: a column's finite values lead
    n = finite.sum(0)
    fraction = np.broadcast_to(np.asarray(q, dtype=np.float64) / 100.0, n.shape)
    # numpy's virtual index for the linear method, written as numpy writes it (results agree to rounding)
    virtual = n * fraction + (1 - fraction) - 1
    last = np.maximum(n - 1, 0)
    below = np.clip(np.floor(virtual), 0, last).astype(np.intp)
    above = np.minimum(below + 1, last)
    gamma = np.where(virtual >= last, 0.0, np.clip(virtual - below, 0.0, 1.0))
    a = np.take_along_axis(ordered, below[None], 0)[0]
    b = np.take_along_axis(ordered, above[None], 0)[0]
    with np.errstate(invalid="ignore"):
        # numpy's lerp: from the nearer end, so that t = 1 gives b exactly
        point = np.where(gamma >= 0.5, b - (b - a) * (1 - gamma), a + (b - a) * gamma)
    return np.where(n > 0, point, np.nan)


_normal_cdf = special.ndtr


def _normal_quantile(p: np.ndarray) -> np.ndarray:
    """The standard normal's quantile: -inf at 0 and below, inf at 1 and above, NaN for NaN."""
    p = np.asarray(p, dtype=np.float64)
    return special.ndtri(np.clip(p, 0.0, 1.0))


def _influence_sums(value: np.ndarray, moments: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """sum U^2, sum U^3 with U_u = s_u - R c_u, and the size they are rounded against.

    U_u is proportional to unit u's empirical influence on R = S/C (the derivative of the ratio in the
    unit's weight is (s_u - R c_u) / C), so these expand into the power sums.
    """
    m, r = moments, value
    u2 = m[MOMENT_INDEX["ss"]] - 2 * r * m[MOMENT_INDEX["sc"]] + r * r * m[MOMENT_INDEX["cc"]]
    u3 = m[MOMENT_INDEX["sss"]] - 3 * r * m[MOMENT_INDEX["ssc"]] + 3 * r * r * m[MOMENT_INDEX["scc"]] - r**3 * m[MOMENT_INDEX["ccc"]]
    size = m[MOMENT_INDEX["ss"]] + r * r * m[MOMENT_INDEX["cc"]]
    return u2, u3, size


def _acceleration(value: np.ndarray, moments: np.ndarray) -> np.ndarray:
    """BCa's a = sum U^3 / (6 (sum U^2)^(3/2)) from the influence values U (Efron & Tibshirani 1993, 14.15)."""
    u2, u3, size = _influence_sums(value, moments)
    # Raw power sums cancel when every unit has nearly the same ratio; below this, sum U^3 is mostly rounding
    # noise (a off by up to ~1e-5), and a = 0 is the honest answer.
    spread = u2 > 1e-8 * size
    with np.errstate(invalid="ignore", divide="ignore"):
        a = u3 / (6 * np.where(spread, u2, 1.0) ** 1.5)
    return np.where(spread, a, 0.0)


def interval(value, replicate_sums, replicate_counts, moments, *, method: str, level: float = 0.95,
             replicate_power=None, bounds=None):
    """A confidence interval for each ratio R = S/C, vectorised over any trailing shape.

    Takes numpy arrays (or CPU tensors); only the accumulation helpers run on torch devices.

    Parameters
    ----------
    value : array of shape `shape`
        R = S / C (NaN where C is 0).
    replicate_sums, replicate_counts : arrays of shape (replicate, *shape), or None for ``"delta"``
        S*_b and C*_b, the weighted totals of each bootstrap replicate (``bootstrap_weights @ sums``).
    moments : array of shape (len(MOMENT_TERMS), *shape)
        From `unit_moments` / `combine_moments`, over the same units.
    method : {"studentized", "studentized_symmetric", "bca", "percentile", "delta"}
        ``"studentized"``: the bootstrap-t, and ``"studentized_symmetric"``: R +- t SE with t from |T*_b|
        (`_studentized` defines both); ``"bca"``: bias-corrected and accelerated percentiles (`_bca`);
        ``"percentile"``: the (1-level)/2 and (1+level)/2 percentiles of the finite replicate ratios
        R*_b = S*_b / C*_b; ``"delta"``: R +- z SE, the infinitesimal jackknife, no replicates (`_delta`).
        See the package docstring for which to use.
    level : float
        Coverage aimed at, between 0 and 1.
    replicate_power : array of shape (3, replicate, *shape), or None
        `replicate_moments` over the same units and weights; needed by the studentized methods only.
    bounds : (low, high) of arrays broadcastable to `shape`, or None
        The metric's own range (0 and 1 for a share of attention, 0 and inf for entropy): the ends are clipped
        into it. A studentized or delta interval can otherwise leave it; the percentile ends never do.

    Returns
    -------
    (low, high) : numpy arrays of shape `shape`
        NaN where undefined: count 0, no finite replicate, or (``"delta"``) fewer than two units.

    Examples
    --------
    >>> s = np.array([[3.0], [1.0], [4.0], [1.0], [5.0], [9.0], [2.0], [6.0]])
    >>> c = np.array([[5.0], [3.0], [5.0], [2.0], [8.0], [9.0], [7.0], [9.0]])
    >>> w = bootstrap_weights(range(8), 200, seed=0)
    >>> m = unit_moments(s, c)
    >>> value = m[MOMENT_TERMS.index("s")] / m[MOMENT_TERMS.index("c")]
    >>> low, high = interval(value, w @ s, w @ c, m, method="bca")
    >>> bool(low[0] < value[0] < high[0])
    True
    >>> low, high = interval(value, w @ s, w @ c, m, method="studentized", replicate_power=replicate_moments(w, s, c))
    >>> bool(low[0] < value[0] < high[0])
    True
    >>> interval(value, w @ s, w @ c, m, method="BCa")
    Traceback (most recent call last):
    ...
    headscan.errors.ConfigError: unknown interval method 'BCa'. Did you mean 'bca'? Available: studentized, studentized_symmetric, bca, percentile, delta
    """
    value, moments = _checked(value, moments, method, level)
    if method != "delta" and replicate_sums is not None and replicate_counts is not None:
        power = replicate_power if method.startswith("studentized") else None  # the others never read it
        slabs = slabs_of(value.shape, replicates_of(replicate_sums, replicate_counts, power, value.shape))
        if len(slabs) > 1 and (bounds is None or all(_broadcasts(b, value.shape) for b in bounds)):
            return _by_slabs(slabs, value, replicate_sums, replicate_counts, moments, power, method=method,
                             level=level, bounds=bounds)
    if method == "delta":
        low, high = _delta(value, moments, level)
    else:
        low, high = _from_replicates(value, replicate_sums, replicate_counts, moments, replicate_power,
                                     method=method, level=level)
    if bounds is not None:
        low, high = np.clip(low, bounds[0], bounds[1]), np.clip(high, bounds[0], bounds[1])
    undefined = ~(moments[MOMENT_INDEX["c"]] > 0) | ~np.isfinite(value)
    return np.where(undefined, np.nan, low), np.where(undefined, np.nan, high)


def _checked(value, moments, method: str, level) -> tuple[np.ndarray, np.ndarray]:
    """`value` and `moments` as float64 arrays, once the method, the level and the moments' shape are checked."""
    if method not in METHODS:
        close = difflib.get_close_matches(str(method).lower(), METHODS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown interval method {method!r}.{hint} Available: {', '.join(METHODS)}")
    if not isinstance(level, numbers.Real) or not 0 < level < 1:
        raise ConfigError(f"the interval level must be between 0 and 1 (0.95 for 95%), got {level!r}")
    value = np.asarray(value, dtype=np.float64)
    moments = np.asarray(moments, dtype=np.float64)
    if moments.shape != (len(MOMENT_TERMS), *value.shape):
        expected = (len(MOMENT_TERMS), *value.shape)
        raise ValueError(f"moments must have shape {expected} (term, *value.shape), got {moments.shape}")
    return value, moments


def _by_slabs(slabs, value, replicate_sums, replicate_counts, moments, power, *, method, level, bounds):
    """`interval` slab by slab of the leading axis (`slabs`), the ends put back together."""
    sums, counts = np.asarray(replicate_sums), np.asarray(replicate_counts)
    power = None if power is None else np.asarray(power)
    ends = [interval(value[rows], sums[:, rows], counts[:, rows], moments[:, rows], method=method,
                     level=level, replicate_power=None if power is None else power[:, :, rows],
                     bounds=None if bounds is None else tuple(
                         None if b is None else np.broadcast_to(b, value.shape)[rows] for b in bounds))
            for rows in slabs]
    return np.concatenate([low for low, _ in ends]), np.concatenate([high for _, high in ends])


def _z_ends(level: float) -> tuple[float, float]:
    """The standard normal quantiles at (1 - level) / 2 and (1 + level) / 2."""
    lower_tail = (1 - level) / 2
    return float(special.ndtri(lower_tail)), float(special.ndtri(1 - lower_tail))


def _delta(value, moments, level):
    """The delta method's ends: R +- z SE with SE^2 = n / (n - 1) * sum U^2 / C^2 over the n units (the
    infinitesimal jackknife; no replicates); NaN for fewer than two units."""
    z_low, z_high = _z_ends(level)
    u2, _, _ = _influence_sums(value, moments)
    units = moments[MOMENT_INDEX["units"]]
    with np.errstate(invalid="ignore", divide="ignore"):
        se = np.sqrt(np.maximum(u2, 0) * units / (units - 1)) / moments[MOMENT_INDEX["c"]]
    low, high = value + z_low * se, value + z_high * se
    return np.where(units > 1, low, np.nan), np.where(units > 1, high, np.nan)


def _from_replicates(value, replicate_sums, replicate_counts, moments, replicate_power, *, method, level):
    """The ends of the methods that read bootstrap replicates: percentile, bca and the studentized pair."""
    if replicate_sums is None or replicate_counts is None:
        raise ValueError(f"method {method!r} needs the replicate sums and counts; only 'delta' works without them")
    with np.errstate(invalid="ignore", divide="ignore"):
        replicates = np.asarray(replicate_sums, dtype=np.float64) / np.asarray(replicate_counts, dtype=np.float64)
    if replicates.shape[1:] != value.shape:
        raise ValueError(f"replicates must have shape (replicate, *{value.shape}), got {replicates.shape}")
    lower_tail = (1 - level) / 2
    if method == "percentile":
        return nan_percentile(replicates, 100 * lower_tail), nan_percentile(replicates, 100 * (1 - lower_tail))
    if method == "bca":
        return _bca(value, replicates, moments, _z_ends(level))
    if replicate_power is None:
        raise ValueError(f"method {method!r} needs replicate_power (replicate_moments of the same units)")
    replicate_power = np.asarray(replicate_power, dtype=np.float64)
    if replicate_power.shape != (len(REPLICATE_TERMS), *replicates.shape):
        raise ValueError(f"replicate_power must have shape {(len(REPLICATE_TERMS), *replicates.shape)} "
                         f"(term, replicate, *value.shape), got {replicate_power.shape}")
    return _studentized(value, replicates, np.asarray(replicate_counts, dtype=np.float64), replicate_power,
                        moments, level, symmetric=method == "studentized_symmetric")


# Replicate arrays are (replicate, *shape): 60 MB each for a 30-layer model, and every step of an interval makes
# temporaries of that size. Above glibc's mmap threshold each one is fresh pages from the kernel, faulted in anew
# (see headscan.models.chunked.BLOCK_BYTES), which was most of the intervals' time. So they are computed over
# slabs of the leading axis of `shape`, each replicate array within SLAB_BYTES; a cell's interval reads that
# cell alone, so the result is the same to the bit.
SLAB_BYTES = 8 << 20


def slabs_of(shape: tuple, n_replicates: int | None) -> list[slice]:
    """Slices of the leading axis of `shape` whose (replicate, ...) float64 arrays stay within `SLAB_BYTES`.

    One slab (no split) where the replicate arrays do not fit `shape` (`n_replicates` None, from
    `replicates_of`: the unsplit path says what is wrong), or where fewer than two cells follow the first axis: numpy would then sum a slab's replicates in
    another order than the whole array's (pairwise along a contiguous axis), and the last bits would change.

    >>> [(rows.start, rows.stop) for rows in slabs_of((30, 9, 140), 200)]  # 200 x 9 x 140 x 8 bytes: 2 MB a layer
    [(0, 4), (4, 8), (8, 12), (12, 16), (16, 20), (20, 24), (24, 28), (28, 30)]
    >>> slabs_of((), 200), slabs_of((6, 12), 200), slabs_of((10**6,), 200), slabs_of((10**6, 1), 200)
    ([slice(None, None, None)], [slice(0, 6, None)], [slice(None, None, None)], [slice(None, None, None)])
    """
    cells = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 0
    if n_replicates is None or cells < 2:
        return [slice(None)]
    rows = max(1, SLAB_BYTES // (8 * max(n_replicates, 1) * cells))
    return [slice(start, min(start + rows, shape[0])) for start in range(0, shape[0], rows)]


def replicates_of(replicate_sums, replicate_counts, replicate_power, shape: tuple) -> int | None:
    """The number of replicates, or None where sums, counts and power sums lack the shapes `shape` asks for."""
    sums = tuple(np.shape(replicate_sums))
    fits = (len(sums) == len(shape) + 1 and sums[1:] == tuple(shape) and tuple(np.shape(replicate_counts)) == sums
            and (replicate_power is None or tuple(np.shape(replicate_power)) == (len(REPLICATE_TERMS), *sums)))
    return sums[0] if fits else None


def _broadcasts(bound, shape: tuple) -> bool:
    """Whether a bound (None: none) broadcasts to `shape` without growing it."""
    if bound is None:
        return True
    try:
        return np.broadcast_shapes(np.shape(bound), shape) == tuple(shape)
    except ValueError:
        return False


# Power sums cancel when every unit has nearly the same ratio: a linearised sum of squares below this share of
# its terms is rounding noise, and 0 (no spread) is the honest answer.
_CANCELLATION = 1e-12


def _sum_of_squares(ratio, ss, sc, cc):
    """sum_u (s_u - ratio c_u)^2 from power sums (weighted or not); 0 where it is within rounding of 0."""
    with np.errstate(invalid="ignore", over="ignore"):
        # ss - 2 R sc + R^2 cc and ss + R^2 cc, in place on two temporaries: these arrays are (replicate, layer,
        # head, column), and fresh temporaries for each step were most of the intervals' time
        size = ratio * ratio * cc  # a new array of the broadcast shape
        squares = ratio * sc
        squares *= -2
        squares += ss
        squares += size
        size += ss
        size *= _CANCELLATION
    return np.where(squares > size, squares, 0.0)


def standard_error(value, moments) -> np.ndarray:
    """The linearised (infinitesimal jackknife) SE of R = S/C: sqrt(sum_u (s_u - R c_u)^2) / C, no n/(n-1).

    Examples
    --------
    >>> s, c = np.array([[1.0], [2.0], [6.0]]), np.array([[2.0], [2.0], [6.0]])
    >>> m = unit_moments(s, c)
    >>> se = standard_error(m[MOMENT_TERMS.index("s")] / m[MOMENT_TERMS.index("c")], m)  # R = 0.9, U = (-0.8, 0.2, 0.6)
    >>> bool(np.isclose(se[0], np.sqrt(0.64 + 0.04 + 0.36) / 10))
    True
    """
    m = np.asarray(moments, dtype=np.float64)
    squares = _sum_of_squares(np.where(np.isfinite(value), value, 0.0), m[MOMENT_INDEX["ss"]], m[MOMENT_INDEX["sc"]], m[MOMENT_INDEX["cc"]])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sqrt(squares) / m[MOMENT_INDEX["c"]]


def replicate_variances(replicate_sums, replicate_counts, replicate_power) -> np.ndarray:
    """Each replicate's own linearised variance of R*_b, (replicate, *shape): sum_u w_bu (s_u - R*_b c_u)^2 / C*_b^2.

    NaN where the replicate's count is 0. See `replicate_moments`.
    """
    counts = np.asarray(replicate_counts, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = np.asarray(replicate_sums, dtype=np.float64) / counts
    return ratio_variances(ratios, counts, replicate_power)


def ratio_variances(ratios, counts, replicate_power) -> np.ndarray:
    """`replicate_variances` from the replicates' ratios S*_b / C*_b themselves (NaN or inf where C*_b is 0)."""
    finite = np.isfinite(ratios)
    power = np.asarray(replicate_power, dtype=np.float64)
    squares = _sum_of_squares(np.where(finite, ratios, 0.0), power[0], power[1], power[2])
    with np.errstate(invalid="ignore", divide="ignore"):
        squares /= counts * counts  # squares is a new array: divided in place
    squares[~finite] = np.nan
    return squares


def order_quantile(values, q) -> np.ndarray:
    """Quantiles over the leading axis at position (n + 1) q among each column's n non-NaN values (1-based,
    linear between neighbours, held to the first and last); +-inf values sort at the ends and are kept.

    The position at which a statistic exchangeable with n replicates falls below the point with probability q
    (Hyndman & Fan 1996, type 6). Where interpolation touches an infinite neighbour the end is infinite.

    Examples
    --------
    >>> order_quantile(np.arange(1.0, 200.0)[:, None], 0.025)  # position 5
    array([5.])
    >>> order_quantile(np.array([[1.0], [2.0], [np.inf]]), 0.9).tolist()
    [inf]
    """
    values = np.asarray(values, dtype=np.float64)
    present = ~np.isnan(values)
    ordered = np.sort(values, axis=0)  # NaN sorts last, after +inf
    n = present.sum(0)
    position = np.clip((n + 1) * np.broadcast_to(np.asarray(q, dtype=np.float64), n.shape), 1, np.maximum(n, 1))
    below = np.floor(position).astype(np.intp)
    gamma = position - below
    above = np.minimum(below + 1, np.maximum(n, 1))
    a = np.take_along_axis(ordered, (below - 1)[None], 0)[0]
    b = np.take_along_axis(ordered, (above - 1)[None], 0)[0]
    with np.errstate(invalid="ignore"):
        point = np.where(gamma > 0, a + (b - a) * gamma, a)
    point = np.where(np.isinf(b) & (gamma > 0), b, point)
    point = np.where(np.isinf(a), a, point)
    return np.where(n > 0, point, np.nan)


def _studentized(value, replicates, replicate_counts, replicate_power, moments, level, *, symmetric):
    """The bootstrap-t ends (Efron & Tibshirani 1993, ch. 12.5).

    Each replicate's T*_b = (R*_b - R) / SE*_b with its own linearised SE*_b^2 = sum_u w_bu (s_u - R*_b c_u)^2
    / C*_b^2 (from `replicate_power`), and the interval [R - t_hi SE, R - t_lo SE] with SE^2 = sum_u U_u^2 / C^2
    and t_lo, t_hi the (1-level)/2 and (1+level)/2 quantiles of the T*_b at position (B + 1) q among the B finite
    replicates (exact for a statistic exchangeable with its replicates; numpy's default position, (B - 1) q + 1,
    lies a whole replicate inside and costs about a point of coverage at B = 200). `symmetric`: R +- t SE with t
    the level quantile of |T*_b| (Hall 1988), the same way. A replicate whose units all have one ratio has
    SE*_b = 0 and T*_b = +-inf (0 when R*_b = R); an end that comes out infinite is the extreme replicate ratio on
    its side. SE = 0 gives [R, R].
    """
    se = standard_error(value, moments)
    variances = ratio_variances(replicates, replicate_counts, replicate_power)
    with np.errstate(invalid="ignore", divide="ignore"):
        difference = replicates - value
        t = difference / np.sqrt(variances)
        t = np.where(variances > 0, t, np.where(difference == 0, 0.0, np.sign(difference) * np.inf))
    t = np.where(np.isfinite(replicates), t, np.nan)
    if symmetric:
        q = order_quantile(np.abs(t), level)
        t_low, t_high = -q, q
    else:
        t_low, t_high = order_quantile(t, (1 - level) / 2), order_quantile(t, (1 + level) / 2)
    with np.errstate(invalid="ignore"):
        low, high = value - t_high * se, value - t_low * se
    finite = np.where(np.isfinite(replicates), replicates, np.nan)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: undefined anyway
        low = np.where(np.isneginf(low), np.nanmin(finite, 0), low)
        high = np.where(np.isposinf(high), np.nanmax(finite, 0), high)
    no_spread = se == 0
    return np.where(no_spread, value, low), np.where(no_spread, value, high)


def _bca(value, replicates, moments, z_ends):
    """BCa's ends: the replicate percentiles at the levels that z0 and a move `z_ends` to (Efron 1987).

    The percentiles at Phi(z0 + (z0 + z) / (1 - a (z0 + z))) for z = Phi^-1 of the (1-level)/2 and (1+level)/2
    levels, where z0 = Phi^-1 of the share of replicates below R (ties count half; clipped to
    [1/(2B), 1 - 1/(2B)] so that it stays finite) and the acceleration a = sum U^3 / (6 (sum U^2)^(3/2)) with the
    influence U_u = s_u - R c_u (Efron & Tibshirani 1993, ch. 14); when 1 - a (z0 + z) <= 0 the end goes to the
    extreme replicate.
    """
    finite = np.isfinite(replicates)
    n = np.maximum(finite.sum(0), 1)
    below = (finite & (replicates < value)).sum(0) + 0.5 * (finite & (replicates == value)).sum(0)
    z0 = _normal_quantile(np.clip(below / n, 0.5 / n, 1 - 0.5 / n))
    a = _acceleration(value, moments)
    ends = []
    for z in z_ends:
        shifted = z0 + z
        denominator = 1 - a * shifted
        with np.errstate(invalid="ignore", divide="ignore"):
            moved = z0 + shifted / np.where(denominator > 0, denominator, 1.0)
            # past the pole of the correction the end goes to the extreme replicate on its side
            adjusted = np.where(denominator > 0, moved, np.sign(shifted) * np.inf)
        ends.append(nan_percentile(replicates, 100 * _normal_cdf(adjusted)))
    return ends[0], ends[1]

