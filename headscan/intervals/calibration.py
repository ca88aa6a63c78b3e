"""How far each 95% interval must widen to hold 95%: a half-width factor per metric family and number of units,
measured on real text, and the rule that reads it.

A bootstrap interval over few documents is too short: on parts of 10 EWT documents the default interval of
``prev_token`` held the whole split's value for 0.82 of the rows, not 0.95. Withholding such a row's claim throws
away evidence a hundred half-widths from its null; trusting it passes rows that are not there. So every row keeps
its interval and gains a *calibrated* one, its half-width times the factor its family needed at its size, and the
row's p-value, q-value and finding use the calibrated one (`headscan.metrics.nulls`).

The factor. ``experiments/interval_calibration.py`` draws parts of N = 10, 30 and 100 whole documents of EWT test
(the fit split) and, for every row the ``thin`` rule trusts, divides the distance from the part's value to the
whole split's value by the part's half-width (the wider half, as `headscan.intervals.interval_se` reads it),
corrected for sampling without replacement (the parts are drawn from about 318 documents, so their errors are
smaller by sqrt((M - N) / (M - 1)) than a sample's from an unending corpus). The factor is the 95th percentile of
that ratio, at least 1, the larger of the two models' (minilm and smollm2), per family (`family_of`) and size.
It is checked where it was not fitted: parts of EWT dev, whose coverage with the factor is committed beside it
(``reports/experiments/interval_calibration``).

The rule (`calibrate`):

- a row of a measured family takes the factor interpolated between the measured sizes, linearly in log units;
  beyond the largest size, the largest size's;
- a family never measured (a metric of your own; an importance target not measured) takes the widest factor of
  any family at that size, until it is measured (``basis`` says so). ``induction`` and ``duplicate_token``, which
  the ``thin`` rule almost never trusts on EWT, are measured on repeated random tokens instead;
- a row on fewer units than the smallest size measured is "too few units to assess": no factor, no test, never
  "within its null";
- a zero-width interval (every unit agrees, as a share at 0 or 1 does) has nothing for a factor to widen and takes
  the rule of three over its units instead (`zero_width_floor`), in the fit's check as in the sweep.

>>> table = pd.DataFrame({"family": ["prev_token", "prev_token", "entropy", "entropy"], "N": [10, 100, 10, 100],
...                       "factor": [1.5, 1.0, 2.5, 1.2]})
>>> factor, basis = calibrate("heads", ["prev_token", "prev_token", "entropy", "mine", "prev_token"],
...                           [10, 31.6227766, 1000, 10, 8], table)
>>> factor.round(3).tolist(), basis.tolist()
([1.5, 1.25, 1.2, 2.5, nan], ['measured', 'measured', 'measured', 'widest measured', 'too few units'])
"""

from __future__ import annotations

import functools
import io
from importlib import resources

import numpy as np
import pandas as pd

__all__ = ["COVERAGE_TARGET", "BASES", "calibration_table", "family_of", "calibrate", "calibrated_interval",
           "zero_width_floor", "smallest_size", "calibration_rule"]

COVERAGE_TARGET = 0.95  # the factor is the ratio's 95th percentile: the calibrated interval holds 95% on the fit split
# What a row's factor rests on: its family's measurements, the widest family's (its own never measured), or none.
BASES = ("measured", "widest measured", "too few units")
_FILE = "data/interval_calibration.csv"


@functools.cache
def calibration_table() -> pd.DataFrame:
    """The packaged factors (``headscan/data/interval_calibration.csv``: family, N, factor, coverage, models,
    trusted), from ``experiments/interval_calibration.py``."""
    text = resources.files("headscan").joinpath(_FILE).read_text(encoding="utf-8")
    return pd.read_csv(io.StringIO(text))


def family_of(table: str, metric) -> np.ndarray:
    """Each row's calibration family: the metric's name for heads, ``value:`` and its name for value, ``syntax``;
    for importance, `metric` holds ``METHOD:TARGET`` and the family is ``importance:METHOD:TARGET``.

    >>> family_of("value", ["prev_token"]).tolist(), family_of("syntax", ["nsubj"]).tolist()
    (['value:prev_token'], ['syntax'])
    """
    metric = np.asarray(metric, dtype=object)
    if table == "syntax":
        return np.full(len(metric), "syntax", dtype=object)
    if table == "importance":
        return np.array([f"importance:{m}" for m in metric], dtype=object)
    return np.array([f"value:{m}" for m in metric], dtype=object) if table == "value" else metric


def smallest_size(table: pd.DataFrame | None = None) -> int:
    """The fewest units any factor was measured at: below it a row is "too few units to assess"."""
    table = calibration_table() if table is None else table
    return int(table["N"].min())


def _curves(table: pd.DataFrame) -> tuple[np.ndarray, pd.Index, np.ndarray, np.ndarray]:
    """The measured sizes, the families, their (family, size) factors and the widest factor at each size; a family
    missing at a size takes that size's widest. Kept for the last table asked about: a run's findings calibrate
    every table of every model against the same packaged one, and the pivot costs more than the rows."""
    if _LAST_CURVES and _LAST_CURVES[0] is table:
        return _LAST_CURVES[1]
    sizes = np.sort(table["N"].unique()).astype(np.float64)
    grid = table.pivot_table(index="family", columns="N", values="factor", aggfunc="max").reindex(columns=sizes)
    widest = grid.max(axis=0).to_numpy(dtype=np.float64)
    filled = grid.to_numpy(dtype=np.float64)
    filled = np.where(np.isnan(filled), widest[None, :], filled)
    _LAST_CURVES[:] = [table, (sizes, pd.Index(grid.index), filled, widest)]
    return _LAST_CURVES[1]


_LAST_CURVES: list = []


def calibrate(table_name: str, metric, units, table: pd.DataFrame | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per row of table `table_name`, the factor its interval's half-width is multiplied by and what it rests on
    (one of `BASES`): the module's rule. `units` is each row's number of bootstrap units (NaN: not recorded,
    which is read as the smallest size's factor of the row's family, the most cautious measured one)."""
    table = calibration_table() if table is None else table
    # each distinct metric looked up once: a run's table repeats a few dozen metrics over thousands of rows
    codes, distinct = pd.factorize(np.asarray(metric, dtype=object), use_na_sentinel=False)
    units = np.asarray(units, dtype=np.float64)
    sizes, names, filled, widest = _curves(table)
    families = family_of(table_name, distinct)
    found = names.get_indexer(pd.Index(families, dtype=object))[codes] if len(codes) else np.zeros(0, dtype=int)
    measured = found >= 0
    # (row, size): the row's family's factors, the widest's where its family was never measured
    curves = np.vstack([filled, widest[None, :]])[np.where(measured, found, len(filled))]
    at = np.where(np.isnan(units), sizes[0], np.clip(units, sizes[0], sizes[-1]))
    log_sizes, log_at = np.log(sizes), np.log(at)
    upper = np.clip(np.searchsorted(sizes, at, side="left"), 1, len(sizes) - 1) if len(sizes) > 1 else \
        np.zeros(len(at), dtype=int)
    lower = np.maximum(upper - 1, 0)
    span = log_sizes[upper] - log_sizes[lower]
    with np.errstate(invalid="ignore", divide="ignore"):
        weight = np.where(span > 0, (log_at - log_sizes[lower]) / span, 0.0)
    rows = np.arange(len(codes))
    factor = curves[rows, lower] * (1 - weight) + curves[rows, upper] * weight
    too_few = units < sizes[0]
    factor = np.where(too_few, np.nan, factor)
    basis = np.where(too_few, BASES[2], np.where(measured, BASES[0], BASES[1])).astype(object)
    return factor, basis


# -ln(0.05): when every one of n units shows the same value, units unlike them make up at most this / n of the
# population with 95% confidence (the rule of three)
_RULE_OF_THREE = -np.log(1 - COVERAGE_TARGET)


def zero_width_floor(low, high, units, bounds=None) -> np.ndarray:
    """The half-width a zero-width interval is given instead of none: the rule of three over its units.

    A share whose every unit agrees (each of 10 documents puts all its queries' attention past the sink threshold)
    bootstraps to an interval of width 0, which no factor widens, while the whole corpus may hold a few units that
    differ: on parts of 10 EWT documents, 11% of smollm2's trusted ``sink_ratio`` rows had a zero-width interval that
    missed the split's value. If every one of n units agrees, units that differ are at most -ln(0.05) / n of the
    population (95%), and they move the mean by at most that share of the metric's range, which is the floor. 0
    where the interval has width or the metric's range is unbounded; NaN where the interval or `units` is.

    >>> zero_width_floor(np.array([1.0, 0.9, 0.0]), np.array([1.0, 1.0, 0.0]), np.array([10.0, 10.0, 300.0]),
    ...                  bounds=(0.0, 1.0)).round(4).tolist()
    [0.2996, 0.0, 0.01]
    """
    low, high, units = (np.asarray(v, dtype=np.float64) for v in (low, high, units))
    if bounds is None:
        return np.where(np.isnan(low + high), np.nan, 0.0)
    span = np.asarray(bounds[1], dtype=np.float64) - np.asarray(bounds[0], dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        floor = np.where((high - low == 0) & np.isfinite(span), _RULE_OF_THREE / units * span, 0.0)
    return np.where(np.isnan(low + high), np.nan, floor)


def calibrated_interval(value, low, high, factor, bounds=None, units=None) -> tuple[np.ndarray, np.ndarray]:
    """The interval ``value +- factor x`` its wider half-width, clipped into the metric's `bounds` (low, high);
    NaN where the interval or the factor is. With `units`, a zero-width interval takes `zero_width_floor`.

    >>> calibrated_interval(np.array([0.9, 0.5]), np.array([0.85, 0.4]), np.array([0.95, 0.6]), np.array([1.5, 2.0]),
    ...                     bounds=(0.0, 1.0))
    (array([0.825, 0.3  ]), array([0.975, 0.7  ]))
    >>> calibrated_interval(np.array([1.0]), np.array([1.0]), np.array([1.0]), np.array([1.5]), bounds=(0.0, 1.0),
    ...                     units=np.array([30.0]))[0].round(4)
    array([0.9001])
    """
    value, low, high, factor = (np.asarray(v, dtype=np.float64) for v in (value, low, high, factor))
    half = np.fmax(value - low, high - value) * factor
    if units is not None:
        half = np.where(np.isnan(half), half, np.fmax(half, zero_width_floor(low, high, units, bounds)))
    new_low, new_high = value - half, value + half
    if bounds is not None:
        new_low, new_high = np.clip(new_low, bounds[0], bounds[1]), np.clip(new_high, bounds[0], bounds[1])
    return new_low, new_high


def calibration_rule() -> str:
    """The rule in one sentence, as the provenance and the report state it."""
    table = calibration_table()
    sizes = ", ".join(str(int(n)) for n in np.sort(table["N"].unique()))
    return (f"each row's 95% interval is widened by the factor its family needed to hold 95% on parts of {sizes} "
            "EWT test documents (minilm and smollm2, the larger; interpolated in log units; a family never measured "
            f"takes the widest factor at its size; experiments/interval_calibration.py), and the test uses the widened "
            f"one; a zero-width interval takes the rule of three over its units (a share of -ln(0.05) / units of the "
            f"range); a row on fewer than {smallest_size(table)} units is too few to assess")
