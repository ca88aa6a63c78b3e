"""When a row of a table may carry a claim: one rule for every claim a report makes.

A claim about a row (a findings sentence, an entry of a top-head list, a role badge, a "looks furthest" line, a
syntax finding) needs two things of the row's numbers:

- its interval is not thin (`headscan.tables.thin_rows`: enough units, none holding too much of the sum);
- its interval lies beyond chance on the metric's striking side: ``ci_low > chance`` where high values are
  striking (a share of attention), ``ci_high < chance`` where low ones are (entropy). ``chance`` is the row's
  value under the null head, uniform attention over what each query sees (`headscan.tables` documents it).

`why_not` says, row by row, why a row cannot carry a claim ("" where it can); `supported` is its boolean.
A row without an interval (a sweep without bootstrap, tables added up by `headscan.tables.merge_tables`) or
without a chance level (a table written before headscan recorded it) carries none: nothing says how far from
uniform attention it lies.

This module draws nothing, loads no model and imports no torch; which end of a metric is striking comes from
the caller (`headscan.analysis.ranking.striking_of` reads it from the metric registry).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import tables

__all__ = ["THIN", "NO_INTERVAL", "NO_CHANCE", "AT_CHANCE", "why_not", "supported", "gate_text"]

THIN = "thin support"
NO_INTERVAL = "no interval"
NO_CHANCE = "no chance level"
AT_CHANCE = "at chance"  # the interval holds the chance level
# the interval lies wholly on the other side of chance: "below chance" for a high-striking metric, "above" for low
_WRONG_SIDE = {"high": "below chance", "low": "above chance"}


def _column(rows: pd.DataFrame, name: str) -> pd.Series:
    return rows[name].astype(float) if name in rows.columns else pd.Series(np.nan, index=rows.index)


def why_not(rows: pd.DataFrame, *, striking="high") -> pd.Series:
    """Why each row cannot carry a claim, in a few words ("" where it can); several reasons joined by "; ".

    Parameters
    ----------
    rows : DataFrame
        Rows of any table: ``ci_low``, ``ci_high`` and ``chance`` (missing columns count as not recorded),
        ``units`` and ``top_unit_share`` where recorded.
    striking : "high", "low", or a Series of them aligned with `rows`
        Which end of each row's metric is striking.

    >>> rows = pd.DataFrame({"ci_low": [0.5, 0.1, 0.01, 0.5], "ci_high": [0.6, 0.2, 0.05, 0.6],
    ...                      "chance": [0.1, 0.15, 0.1, 0.1], "units": [400.0, 400, 400, 5],
    ...                      "top_unit_share": 0.01})
    >>> why_not(rows).tolist()
    ['', 'at chance', 'below chance', 'thin support']
    >>> why_not(rows.assign(ci_low=[2.0, 1.0, 0.5, 2.0], ci_high=[2.2, 1.2, 0.9, 2.2], chance=1.0),
    ...         striking="low").tolist()
    ['above chance', 'at chance', '', 'thin support; above chance']
    """
    side = striking if isinstance(striking, pd.Series) else pd.Series(striking, index=rows.index)
    low, high, chance = _column(rows, "ci_low"), _column(rows, "ci_high"), _column(rows, "chance")
    thin = tables.thin_rows(rows) if len(rows) else pd.Series(False, index=rows.index)
    no_interval = low.isna() | high.isna()
    no_chance = chance.isna()
    ranks_high = side == "high"
    beyond = np.where(ranks_high, low > chance, high < chance)
    wrong = np.where(ranks_high, high < chance, low > chance)
    reasons = []
    for i in range(len(rows)):
        said = [THIN] if thin.iloc[i] else []
        if no_interval.iloc[i]:
            said.append(NO_INTERVAL)
        elif no_chance.iloc[i]:
            said.append(NO_CHANCE)
        elif not beyond[i]:
            said.append(_WRONG_SIDE.get(side.iloc[i], "below chance") if wrong[i] else AT_CHANCE)
        reasons.append("; ".join(said))
    return pd.Series(reasons, index=rows.index, dtype=object)


def supported(rows: pd.DataFrame, *, striking="high") -> pd.Series:
    """True where a row may carry a claim (`why_not` is empty).

    >>> supported(pd.DataFrame({"ci_low": [0.5], "ci_high": [0.6], "chance": [0.1]})).tolist()
    [True]
    """
    return why_not(rows, striking=striking) == ""


def gate_text() -> str:
    """The rule, in one sentence, as reports state it."""
    return ("A claim about a head (a finding, a role, a place in a top-head list) needs its 95% interval to rest "
            "on enough segments or documents (not thin) and to lie beyond chance, the value of uniform attention "
            "over the keys each query sees, on the metric's striking side: its low end above chance where high "
            "is striking, its high end below chance where low is.")
