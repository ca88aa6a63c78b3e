"""Corpora: reading text and treebanks into segments and documents, tokenising them per model, batching them."""

from .files import INDEX, FileSegments, Segment
from .shuffle import shuffle_words
from .text import Corpus, pack_corpus, read_corpus, texts_corpus
from .tokens import Batch, EncodedCorpus, batches, encode
from .words import WordAlignment

__all__ = ["Segment", "Corpus", "FileSegments", "INDEX", "read_corpus", "pack_corpus", "texts_corpus", "EncodedCorpus",
           "encode", "batches", "Batch", "WordAlignment", "shuffle_words"]
