"""Words of a treebank for a batch of tokens: which word each token belongs to, and each word's gold head.

A CoNLL-U sentence is tokenised from its own text, as a plain-text line would be, and each token is given
to a word by character offsets (`align_tokens`: the word holding its first non-space character; the words'
characters come from `headscan.corpus.conllu`). A `WordAlignment` carries, for a batch, each token's word
and each word's gold head and relation (UD relations, subtypes folded into their base: `relation_id`). The
syntax metric (`headscan.metrics.syntax`) reads them.

This module does not score heads or tokenise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import CorpusError

__all__ = ["RELATIONS", "DIRECTIONS", "ROOT", "WordAlignment", "relation_id", "align_tokens", "word_alignment"]

# UD v2 universal relations (https://universaldependencies.org/u/dep/) without "root", which has no head word.
UD_RELATIONS = ("acl", "advcl", "advmod", "amod", "appos", "aux", "case", "cc", "ccomp", "clf", "compound", "conj",
                "cop", "csubj", "dep", "det", "discourse", "dislocated", "expl", "fixed", "flat", "goeswith", "iobj",
                "list", "mark", "nmod", "nsubj", "nummod", "obj", "obl", "orphan", "parataxis", "punct",
                "reparandum", "vocative", "xcomp")
RELATIONS: tuple[str, ...] = ("all", *UD_RELATIONS)  # the relation inventory; a relation id indexes it
DIRECTIONS: tuple[str, ...] = ("dependent_to_head", "head_to_dependent")
_RELATION_IDS = {name: i for i, name in enumerate(RELATIONS) if name != "all"}
ROOT = -2  # `WordAlignment.head` of a root word that has a token: no head word, so never predicted right


def relation_id(deprel: str) -> int:
    """The index in `RELATIONS` of a CoNLL-U DEPREL, subtypes folded into their base; -1 when not a UD relation.

    >>> RELATIONS[relation_id("obl:tmod")], RELATIONS[relation_id("nsubj")], relation_id("root"), relation_id("dobj")
    ('obl', 'nsubj', -1, -1)
    """
    return _RELATION_IDS.get(deprel.split(":", 1)[0].strip().lower(), -1)


@dataclass(frozen=True)
class WordAlignment:
    """A batch's words: which word each token belongs to, and each word's gold head and relation.

    Words are indexed from 0 within their segment. Tensors are never written to.
    """

    token_word: torch.Tensor  # (batch, seq) long: the token's word, -1 for special tokens and padding
    head: torch.Tensor  # (batch, word) long: the gold head word; ROOT (-2) for a root word that has a token;
    # -1 for padding and words not scored
    relation: torch.Tensor  # (batch, word) long: index into RELATIONS, -1 when not a UD relation (or padding)

    @property
    def n_words(self) -> int:
        return self.head.shape[-1]

    def map(self, function) -> WordAlignment:
        """The same words with `function` applied to each (batch, ...) tensor: moved, sliced or repeated."""
        return WordAlignment(function(self.token_word), function(self.head), function(self.relation))

    def to(self, device) -> WordAlignment:
        return self.map(lambda tensor: tensor.to(device))


def word_alignment(
    word_ids: Sequence[Sequence[int | None]],
    heads: Sequence[Sequence[int]],
    deprels: Sequence[Sequence[str]],
    width: int | None = None,
    missing: Sequence[Sequence[int]] | None = None,
) -> WordAlignment:
    """The `WordAlignment` of a batch of segments, right-padded to `width` tokens (default: the longest).

    `word_ids` are each segment's token -> word (None or -1 for special tokens; `align_tokens`), after any BOS
    and truncation; `heads` are CoNLL-U HEADs (1-based, 0 for the root) and `deprels` the DEPRELs. A word is
    scored when it and its head both have a token, or are among the segment's `missing` words: words of the
    text that no token went to, which count as misses (a word cut off by truncation is not scored at all).

    >>> words = word_alignment([[None, 0, 0, 1, None]], [[2, 0]], [["nsubj:pass", "root"]])
    >>> words.token_word.tolist(), words.head.tolist(), words.relation.tolist(), RELATIONS[27]
    ([[-1, 0, 0, 1, -1]], [[1, -2]], [[27, -1]], 'nsubj')
    >>> word_alignment([[-1, 0, 0]], [[2, 0]], [["nsubj", "root"]]).head.tolist()  # word 1 has no token
    [[-1, -1]]
    >>> word_alignment([[-1, 0, 0]], [[2, 0]], [["nsubj", "root"]], missing=[[1]]).head.tolist()  # a miss
    [[1, -2]]
    """
    n_words = max((len(h) for h in heads), default=0)
    width = max((len(w) for w in word_ids), default=0) if width is None else width
    token_word = np.full((len(word_ids), width), -1, dtype=np.int64)
    head = np.full((len(word_ids), n_words), -1, dtype=np.int64)
    relation = np.full((len(word_ids), n_words), -1, dtype=np.int64)
    missing = [()] * len(word_ids) if missing is None else missing
    for row, (ids, gold, labels, lost) in enumerate(zip(word_ids, heads, deprels, missing, strict=True)):
        if len(ids) > width:
            raise CorpusError(f"segment {row} has {len(ids)} tokens, more than the batch width {width}")
        if len(gold) != len(labels):
            raise CorpusError(f"segment {row} has {len(gold)} HEADs but {len(labels)} DEPRELs; give one of each per word")
        ids = np.array([-1 if i is None else i for i in ids], dtype=np.int64)
        if ids.size and ids.max() >= len(gold):
            raise CorpusError(f"segment {row}: a token belongs to word {ids.max()} but the sentence has {len(gold)} "
                              f"words; align the tokens to the segment's own words")
        token_word[row, : len(ids)] = ids
        present = np.zeros(len(gold) + 1, dtype=bool)  # word index + 1, so that the root (0) is never present
        present[ids[ids >= 0] + 1] = True
        present[np.asarray(lost, dtype=np.int64) + 1] = True  # no token, yet in the text: scored as a miss
        gold = np.asarray(gold, dtype=np.int64)
        scored = present[1:] & present[gold]  # the word and its head both have a token (the root has none)
        root = present[1:] & (gold == 0)  # a root word with a token: Clark et al. count it as a miss in "all"
        head[row, : len(gold)] = np.where(scored, gold - 1, np.where(root, ROOT, -1))
        relation[row, : len(gold)] = [relation_id(label) for label in labels]
    return WordAlignment(torch.from_numpy(token_word), torch.from_numpy(head), torch.from_numpy(relation))


# --- tokens to words by character offsets ------------------------------------------------------------------


def align_tokens(text: str, token_spans: Sequence[tuple[int, int] | None], word_spans: Sequence[tuple[int, int]]
                 ) -> tuple[list[int], int, list[int]]:
    """The word of each token of `text`, how many tokens straddle two words, and the words no token went to.

    `token_spans` are the tokens' [start, stop) characters in `text` (a fast tokenizer's offset mapping;
    None for special tokens, which belong to no word: -1); `word_spans` the words' (`Segment.spans`,
    (-1, -1) for a word not found in the text). A token goes to the word holding its first non-space
    character; a token with none (only spaces, or no characters) to the next word, or the last one before
    it at the end of the text. Words may then be left without a token (the second of '".' when one token
    covers both): the syntax metric counts them as misses (`word_alignment`'s `missing`).

    >>> text = 'It is "ok".'  # a byte-level BPE splits: It | Ġis | Ġ" | ok | ".
    >>> align_tokens(text, [None, (0, 2), (2, 5), (5, 7), (7, 9), (9, 11)],
    ...              [(0, 2), (3, 5), (6, 7), (7, 9), (9, 10), (10, 11)])
    ([-1, 0, 1, 2, 3, 4], 1, [5])
    """
    n = len(text)
    char_word = np.full(n + 1, -1, dtype=np.int64)  # (char,) the word holding each character; a sentinel at n
    for word, (start, stop) in enumerate(word_spans):
        if start >= 0:
            char_word[start:stop] = word
    usable = char_word >= 0  # a word's character that is not a space
    usable[:n] &= ~np.fromiter((c.isspace() for c in text), dtype=bool, count=n)
    usable[n] = True
    positions = np.arange(n + 1)
    following = np.minimum.accumulate(np.where(usable, positions, n)[::-1])[::-1]  # (char,) first usable at or after
    preceding = np.maximum.accumulate(np.where(usable[:n], positions[:n], -1))  # (char,) last usable at or before
    token_word, straddling = [], 0
    for span in token_spans:
        if span is None:
            token_word.append(-1)
            continue
        start, stop = min(max(span[0], 0), n), min(max(span[1], 0), n)
        first = following[start]
        if first < stop:  # the token holds a word's character
            token_word.append(int(char_word[first]))
            straddling += int(char_word[preceding[stop - 1]] != char_word[first])
        elif first < n:  # spaces only: the next word
            token_word.append(int(char_word[first]))
        else:  # spaces at the end: the last word
            token_word.append(int(char_word[preceding[start - 1]]) if start > 0 and preceding[start - 1] >= 0 else -1)
    given = set(token_word)
    return token_word, straddling, [w for w in range(len(word_spans)) if w not in given]
