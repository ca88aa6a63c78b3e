"""The words a row's verdict is said in: ``finding``, or the first reason it is not one.

`headscan.metrics.nulls` writes them into the ``verdict`` column of heads, value and syntax; `headscan.analysis.claims`
reads them back into the reports' sentences. One list, so that the two cannot drift. Nothing here computes.
"""

from __future__ import annotations

__all__ = ["FOUND", "THIN", "TOO_FEW", "NO_NULL", "NO_INTERVAL", "WITHIN_NULL", "NO_EMPIRICAL", "NOT_DISCOVERED",
           "VERDICTS"]

# `verdict`: a finding, or why a row is not one (the first reason that holds, in this order)
FOUND = "finding"
THIN = "thin support"  # the interval is not trusted (headscan.intervals.thin): not assessed
TOO_FEW = "too few units to assess"  # fewer units than any calibration measured
NO_NULL = "no null"  # not tested: a metric only random-init controls give a null for, in a run without them
NO_INTERVAL = "no interval"
WITHIN_NULL = "within its null"  # the value does not lie beyond its null's end on the striking side
# tested against uniform attention only, a null untrained heads also leave (a run without random-init controls)
NO_EMPIRICAL = "beyond uniform attention only"
NOT_DISCOVERED = "not a discovery"  # beyond its null, but not at the false-discovery rate over its family
VERDICTS = (FOUND, THIN, TOO_FEW, NO_NULL, NO_INTERVAL, WITHIN_NULL, NO_EMPIRICAL, NOT_DISCOVERED)
