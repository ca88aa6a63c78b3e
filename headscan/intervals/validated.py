"""Where the intervals were validated: the coverage the default interval reached on real text, by metric family
and number of units, and the rule that keeps a claim off an interval whose family fell short there.

``experiments/interval_coverage.py`` sweeps parts of 10, 30 and 100 whole EWT test documents (100 random parts
per size, minilm and smollm2) and counts how often each family's default interval (``studentized_symmetric``,
on the rows the ``thin`` rule trusts) held the value over the whole of EWT test. `coverage_table` condenses its
``coverage.csv`` into ``headscan/data/interval_coverage.csv``: per family and size, the *lower* of the two models'
coverage (a family measured on one model only keeps that one). A family is ``heads`` metric's name, ``value:``
and the metric for value.parquet, ``syntax``, and ``importance:METHOD:TARGET`` for exact ablations (measured on
minilm's ``hidden_change`` only, from ``experiments/unit_sums.py --importance``; the packaged table condenses both
committed coverage.csv files).

`unvalidated` marks a row whose interval cannot carry a claim at its size: its family's coverage at the largest
measured size not above the row's ``units`` is below `MIN_COVERAGE`, or the row rests on fewer units than the
smallest size measured. A family never measured (a metric of your own, ``induction`` on natural text, where the
``thin`` rule trusts no row) is not marked: nothing measured says it falls short, and docs/intervals.md says which
families those are.

>>> table = pd.DataFrame({"family": ["prev_token", "prev_token", "syntax"], "N": [30, 100, 10],
...                       "coverage": [0.92, 0.976, 0.96]})
>>> unvalidated("heads", np.array(["prev_token"] * 4), np.array([318.0, 64.0, 8.0, np.nan]), table).tolist()
[False, True, True, False]
>>> unvalidated("syntax", np.array(["nsubj"]), np.array([12.0]), table).tolist()
[False]
"""

from __future__ import annotations

import functools
import io
from importlib import resources

import numpy as np
import pandas as pd

__all__ = ["MIN_COVERAGE", "COVERAGE_DESIGN", "coverage_table", "measured_coverage", "family_of", "unvalidated",
           "coverage_at", "validation_rule"]

MIN_COVERAGE = 0.93  # a 95% interval family whose measured coverage falls below this carries no claim at that size
# what coverage_table keeps of experiments/interval_coverage.py's coverage.csv
COVERAGE_DESIGN = {"design": "random", "method": "studentized_symmetric", "rule": "thin"}
MIN_TRUSTED_ROWS = 50  # fewer trusted rows than this (over all parts) is no measurement of a family at that size
_FILE = "data/interval_coverage.csv"


def coverage_table(coverage: pd.DataFrame) -> pd.DataFrame:
    """``family, N, coverage, models, trusted``: experiment's `coverage` (its coverage.csv) at `COVERAGE_DESIGN`,
    the lower coverage of the models per family and size, over families measured on at least `MIN_TRUSTED_ROWS`
    trusted rows; ``all`` and ``offsets`` (no claim is made of them) left out."""
    rows = coverage
    for column, value in COVERAGE_DESIGN.items():
        rows = rows[rows[column] == value]
    rows = rows[(rows["trusted"] >= MIN_TRUSTED_ROWS) & ~rows["metric"].isin(["all", "offsets"])]
    grouped = rows.groupby(["metric", "N"], sort=True)
    out = pd.DataFrame({"coverage": grouped["coverage"].min().round(4),
                        "models": grouped["model"].agg(lambda m: " ".join(sorted(m))),
                        "trusted": grouped["trusted"].sum().astype(int)}).reset_index()
    return out.rename(columns={"metric": "family"})[["family", "N", "coverage", "models", "trusted"]]


@functools.cache
def measured_coverage() -> pd.DataFrame:
    """The packaged `coverage_table` (``headscan/data/interval_coverage.csv``)."""
    text = resources.files("headscan").joinpath(_FILE).read_text(encoding="utf-8")
    return pd.read_csv(io.StringIO(text))


def family_of(table: str, metric) -> np.ndarray:
    """Each row's coverage family: the metric's name for heads, ``value:`` and its name for value, ``syntax``;
    for importance, `metric` holds ``METHOD:TARGET`` and the family is ``importance:METHOD:TARGET``."""
    metric = np.asarray(metric, dtype=object)
    if table == "syntax":
        return np.full(len(metric), "syntax", dtype=object)
    if table == "importance":
        return np.array([f"importance:{m}" for m in metric], dtype=object)
    return np.array([f"value:{m}" for m in metric], dtype=object) if table == "value" else metric


def coverage_at(families, units, table: pd.DataFrame | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the size its claim is judged at (the largest measured size not above `units`; 0 below every
    size, NaN where `units` is unknown) and its family's coverage there (NaN where the family was not measured
    at that size)."""
    table = measured_coverage() if table is None else table
    sizes = np.sort(table["N"].unique())
    units = np.asarray(units, dtype=np.float64)
    at = np.full(len(units), np.nan)
    known = ~np.isnan(units)
    index = np.searchsorted(sizes, units[known], side="right") - 1  # the largest size <= units
    at[known] = np.where(index >= 0, sizes[np.clip(index, 0, None)], 0)
    lookup = {(f, n): c for f, n, c in zip(table["family"], table["N"], table["coverage"])}
    coverage = np.array([lookup.get((f, int(n)), np.nan) if not np.isnan(n) else np.nan
                         for f, n in zip(families, at)])
    return at, coverage


def unvalidated(table_name: str, metric, units, table: pd.DataFrame | None = None) -> np.ndarray:
    """True for rows of table `table_name` whose family's measured coverage at their size is below
    `MIN_COVERAGE`, or whose ``units`` are fewer than the smallest size measured (see the module's docstring)."""
    table = measured_coverage() if table is None else table
    families = family_of(table_name, metric)
    at, coverage = coverage_at(families, units, table)
    measured = set(table["family"])
    below_every_size = (at == 0) & np.array([f in measured for f in families], dtype=bool)
    return below_every_size | (coverage < MIN_COVERAGE)


def validation_rule() -> str:
    """The rule in one sentence, as the provenance and the report state it."""
    sizes = ", ".join(str(int(n)) for n in np.sort(measured_coverage()["N"].unique()))
    return (f"a row is no finding where its family's 95% intervals covered less than {MIN_COVERAGE:.2f} at the largest "
            f"size measured not above its units (parts of {sizes} EWT test documents, minilm and smollm2, the lower "
            "of the two; experiments/interval_coverage.py), or where it rests on fewer units than the smallest size")
