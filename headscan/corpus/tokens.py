"""Tokenising a corpus for one model, and batching it: each segment with the model's own special tokens.

Segments are tokenised per model with its own special tokens ([CLS] ... [SEP] for BERT-family encoders, BOS
for decoders that use one), truncated to ``max_len`` tokens (or split into windows), and right-padded into
batches. A CoNLL-U segment is tokenised from its gold words (`headscan.corpus.words`), so that every token
belongs to one word.

This module does not run models: it uses their tokenizers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from ..errors import ConfigError
from .text import Corpus
from .words import encode_words, word_alignment

__all__ = ["EncodedCorpus", "encode", "batches", "Batch"]


@dataclass(frozen=True)
class EncodedCorpus:
    """A corpus tokenised for one model."""

    token_ids: tuple[tuple[int, ...], ...]  # one tuple per sequence fed to the model, special tokens included
    n_truncated: int  # segments longer than max_len (cut, or split into several sequences)
    max_len: int
    n_tokens_lost: int = 0  # tokens cut off those segments (0 when they are split)
    owner: tuple[int, ...] = ()  # for each sequence, the position of its segment among those encoded; () = itself
    # CoNLL-U only (else empty): each sequence's token -> word (-1 for special tokens), and its sentence's tree
    word_ids: tuple[tuple[int, ...], ...] = ()
    trees: tuple[tuple[tuple[int, ...], tuple[str, ...]], ...] = ()  # (HEADs, DEPRELs) of the sequence's sentence

    @property
    def n_tokens(self) -> int:
        return sum(map(len, self.token_ids))

    def segment_of(self, sequence: int) -> int:
        """The position, among the segments encoded, of the segment that `sequence` comes from."""
        return self.owner[sequence] if self.owner else sequence


def _special_ids(tokenizer) -> set[int]:
    return {int(i) for i in getattr(tokenizer, "all_special_ids", []) if i is not None}


def encode(corpus: Corpus, model, max_len: int, indices: list[int] | None = None, long: str = "truncate") -> EncodedCorpus:
    """Tokenise the segments at `indices` (all by default) for `model` (a `headscan.models.HookedModel`).

    A segment longer than `max_len` tokens is cut to `max_len` (``long="truncate"``), or split into
    consecutive windows of at most `max_len` tokens, each with the model's own special tokens
    (``long="split"``): nothing is lost, and every window counts toward its segment's bootstrap unit.
    """
    max_len = min(max_len, model.max_context)
    indices = range(len(corpus.segments)) if indices is None else indices
    bos = model.special_token_ids["bos"] if model.prepend_bos else None
    if corpus.kind == "repeat-random":
        ids, n_truncated = _repeat_random_ids(corpus, model, max_len, bos, indices)
        return EncodedCorpus(ids, n_truncated, max_len)
    segments = [corpus.segments[i] for i in indices]
    if corpus.kind == "conllu":
        # From the treebank's words, so that every token belongs to one word (the syntax table needs it).
        encoded, word_ids = _word_token_ids(model, [s.words for s in segments])
    else:
        # The model decides the special tokens: BOS exactly when it says so, whatever its tokenizer does alone.
        encoded, word_ids = model.token_ids([s.text for s in segments]), None
    out, owner, words, n_truncated, lost = [], [], [], 0, 0
    encoder = model.family == "bidirectional"
    for position, ids in enumerate(encoded):
        word = word_ids[position] if word_ids is not None else ids  # walks beside the ids; dropped when not CoNLL-U
        if len(ids) <= max_len:
            out.append(tuple(ids))
            words.append(tuple(word))
            owner.append(position)
            continue
        n_truncated += 1
        # the special tokens around a segment: [CLS] ... [SEP] for encoders, BOS for decoders fed one
        n_open = 1 if encoder or model.prepend_bos else 0
        n_close = 1 if encoder else 0
        room = max_len - n_open - n_close
        if long == "split" and room > 0:
            starts = range(n_open, len(ids) - n_close, room)
        else:  # keep the closing [SEP] of encoders: the model never sees a segment without one
            starts = [n_open]
            lost += len(ids) - max_len
        for sequence, pieces in ((ids, out), (word, words)):
            pieces.extend(tuple(sequence[:n_open]) + tuple(sequence[start:min(start + room, len(sequence) - n_close)])
                          + tuple(sequence[len(sequence) - n_close:]) for start in starts)
        owner.extend([position] * len(starts))
    if word_ids is None:
        return EncodedCorpus(tuple(out), n_truncated, max_len, lost, tuple(owner))
    trees = tuple((segments[p].heads, segments[p].deprels) for p in owner)
    return EncodedCorpus(tuple(out), n_truncated, max_len, lost, tuple(owner), tuple(words), trees)


def _word_token_ids(model, sentences: list[tuple[str, ...]]) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of sentences given as words, with the special tokens a sweep feeds, and each token's word."""
    pairs = encode_words(model.tokenizer, sentences, add_special_tokens=not model.causal)
    opening = [model.special_token_ids["bos"]] if model.causal and model.prepend_bos else []
    ids = [opening + list(tokens) for tokens, _ in pairs]
    words = [[-1] * len(opening) + list(word) for _, word in pairs]
    return ids, words


def _repeat_random_ids(corpus: Corpus, model, max_len: int, bos: int | None, indices):
    n, seed = corpus.options["n"], corpus.options["seed"]
    cls, sep = model.special_token_ids["cls"], model.special_token_ids["sep"]
    opening = [t for t in (bos, cls) if t is not None]
    closing = [sep] if sep is not None else []
    if len(opening) + 2 * n + len(closing) > max_len:
        raise ConfigError(
            f"repeat-random with n={n} needs {len(opening) + 2 * n + len(closing)} tokens for {model.name}, "
            f"more than --max-len {max_len}; lower n or raise --max-len"
        )
    special = _special_ids(model.tokenizer)
    vocab = np.array([i for i in range(min(model.vocab_size, len(model.tokenizer))) if i not in special])
    out = []
    for index in indices:
        # one generator per segment: the same segment gets the same tokens whatever the batch size
        rng = np.random.default_rng([seed, index])
        half = rng.choice(vocab, size=n, replace=False).tolist()
        out.append(tuple(opening + half + half + closing))
    return tuple(out), 0


@dataclass(frozen=True)
class Batch:
    """Right-padded segments ready for the model."""

    index: torch.Tensor  # (batch,) positions of the sequences among those encoded
    input_ids: torch.Tensor  # (batch, seq)
    attention_mask: torch.Tensor  # (batch, seq) 1 for real tokens, 0 for padding
    words: object = None  # CoNLL-U: the batch's `headscan.corpus.words.WordAlignment`, else None

    @property
    def n_tokens(self) -> int:
        return int(self.attention_mask.sum())


def batches(encoded: EncodedCorpus, batch_size: int, pad_id: int) -> Iterator[Batch]:
    """Batches of `batch_size` segments of similar length (less padding), right-padded with `pad_id`.

    Scores do not depend on this grouping: the sweep masks padding and keys each segment by its index.
    """
    order = sorted(range(len(encoded.token_ids)), key=lambda i: (len(encoded.token_ids[i]), i))
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        width = max(len(encoded.token_ids[i]) for i in chosen)
        ids = torch.full((len(chosen), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(chosen), width), dtype=torch.long)
        for row, i in enumerate(chosen):
            tokens = encoded.token_ids[i]
            ids[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            mask[row, : len(tokens)] = 1
        words = None
        if encoded.trees:
            words = word_alignment([encoded.word_ids[i] for i in chosen], [encoded.trees[i][0] for i in chosen],
                                   [encoded.trees[i][1] for i in chosen], width)
        yield Batch(torch.tensor(chosen, dtype=torch.long), ids, mask, words)
