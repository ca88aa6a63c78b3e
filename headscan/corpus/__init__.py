"""Corpora: reading text and treebanks into segments and documents, tokenising them per model, batching them."""

from .files import INDEX, FileSegments, Segment
from .text import Batch, Corpus, EncodedCorpus, batches, encode, pack_corpus, read_corpus

__all__ = ["Segment", "Corpus", "FileSegments", "INDEX", "read_corpus", "pack_corpus", "EncodedCorpus", "encode",
           "batches", "Batch"]
