"""The shuffled-words control corpus: each segment's words permuted, so that a head's score says what the words'
positions alone find, without their order.

Segment i's words are permuted by ``numpy.random.default_rng([seed, i])`` (i its index in the corpus swept),
so a segment is shuffled the same way in every window, batch, shard and Ray task. A plain-text segment's words
are its whitespace-separated tokens, rejoined with one space. A CoNLL-U sentence's words are its syntactic
words, rejoined with one space, and its tree is permuted with them: each word keeps its head word and
relation, at their new places, so the syntax table of the control asks the same questions of words in a
random order. A packed segment (``--pack``) is shuffled as a whole.

This module does not tokenise or run models.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from ..errors import ConfigError
from .segment import Segment
from .text import Corpus

__all__ = ["shuffle_words", "shuffled_segment"]


def shuffled_segment(segment: Segment, seed: int, index: int) -> Segment:
    """`segment` with its words in the order drawn for segment `index` with `seed`.

    >>> tree = Segment("the old cat sat", 1, ("the", "old", "cat", "sat"), (3, 3, 4, 0), ("det", "amod", "nsubj", "root"))
    >>> s = shuffled_segment(tree, seed=0, index=1)  # words 3, 0, 2, 1: each keeps its head word (cat is now 3)
    >>> s.text, s.heads, s.deprels, s.spans
    ('sat the cat old', (0, 3, 1, 3), ('root', 'det', 'nsubj', 'amod'), ((0, 3), (4, 7), (8, 11), (12, 15)))
    >>> shuffled_segment(Segment("a b c d", 1), seed=0, index=1).text  # plain text: its whitespace-separated words
    'd a c b'
    """
    words = list(segment.words) if segment.words else segment.text.split()
    order = np.random.default_rng([seed, index]).permutation(len(words))  # new position -> old word
    moved = [words[old] for old in order]
    text = " ".join(moved)
    if not segment.words:
        return dataclasses.replace(segment, text=text)
    new_place = np.empty(len(order), dtype=np.int64)
    new_place[order] = np.arange(len(order))  # old word -> new position
    heads = tuple(0 if segment.heads[old] == 0 else int(new_place[segment.heads[old] - 1]) + 1 for old in order)
    starts = np.cumsum([0] + [len(w) + 1 for w in moved[:-1]])
    spans = tuple((int(start), int(start) + len(word)) for start, word in zip(starts, moved))
    return dataclasses.replace(segment, text=text, words=tuple(moved), heads=heads,
                               deprels=tuple(segment.deprels[old] for old in order), spans=spans)


class _Shuffled(Sequence):
    """The segments of a corpus, each shuffled when it is asked for (a file's segments stay on disk)."""

    def __init__(self, segments: Sequence[Segment], seed: int, first: int = 0):
        self.segments, self.seed, self.first = segments, seed, first

    def __len__(self) -> int:
        return len(self.segments)

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return _Shuffled(self.segments[start:stop], self.seed, self.first + start)
        index = key + len(self) if key < 0 else key
        return shuffled_segment(self.segments[index], self.seed, self.first + index)


def shuffle_words(corpus: Corpus, seed: int) -> Corpus:
    """`corpus` with each segment's words permuted (see the module docstring); documents are kept.

    >>> from headscan.corpus import read_corpus
    >>> shuffled = shuffle_words(read_corpus("builtin", limit=2), 0)
    >>> shuffled.segments[0].text != read_corpus("builtin", limit=1).segments[0].text, shuffled.options["shuffled_words_seed"]
    (True, 0)
    """
    if corpus.kind == "repeat-random":
        raise ConfigError("control: shuffled-words permutes a text's words, and repeat-random has none (its tokens are "
                          "random already); use --control random-init on repeat-random", setting="control")
    shuffled = Corpus(corpus.source, corpus.kind, corpus.sha256, _Shuffled(corpus.segments, seed),
                      corpus.options | {"shuffled_words_seed": seed}, corpus.documents)
    # the documents of the corpus's index, so that no segment is read to find them
    shuffled.__dict__["segment_documents"] = corpus.segment_documents
    return shuffled
