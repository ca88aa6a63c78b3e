"""headscan: score every attention head of hooked transformers into tidy parquet tables.

>>> import headscan
>>> sorted(headscan.METRICS)[:3]
['distance', 'duplicate_token', 'entropy']
"""

__version__ = "0.1.0"

from .errors import HeadscanError
from .metrics import METRICS
from .tables import SweepTables, load

__all__ = ["__version__", "HeadscanError", "METRICS", "SweepTables", "load", "sweep", "SweepConfig", "load_model"]


def __getattr__(name):
    # torch and transformers load lazily: `headscan --help` and `headscan.load` stay fast.
    if name in ("sweep", "SweepConfig"):
        from . import sweep as module

        return getattr(module, name)
    if name == "load_model":
        from .models import load_model

        return load_model
    raise AttributeError(f"module 'headscan' has no attribute {name!r}")
