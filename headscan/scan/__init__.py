"""Sweeping: models over a corpus, window by window, into partial states that resume, shard, merge and publish."""

from .reduce import accumulate, finish, fingerprint, plan_windows, sweep_model, texts_corpus
from .run import merge, partial_folder, sweep
from .state import PartialState, Shard

__all__ = ["sweep", "merge", "sweep_model", "accumulate", "finish", "fingerprint", "plan_windows", "texts_corpus",
           "partial_folder", "PartialState", "Shard"]
