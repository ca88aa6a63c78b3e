"""The one-pass sums behind every interval: Poisson bootstrap weights, units' power sums, replicates' power sums.

Each is a sum over units (or a maximum), so windows, batches and shards add up to the whole exactly. Numpy or
torch (any device): the sweep accumulates them where the model runs.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from ..errors import ConfigError

__all__ = ["MOMENT_TERMS", "REPLICATE_TERMS", "bootstrap_weights", "unit_moments", "combine_moments",
           "replicate_moments", "add_product", "MOMENT_INDEX"]

# The terms of `unit_moments`, in order along its leading axis. Every term is a sum over units except the
# last, the largest |s_u|, which combines by max. All are zero for no units, so zeros start an accumulator.
MOMENT_TERMS = (
    "units",  # number of units (those with count 0 too: they are resampled like any other)
    "contributing",  # units with count > 0
    "s",  # sum s_u
    "c",  # sum c_u
    "ss",  # sum s_u^2
    "sc",  # sum s_u c_u
    "cc",  # sum c_u^2
    "sss",  # sum s_u^3
    "ssc",  # sum s_u^2 c_u
    "scc",  # sum s_u c_u^2
    "ccc",  # sum c_u^3
    "abs_s",  # sum |s_u|
    "max_abs_s",  # max |s_u| (not a sum)
)
MOMENT_INDEX = {name: i for i, name in enumerate(MOMENT_TERMS)}

# The terms of `replicate_moments`, in order along its leading axis: per replicate b, sums over units of w_bu times
# s_u^2, s_u c_u and c_u^2. With S*_b and C*_b they give each replicate's own linearised variance (studentized).
REPLICATE_TERMS = ("ss", "sc", "cc")


def bootstrap_weights(unit_index, n_replicates: int, seed: int) -> np.ndarray:
    """Poisson(1) resampling weights, (replicate, unit), each unit's column drawn from (seed, unit index).

    Keyed by the unit, not by its batch, so intervals depend neither on batch size nor on order, and shards
    of a corpus swept apart draw the weights a single sweep would. Repeat a document's index for each of its
    segments to resample documents.

    Parameters
    ----------
    unit_index : sequence of int
        Index of each unit (a 1-d numpy array or torch tensor will do).
    n_replicates : int
        Number of bootstrap replicates, B >= 0.
    seed : int
        Non-negative seed, combined with each unit index as ``np.random.default_rng([seed, index])``.

    Returns
    -------
    numpy.ndarray
        float64, shape (n_replicates, len(unit_index)).

    Examples
    --------
    >>> w = bootstrap_weights([0, 1, 7], 200, seed=0)
    >>> w.shape, w.dtype.name
    ((200, 3), 'float64')
    >>> bool((bootstrap_weights([7], 200, seed=0)[:, 0] == w[:, 2]).all())  # a unit's column is its own
    True
    """
    if not isinstance(n_replicates, (int, np.integer)) or n_replicates < 0:
        raise ConfigError(f"the number of bootstrap replicates must be a whole number >= 0, got {n_replicates!r}")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"the bootstrap seed must be a whole number >= 0, got {seed!r}")
    weights = np.zeros((n_replicates, len(unit_index)), dtype=np.float64)
    for column, index in enumerate(unit_index):
        weights[:, column] = np.random.default_rng([seed, int(index)]).poisson(1.0, n_replicates)
    return weights


def _namespace(array):
    """numpy, or torch for a torch tensor: the one place where arrays are stacked or maxed over an axis."""
    if type(array).__module__.split(".")[0] == "torch":
        return sys.modules["torch"]
    return np


def unit_moments(sums, counts):
    """The power sums of `MOMENT_TERMS` over the units on the leading axis, (term, *shape).

    Each row of `sums` and `counts` must be one resampling unit: to resample documents, add up the segments
    of each document first. Plain arithmetic, so numpy arrays and torch tensors (any device) both work;
    use float64, since third powers of sums of hundreds of queries lose digits in float32.

    Parameters
    ----------
    sums, counts : array of shape (unit, *shape)
        s_u and c_u of each unit.

    Returns
    -------
    array of shape (len(MOMENT_TERMS), *shape), the same kind as `sums`
        Sums over units of 1, [c_u > 0], s, c, s^2, sc, c^2, s^3, s^2 c, s c^2, c^3, |s|, and max |s|.

    Examples
    --------
    >>> m = unit_moments(np.array([[2.0], [0.0], [3.0]]), np.array([[4.0], [0.0], [5.0]]))
    >>> dict(zip(MOMENT_TERMS, m[:, 0].tolist()))["contributing"], m[MOMENT_TERMS.index("sc"), 0]
    (2.0, np.float64(23.0))
    """
    if tuple(sums.shape) != tuple(counts.shape):
        raise ValueError(f"sums and counts must have the same shape (unit, ...), "
                         f"got {tuple(sums.shape)} and {tuple(counts.shape)}")
    s, c = sums, counts
    one = c * 0 + 1  # same kind, dtype and device as the input
    terms = [one, one * (c > 0), s, c, s * s, s * c, c * c, s * s * s, s * s * c, s * c * c, c * c * c, abs(s)]
    xp = _namespace(s)
    largest = xp.amax(abs(s), 0) if s.shape[0] else abs(s).sum(0)  # no units: 0, the identity of max
    return xp.stack([term.sum(0) for term in terms] + [largest])


def combine_moments(a, b):
    """Moments of the union of two disjoint sets of units: the sums add, the largest |s| is the larger.

    Exact up to floating-point addition, so shards and batches merge in any order. Numpy or torch.

    Examples
    --------
    >>> s, c = np.array([[1.0], [5.0], [2.0]]), np.array([[2.0], [6.0], [2.0]])
    >>> bool(np.allclose(combine_moments(unit_moments(s[:1], c[:1]), unit_moments(s[1:], c[1:])), unit_moments(s, c)))
    True
    """
    out = a + b
    first, second = a[-1], b[-1]
    # max with operators only, so torch works too; multiplying by 0 or 1 keeps it exact
    out[-1] = first * (first >= second) + second * (second > first)
    return out


def replicate_moments(weights, sums, counts, into=None):
    """Each replicate's weighted power sums, (term, replicate, *shape): sum_u w_bu s_u^2, w_bu s_u c_u, w_bu c_u^2.

    The `REPLICATE_TERMS` a studentized interval needs beside the replicate totals ``weights @ sums`` and
    ``weights @ counts``: with them each replicate has its own linearised variance of R*_b = S*_b / C*_b,
    sum_u w_bu (s_u - R*_b c_u)^2 / C*_b^2. Sums over units, so they add across windows, batches and shards
    exactly as the replicate totals do. Numpy or torch (any device); use float64.

    Parameters
    ----------
    weights : array of shape (replicate, unit)
        From `bootstrap_weights`, for the units of `sums`.
    sums, counts : arrays of shape (unit, *shape)

    into : array of shape (3, replicate, *shape), optional
        Running totals to add the terms into, in place (a sweep's: no stacked copy of three replicate-sized
        arrays per window); it is returned.

    Returns
    -------
    array of shape (3, replicate, *shape), the same kind as `sums`

    Examples
    --------
    >>> w = np.array([[1.0, 2.0], [0.0, 1.0]])
    >>> s, c = np.array([[1.0], [3.0]]), np.array([[2.0], [4.0]])
    >>> replicate_moments(w, s, c)[:, :, 0].tolist()  # ss, sc, cc for replicates 0 and 1
    [[19.0, 9.0], [26.0, 12.0], [36.0, 16.0]]
    >>> totals = replicate_moments(w, s, c)
    >>> bool((replicate_moments(w, s, c, into=totals) == 2 * replicate_moments(w, s, c)).all())
    True
    """
    if tuple(sums.shape) != tuple(counts.shape):
        raise ValueError(f"sums and counts must have the same shape (unit, ...), "
                         f"got {tuple(sums.shape)} and {tuple(counts.shape)}")
    if weights.shape[1] != sums.shape[0]:
        raise ValueError(f"weights are (replicate, unit) for {weights.shape[1]} units, sums have {sums.shape[0]}")
    n_units, shape = sums.shape[0], tuple(sums.shape[1:])
    size = math.prod(shape)  # not -1: with no units at all, -1 cannot be inferred
    flat_s, flat_c = sums.reshape(n_units, size), counts.reshape(n_units, size)
    products = (flat_s * flat_s, flat_s * flat_c, flat_c * flat_c)  # (unit, size) each, in REPLICATE_TERMS order
    if into is None:
        return _namespace(sums).stack([(weights @ product).reshape(weights.shape[0], *shape) for product in products])
    if tuple(into.shape) != (len(REPLICATE_TERMS), weights.shape[0], *shape):
        raise ValueError(f"into must be (3, replicate, ...) = {(3, weights.shape[0], *shape)}, got {tuple(into.shape)}")
    for term, product in enumerate(products):
        add_product(into[term], weights, product)
    return into


def add_product(into, weights, units):
    """``into += weights @ units`` in place, `into` (replicate, *shape) and `units` (unit, prod(shape)), without a
    replicate-sized temporary on torch (``addmm_``: for smollm2 such temporaries are 60 MB each, and every one is
    page-faulted in anew). Numpy adds the product. Returns `into`.

    >>> into = np.ones((2, 3))
    >>> add_product(into, np.array([[1.0], [2.0]]), np.array([[1.0, 2.0, 3.0]])).tolist()
    [[2.0, 3.0, 4.0], [3.0, 5.0, 7.0]]
    """
    if _namespace(into) is np:
        into += (weights @ units).reshape(into.shape)
    else:
        into.view(weights.shape[0], -1).addmm_(weights, units)  # view: raises rather than add into a copy
    return into

