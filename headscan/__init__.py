"""headscan: score every attention head of hooked transformers into tidy parquet tables.

The public API is small:

- ``headscan.sweep(models, corpus, out=None, **settings)`` scores every head (the `headscan sweep` command);
- ``headscan.retrieval(models, haystack, out=None, **settings)`` finds retrieval heads by needle-in-a-haystack
  decoding (the `headscan retrieval` command); ``headscan.import_scores(file, out=None)`` reads published
  retrieval-head scores (Retrieval_Head's JSON) as such a run (`headscan import-scores`);
- ``headscan.patch(models, pairs, out=None, **settings)`` patches every head, and paths between heads, between
  clean and corrupted prompts (the `headscan patch` command);
- ``headscan.load(out)`` reads a sweep's tables back (``pd.read_parquet`` works too);
- ``headscan.report(runs, out=None, **settings)`` writes the report of one or more sweeps (the `headscan report`
  command, without the example attention unless given ``examples``);
- ``headscan.METRICS`` and ``headscan.TABLES`` are the metric and table registries;
- ``headscan.pattern(name)`` and ``headscan.metric(name)`` register your own head scores (decorators;
  `headscan.metrics.custom`), swept like headscan's own;
- ``headscan.SweepConfig`` holds the settings, ``headscan.load_model`` loads one hooked model.

Importing headscan imports neither torch nor transformers; the first sweep does.

>>> import headscan
>>> list(headscan.METRICS)[:3]
['prev_token', 'next_token', 'self']
>>> list(headscan.TABLES)  # doctest: +NORMALIZE_WHITESPACE
['heads', 'offsets', 'positions', 'syntax', 'value', 'weights', 'composition', 'importance', 'patching', 'paths',
 'similarity', 'similarity_across', 'examples', 'retrieval', 'retrieval_trials', 'retrieval_masking',
 'retrieval_masking_trials']
"""

import importlib

__version__ = "0.1.0"

from .config import RetrievalConfig, SweepConfig
from .errors import HeadscanError
from .tables import TABLES, SweepTables, load

__all__ = ["__version__", "HeadscanError", "METRICS", "TABLES", "SweepTables", "SweepConfig", "RetrievalConfig", "load",
           "import_scores", "load_model", "merge", "metric", "patch", "pattern", "report", "retrieval", "sweep"]

# Loaded on first use: these import torch and transformers.
_LAZY = {"sweep": "headscan.scan", "merge": "headscan.scan", "retrieval": "headscan.scan",
         "import_scores": "headscan.scan.published",
         "patch": "headscan.scan.patching", "load_model": "headscan.models", "METRICS": "headscan.metrics",
         "pattern": "headscan.metrics.custom", "metric": "headscan.metrics.custom"}


def __getattr__(name):
    if name == "report":  # the package headscan.report, callable as write_report (it imports matplotlib)
        return importlib.import_module("headscan.report")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'headscan' has no attribute {name!r}")
