"""Sweeping: models over a corpus, window by window, into partial states that resume, shard, merge and publish.

`sweep` and `merge` (`headscan.scan.run`) are ``headscan.sweep`` and ``headscan.merge``; the Ray sweep is
`headscan.scan.cluster`; optional work beside the window loop (`headscan.scan.reduce`) is a registered pass
(`headscan.scan.passes`); `retrieval` (`headscan.scan.trials`) is ``headscan.retrieval``, the needle-in-a-haystack
trials of retrieval heads. A job (`headscan.scan.jobs`: ``headscan patch``, ``headscan import-scores``, or one registered from outside)
runs through one lifecycle, `headscan.scan.runner.run_job`. `headscan.scan.inputs` checks a run's inputs without torch, which the rest imports:
each name below is imported on first use, so that the command line checks its arguments before torch loads.
"""

from ..lazy import lazy_names

__all__ = ["sweep", "merge", "retrieval", "sweep_model", "accumulate", "finish", "publish", "columns_of", "fingerprint",
           "plan_windows", "plan_sweep", "SweepPlan", "partial_folder", "PartialState", "Shard"]

_LAZY = {"finish": "finish", "publish": "finish", "SweepPlan": "plan", "columns_of": "plan", "fingerprint": "plan",
         "plan_sweep": "plan", "plan_windows": "plan", "accumulate": "reduce", "sweep_model": "reduce",
         "partial_folder": "resume", "merge": "run", "sweep": "run", "PartialState": "state", "Shard": "state",
         "retrieval": "trials"}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__)
