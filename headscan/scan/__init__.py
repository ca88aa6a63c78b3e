"""Sweeping: models over a corpus, window by window, into partial states that resume, shard, merge and publish.

`sweep` and `merge` (`headscan.scan.run`) are ``headscan.sweep`` and ``headscan.merge``; the Ray sweep is
`headscan.scan.cluster`.
"""

from .finish import finish, publish
from .plan import columns_of, fingerprint, plan_windows
from .reduce import accumulate, sweep_model
from .resume import partial_folder
from .run import merge, sweep
from .state import PartialState, Shard

__all__ = ["sweep", "merge", "sweep_model", "accumulate", "finish", "publish", "columns_of", "fingerprint",
           "plan_windows", "partial_folder", "PartialState", "Shard"]
