"""headscan: score every attention head of hooked transformers into tidy parquet tables.

The public API is small: `load` reads a sweep's tables back, `METRICS` holds the metric registry, and
``from headscan.sweep import sweep, SweepConfig`` runs a sweep from Python (the `headscan sweep` command).

>>> import headscan
>>> sorted(headscan.METRICS)[:3]
['distance', 'duplicate_token', 'entropy']
"""

import importlib

__version__ = "0.1.0"

from .errors import HeadscanError
from .metrics import METRICS
from .tables import SweepTables, load

__all__ = ["__version__", "HeadscanError", "METRICS", "SweepTables", "load", "SweepConfig", "load_model"]

_LAZY = {"SweepConfig": "headscan.sweep", "load_model": "headscan.models"}


def __getattr__(name):
    # torch and transformers load lazily, so that `headscan --help` and `headscan.load` stay fast.
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'headscan' has no attribute {name!r}")
