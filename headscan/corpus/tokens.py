"""Tokenising a corpus for one model, and batching it: each segment with the model's own special tokens.

Segments are tokenised per model with its own special tokens ([CLS] ... [SEP] for BERT-family encoders, BOS
for decoders that use one), truncated to ``max_len`` tokens (or split into windows), and right-padded into
batches. A CoNLL-U segment is tokenised from its own text, exactly as a line of a plain-text corpus would be,
and each token is given to a word by character offsets (`headscan.corpus.words.align_tokens`).

This module does not run models: it uses their tokenizers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConfigError
from .conllu import surface_spans
from .text import Corpus
from .words import align_tokens, word_alignment

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
    missing: tuple[tuple[int, ...], ...] = ()  # the sequence's words of the text that no token went to (misses)
    n_straddling: int = 0  # tokens whose characters lie in two words or more (given to the first)
    n_words_without_token: int = 0  # words of the segments' texts that no token went to

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
    if corpus.kind == "conllu":  # as a text line would be, then tokens to words by characters (the syntax table needs it)
        encoded, word_ids, missing, straddling = _aligned_token_ids(model, segments)
    else:
        # The model decides the special tokens: BOS exactly when it says so, whatever its tokenizer does alone.
        encoded, word_ids, missing, straddling = model.token_ids([s.text for s in segments]), None, None, 0
    out, owner, words_of, lost_words, n_truncated, lost = [], [], [], [], 0, 0
    encoder = model.family == "bidirectional"
    for position, ids in enumerate(encoded):
        word = word_ids[position] if word_ids is not None else ids  # walks beside the ids; dropped when not CoNLL-U
        if len(ids) <= max_len:
            out.append(tuple(ids))
            words_of.append(tuple(word))
            lost_words.append(tuple(missing[position]) if missing is not None else ())
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
        for sequence, pieces in ((ids, out), (word, words_of)):
            pieces.extend(tuple(sequence[:n_open]) + tuple(sequence[start:min(start + room, len(sequence) - n_close)])
                          + tuple(sequence[len(sequence) - n_close:]) for start in starts)
        if missing is not None:  # a piece counts the tokenless words among those it holds
            pieces = words_of[len(words_of) - len(starts):]
            whole = long == "split"  # the pieces hold every word between them; a cut segment loses its end
            lost_words.extend(_held(piece, missing[position], k == 0, whole and k == len(pieces) - 1)
                              for k, piece in enumerate(pieces))
        owner.extend([position] * len(starts))
    if word_ids is None:
        return EncodedCorpus(tuple(out), n_truncated, max_len, lost, tuple(owner))
    trees = tuple((segments[p].heads, segments[p].deprels) for p in owner)
    return EncodedCorpus(tuple(out), n_truncated, max_len, lost, tuple(owner), tuple(words_of), trees,
                         tuple(lost_words), straddling, sum(map(len, missing)))


def _aligned_token_ids(model, segments) -> tuple[list[list[int]], list[list[int]], list[list[int]], int]:
    """Token ids of each segment's text exactly as a plain-text sweep feeds them, each token's word, the words
    no token went to, and how many tokens straddle two words (`headscan.corpus.words.align_tokens`)."""
    ids, word_ids, missing, straddling = [], [], [], 0
    for segment, (tokens, spans) in zip(segments, model.token_spans([s.text for s in segments])):
        words = segment.spans or _word_spans(segment)
        token_word, straddles, without = align_tokens(segment.text, spans, words)
        ids.append(tokens)
        word_ids.append(token_word)
        missing.append(without)
        straddling += straddles
    return ids, word_ids, missing, straddling


def _word_spans(segment) -> tuple[tuple[int, int], ...]:
    """The words' characters of a segment made by hand with words but without their spans: found in order."""
    surfaces = [(word, range(i, i + 1), True) for i, word in enumerate(segment.words)]
    return surface_spans(segment.text, list(segment.words), surfaces)[0]


def _held(word_ids: tuple[int, ...], missing: list[int], first: bool, last: bool) -> tuple[int, ...]:
    """The tokenless words of a piece of a cut segment: those between the words it holds, and those before
    them in the `first` piece and after them in the `last`."""
    present = [w for w in word_ids if w >= 0]
    if not present:
        return ()
    low = -1 if first else min(present)
    high = max(missing, default=0) + 1 if last else max(present)
    return tuple(w for w in missing if low < w < high)


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
        # one generator per segment, keyed by its document (its index in the whole corpus): the same segment gets
        # the same tokens whatever the batch size, and whatever part of the corpus it is swept in
        rng = np.random.default_rng([seed, corpus.segments[index].document])
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
                                   [encoded.trees[i][1] for i in chosen], width, [encoded.missing[i] for i in chosen])
        yield Batch(torch.tensor(chosen, dtype=torch.long), ids, mask, words)
