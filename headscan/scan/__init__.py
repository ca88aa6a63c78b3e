"""Sweeping: models over a corpus, window by window, into partial states that resume, shard, merge and publish.

`sweep` and `merge` (`headscan.scan.run`) are ``headscan.sweep`` and ``headscan.merge``; the Ray sweep is
`headscan.scan.cluster`; `retrieval` (`headscan.scan.trials`) is ``headscan.retrieval``, the needle-in-a-haystack
trials of retrieval heads.
"""

from .finish import finish, publish
from .plan import columns_of, fingerprint, plan_windows
from .reduce import accumulate, sweep_model
from .resume import partial_folder
from .trials import retrieval
from .run import merge, sweep
from .state import PartialState, Shard

__all__ = ["sweep", "merge", "retrieval", "sweep_model", "accumulate", "finish", "publish", "columns_of", "fingerprint",
           "plan_windows", "partial_folder", "PartialState", "Shard"]
