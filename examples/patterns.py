"""Two patterns of one's own, swept like headscan's metrics (docs/custom-metrics.md):

    headscan sweep --metric-module examples/patterns.py --corpus ../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu

Each is a function of one batch of segments (`headscan.metrics.custom.Segments`) that returns, for every query
and key, whether the key is where the head should look: (batch, q, k) bool. headscan scores the head's mean
attention there, its chance (uniform attention's share on the same keys), interval, null and finding.
"""

import unicodedata

import torch

import headscan


def _punctuation(text: str) -> bool:
    text = text.strip()
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


@headscan.pattern("prev_punct")
def previous_punctuation(s):
    """Attention on the closest punctuation mark before the query: the last earlier token whose text, stripped
    of spaces, is made of Unicode punctuation only (category P). Counts the real queries that have one."""
    return s.latest(s.token_flags(_punctuation))  # (batch, q, k)


@headscan.pattern("word_start")
def first_piece_of_own_word(s):
    """Attention on the first token of the query's own gold word, from the word's later tokens (CoNLL-U corpora
    only: elsewhere no query has a target and the score is NaN). Counts the real queries that are not the first
    token of their word."""
    shape = (len(s.tokens), len(s.query_positions), len(s.key_positions))
    if s.token_word is None:
        return torch.zeros(shape, dtype=torch.bool)
    word = s.token_word  # (batch, k): each token's gold word, -1 for specials and padding
    before = torch.nn.functional.pad(word, (1, 0), value=-1)[:, :-1]  # (batch, k): the previous token's word
    first = (word >= 0) & (word != before)  # (batch, k): the first token of its word
    query_word = word[:, s.query_positions]  # (batch, q)
    later_piece = (query_word >= 0) & ~first[:, s.query_positions]  # (batch, q)
    return first[:, None, :] & (word[:, None, :] == query_word[..., None]) & later_piece[..., None]
