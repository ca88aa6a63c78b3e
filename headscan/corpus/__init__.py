"""Corpora: reading text and treebanks into segments and documents, tokenising them per model, batching them.

Reading and checking a corpus needs no torch (`headscan.corpus.text`, `headscan.corpus.files`): the command line
checks a ``--corpus`` before torch is imported. What tokenises and batches (`headscan.corpus.tokens`,
`headscan.corpus.words`, `headscan.corpus.shuffle`) is imported on first use.
"""

import importlib

from .files import INDEX, FileSegments, Segment
from .text import Corpus, check_source, pack_corpus, read_corpus, texts_corpus

__all__ = ["Segment", "Corpus", "FileSegments", "INDEX", "read_corpus", "check_source", "pack_corpus", "texts_corpus",
           "EncodedCorpus", "encode", "batches", "Batch", "WordAlignment", "shuffle_words"]

# Loaded on first use: these import torch.
_LAZY = {"EncodedCorpus": "tokens", "encode": "tokens", "batches": "tokens", "Batch": "tokens",
         "WordAlignment": "words", "shuffle_words": "shuffle"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
