"""Sweeping: models over a corpus, window by window, into partial states that resume, shard, merge and publish.

`sweep` and `merge` (`headscan.scan.run`) are ``headscan.sweep`` and ``headscan.merge``; the Ray sweep is
`headscan.scan.cluster`; optional work beside the window loop (`headscan.scan.reduce`) is a registered pass
(`headscan.scan.passes`); `retrieval` (`headscan.scan.trials`) is ``headscan.retrieval``, the needle-in-a-haystack
trials of retrieval heads.
"""

from .finish import finish, publish
from .plan import SweepPlan, columns_of, fingerprint, plan_sweep, plan_windows
from .reduce import accumulate, sweep_model
from .resume import partial_folder
from .run import merge, sweep
from .state import PartialState, Shard
from .trials import retrieval

__all__ = ["sweep", "merge", "retrieval", "sweep_model", "accumulate", "finish", "publish", "columns_of", "fingerprint",
           "plan_windows", "plan_sweep", "SweepPlan", "partial_folder", "PartialState", "Shard"]
