"""Corpora: reading text and treebanks into segments and documents, tokenising them per model, batching them.

Reading and checking a corpus needs no torch (`headscan.corpus.text`, `headscan.corpus.files`): the command line
checks a ``--corpus`` before torch is imported. What tokenises and batches (`headscan.corpus.tokens`,
`headscan.corpus.words`, `headscan.corpus.shuffle`) is imported on first use.
"""

from ..lazy import lazy_names
from .files import INDEX, FileSegments, Segment
from .text import Corpus, check_source, pack_corpus, read_corpus, texts_corpus

__all__ = ["Segment", "Corpus", "FileSegments", "INDEX", "read_corpus", "check_source", "pack_corpus", "texts_corpus",
           "EncodedCorpus", "encode", "batches", "Batch", "WordAlignment", "shuffle_words"]

# Loaded on first use: these import torch.
_LAZY = {"EncodedCorpus": "tokens", "encode": "tokens", "batches": "tokens", "Batch": "tokens",
         "WordAlignment": "words", "shuffle_words": "shuffle"}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__)
