"""Syntactic heads on gold treebanks (Clark et al. 2019): is a head's most-attended word the word's syntactic head?

For a CoNLL-U corpus each sentence is tokenised from its syntactic words (`encode_words`), so every token
belongs to one word; a `WordAlignment` carries, for a batch, each token's word and each word's gold head and
relation. Per layer, `dependency_accuracy` turns the token pattern into word attention and scores every head;
`offset_baseline` scores the fixed-offset baseline on the same words. Both return per-segment sums and counts,
so the sweep adds them up and bootstraps them like every metric.

The method, as in Clark et al.'s ``Syntax_Analysis.ipynb`` and ``bpe_utils.py``, and where it departs:

- Word attention: attention *to* a word is the sum over its tokens; attention *from* a word is the mean over
  its tokens (the ``mean`` mode the paper uses; the code's default, ``first``, keeps the first token's row).
  The mean is used because "first" lets a byte-level BPE word's leading space token, or a WordPiece word's
  first piece, speak for the whole word.
- Special tokens ([CLS], [SEP], BOS) and the word itself are removed before the argmax, without
  renormalising; ties go to the earlier word (numpy's argmax, as theirs).
- ``dependent_to_head``: correct when the dependent's most-attended word is its gold head.
  ``head_to_dependent`` is the notebook's transpose: correct when the gold head is the word that gives the
  dependent the most attention (the argmax over the dependent's *column*). Both count each dependent once.
- A word that gives (or, transposed, gets) no attention at all to (from) any other word predicts nothing
  and scores a miss; with softmax attention this happens only in causal models (the first word sees no
  other word, nobody looks at the last one). Clark's argmax would pick the first word.
- Baseline: the best single offset d in -3..2 per relation and direction, on the same words. ``d`` is
  where the attended word sits relative to the attending word, as in the offset profile: for
  ``dependent_to_head`` it predicts head = dependent + d, for ``head_to_dependent`` dependent = head + d.
  So a perfect previous-token head scores exactly the baseline at d = -1 in both directions. An offset
  that falls outside the sentence is a miss (Clark clamps to the root or the last word). Ties go to the
  larger offset, as Clark's ``max((score, offset))``.
- Relations: UD universal relations, subtypes folded into their base (``obl:tmod`` -> ``obl``,
  ``nmod:poss`` -> ``nmod``; so Clark's special case for ``poss`` has nothing to apply to), plus ``all``.
  Root words have no head word and are never counted; ``all`` counts every other word, punctuation
  included. A label that is not a UD relation counts in ``all`` only.
- Words with no token (cut off by ``max_len``) are neither scored nor anyone's predicted head.

This module does not run models or read treebanks: `headscan.corpus` reads the words, heads and relations,
and the sweep hands each layer's pattern here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ..errors import CorpusError
from .attention import METRICS, AttentionBatch, Axis, register

__all__ = ["RELATIONS", "DIRECTIONS", "BASELINE_OFFSETS", "COLUMNS", "WordAlignment", "relation_id", "encode_words",
           "word_alignment", "word_attention", "most_attended", "dependency_accuracy", "accuracy_of", "offset_baseline",
           "best_baseline", "attach_baseline", "syntax_metric"]

# UD v2 universal relations (https://universaldependencies.org/u/dep/) without "root", which has no head word.
UD_RELATIONS = ("acl", "advcl", "advmod", "amod", "appos", "aux", "case", "cc", "ccomp", "clf", "compound", "conj",
                "cop", "csubj", "dep", "det", "discourse", "dislocated", "expl", "fixed", "flat", "goeswith", "iobj",
                "list", "mark", "nmod", "nsubj", "nummod", "obj", "obl", "orphan", "parataxis", "punct",
                "reparandum", "vocative", "xcomp")
RELATIONS: tuple[str, ...] = ("all", *UD_RELATIONS)  # the relation inventory; a relation id indexes it
DIRECTIONS: tuple[str, ...] = ("dependent_to_head", "head_to_dependent")
BASELINE_OFFSETS: tuple[int, ...] = tuple(range(-3, 3))  # Clark et al.'s range(-3, 3)
# The last axis of `dependency_accuracy` and `offset_baseline`: every relation, first in one direction, then the other.
COLUMNS: tuple[tuple[str, str], ...] = tuple((relation, direction) for direction in DIRECTIONS for relation in RELATIONS)

_RELATION_IDS = {name: i for i, name in enumerate(RELATIONS) if name != "all"}


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
    head: torch.Tensor  # (batch, word) long: the gold head word, -1 for the root, padding, and words not scored
    relation: torch.Tensor  # (batch, word) long: index into RELATIONS, -1 when not a UD relation (or padding)

    @property
    def n_words(self) -> int:
        return self.head.shape[-1]

    def to(self, device) -> WordAlignment:
        return WordAlignment(self.token_word.to(device), self.head.to(device), self.relation.to(device))


def word_alignment(
    word_ids: Sequence[Sequence[int | None]],
    heads: Sequence[Sequence[int]],
    deprels: Sequence[Sequence[str]],
    width: int | None = None,
) -> WordAlignment:
    """The `WordAlignment` of a batch of segments, right-padded to `width` tokens (default: the longest).

    `word_ids` are each segment's ``BatchEncoding.word_ids()`` (None or -1 for special tokens), after any BOS
    and truncation; `heads` are CoNLL-U HEADs (1-based, 0 for the root) and `deprels` the DEPRELs.

    >>> words = word_alignment([[None, 0, 0, 1, None]], [[2, 0]], [["nsubj:pass", "root"]])
    >>> words.token_word.tolist(), words.head.tolist(), words.relation.tolist(), RELATIONS[27]
    ([[-1, 0, 0, 1, -1]], [[1, -1]], [[27, -1]], 'nsubj')
    """
    n_words = max((len(h) for h in heads), default=0)
    width = max((len(w) for w in word_ids), default=0) if width is None else width
    token_word = np.full((len(word_ids), width), -1, dtype=np.int64)
    head = np.full((len(word_ids), n_words), -1, dtype=np.int64)
    relation = np.full((len(word_ids), n_words), -1, dtype=np.int64)
    for row, (ids, gold, labels) in enumerate(zip(word_ids, heads, deprels, strict=True)):
        if len(ids) > width:
            raise CorpusError(f"segment {row} has {len(ids)} tokens, more than the batch width {width}")
        if len(gold) != len(labels):
            raise CorpusError(f"segment {row} has {len(gold)} HEADs but {len(labels)} DEPRELs; give one of each per word")
        ids = np.array([-1 if i is None else i for i in ids], dtype=np.int64)
        if ids.size and ids.max() >= len(gold):
            raise CorpusError(f"segment {row}: a token belongs to word {ids.max()} but the sentence has {len(gold)} "
                              f"words; tokenise the segment from its CoNLL-U words")
        token_word[row, : len(ids)] = ids
        present = np.zeros(len(gold) + 1, dtype=bool)  # word index + 1, so that the root (0) is never present
        present[ids[ids >= 0] + 1] = True
        gold = np.asarray(gold, dtype=np.int64)
        scored = present[1:] & present[gold]  # the word and its head both have a token (the root has none)
        head[row, : len(gold)] = np.where(scored, gold - 1, -1)
        relation[row, : len(gold)] = [relation_id(label) for label in labels]
    return WordAlignment(torch.from_numpy(token_word), torch.from_numpy(head), torch.from_numpy(relation))


# --- tokenising from words ---------------------------------------------------------------------------------


def _word_backend(tokenizer):
    """A `tokenizers.Tokenizer` that encodes a list of words with a space before each one where that matters.

    Byte-level BPE (GPT-2, Llama 3, SmolLM2) spells a word after a space differently ("Ġworld" vs "world");
    Hugging Face's ``add_prefix_space=True`` gives each pre-split word that space, but only where the
    tokenizer was built with it, and transformers 5 tokenisers without it accept ``is_split_into_words``
    silently and glue the words together. So the backend is copied (the model's own tokenizer is not
    touched) with a ``Prepend(" ")`` normaliser, which puts one space before each word as add_prefix_space
    does, also where the ByteLevel step sits behind a regex Split. Other tokenizers (WordPiece, SentencePiece's
    Metaspace) are used as they are: they already start each word afresh. The copy neither pads nor truncates,
    whatever the tokenizer.json says.
    """
    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise CorpusError(f"{type(tokenizer).__name__} is not a fast (Rust) tokenizer, so it cannot report which "
                          f"word each token belongs to; load the model with its fast tokenizer")
    spec = json.loads(backend.to_str())
    spec["padding"] = spec["truncation"] = None  # a tokenizer.json may pad or cut every encoding; we do neither
    if _needs_prefix_space(spec.get("pre_tokenizer")):
        prepend = {"type": "Prepend", "prepend": " "}
        normalizer = spec.get("normalizer")
        spec["normalizer"] = prepend if normalizer is None else {"type": "Sequence", "normalizers": [normalizer, prepend]}
    return Tokenizer.from_str(json.dumps(spec))


def _needs_prefix_space(pre_tokenizer) -> bool:
    """Whether a pre-tokenizer (its JSON) is byte-level without a prefix space of its own."""
    if not isinstance(pre_tokenizer, dict):
        return False
    if pre_tokenizer.get("type") == "ByteLevel":
        return not pre_tokenizer.get("add_prefix_space", False)
    return any(_needs_prefix_space(p) for p in pre_tokenizer.get("pretokenizers", []))


def encode_words(tokenizer, sentences: Sequence[Sequence[str]], *, add_special_tokens: bool = True
                 ) -> list[tuple[list[int], list[int]]]:
    """Token ids of each sentence given as its words, and each token's word (-1 for special tokens).

    The equivalent of ``tokenizer(words, is_split_into_words=True)`` and its ``word_ids()``, with the prefix
    space byte-level BPE needs (see `_word_backend`). `add_special_tokens` adds the tokenizer's own ([CLS]
    ... [SEP]); a causal model's BOS is the caller's (give it word -1). Never truncates. A word the tokenizer
    turns into no token at all (BERT's normaliser drops control characters) is simply absent: it is neither
    scored nor predicted (see `word_alignment`).
    """
    backend = _word_backend(tokenizer)
    sentences = [list(words) for words in sentences]
    encodings = backend.encode_batch(sentences, is_pretokenized=True, add_special_tokens=add_special_tokens)
    return [(list(e.ids), [-1 if w is None else w for w in e.word_ids]) for e in encodings]


# --- word attention and accuracy ---------------------------------------------------------------------------


def word_attention(pattern: torch.Tensor, token_word: torch.Tensor, n_words: int, query_start: int = 0) -> torch.Tensor:
    """(batch, head, word, word) attention from word i to word j: the mean over i's tokens of the sum over j's.

    Tokens of no word (special tokens, padding) are dropped as queries and as keys, without renormalising.
    `pattern` may hold only the rows of queries ``query_start ..`` (a block of chunked attention): the result
    is then those rows' share, and the shares of consecutive blocks add up to the whole.

    >>> pattern = torch.tensor([[[[1.0, 0, 0, 0],   # BOS
    ...                           [0.5, 0.5, 0, 0],  # "cat": word 0
    ...                           [0.1, 0.6, 0.3, 0],  # "sle": word 1 ...
    ...                           [0.1, 0.2, 0.3, 0.4]]]])  # "pt": ... of two tokens
    >>> word_attention(pattern, torch.tensor([[-1, 0, 1, 1]]), 2)  # word 1 to word 0: (0.6 + 0.2) / 2
    tensor([[[[0.5000, 0.0000],
              [0.4000, 0.5000]]]])
    >>> blocks = word_attention(pattern[:, :, :3], torch.tensor([[-1, 0, 1, 1]]), 2) + \\
    ...     word_attention(pattern[:, :, 3:], torch.tensor([[-1, 0, 1, 1]]), 2, query_start=3)
    >>> torch.equal(blocks, word_attention(pattern, torch.tensor([[-1, 0, 1, 1]]), 2))
    True
    """
    stop = query_start + pattern.shape[-2]
    is_word = token_word >= 0  # (batch, seq)
    keep = is_word[:, None, query_start:stop, None] & is_word[:, None, None, :]  # (batch, 1, block, k)
    zero = torch.zeros((), dtype=pattern.dtype, device=pattern.device)
    pattern = torch.where(keep, pattern, zero)  # where(), not a product: padding may hold NaN
    members = (token_word[..., None] == torch.arange(n_words, device=token_word.device)).to(pattern.dtype)  # (batch, seq, word)
    to_word = pattern @ members[:, None]  # (batch, head, block, word): summed over the key word's tokens
    mean = members / members.sum(1, keepdim=True).clamp_min(1)  # (batch, seq, word): 1/n over the word's tokens
    return mean[:, query_start:stop].transpose(1, 2)[:, None] @ to_word  # (batch, head, word, word)


def most_attended(attention: torch.Tensor) -> torch.Tensor:
    """(batch, head, word) the other word with the largest weight in each row of `attention` (batch, head, word,
    word); -1 where the row has no weight on any other word. Ties go to the earlier word.

    >>> most_attended(torch.tensor([[[[0.9, 0.1, 0.0], [0.0, 1.0, 0.0], [0.3, 0.3, 0.4]]]]))
    tensor([[[ 1, -1,  0]]])
    """
    n = attention.shape[-1]
    self_word = torch.eye(n, dtype=torch.bool, device=attention.device)
    others = attention.masked_fill(self_word, 0.0)  # a new tensor; weights are >= 0, so 0 removes the word
    top = others.argmax(-1)  # the first maximal value, as numpy's argmax
    largest = others.gather(-1, top[..., None])[..., 0]
    return torch.where(largest > 0, top, -1)


def _relation_members(words: WordAlignment, dtype: torch.dtype) -> torch.Tensor:
    """(batch, word, relation) 1 where the word is scored and has the relation; column 0 ("all"): every scored word."""
    scored = words.head >= 0  # (batch, word)
    ids = torch.arange(len(RELATIONS), device=words.head.device)
    members = (words.relation[..., None] == ids) | (ids == 0)  # "all" (id 0) is never a word's own relation
    return (members & scored[..., None]).to(dtype)


def dependency_accuracy(pattern: torch.Tensor, words: WordAlignment) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-segment sums and counts of correct predictions, (batch, head, len(COLUMNS)) each.

    `pattern` (batch, head, q, k) is one layer's attention as the model computed it (not renormalised).
    Column ``(relation, direction)`` of `COLUMNS`: sums count the dependents of that relation whose gold head
    the head predicts (see the module docstring for both directions), counts the dependents.
    """
    return accuracy_of(word_attention(pattern, words.token_word, words.n_words), words)


def accuracy_of(attention: torch.Tensor, words: WordAlignment) -> tuple[torch.Tensor, torch.Tensor]:
    """`dependency_accuracy` from the word attention (batch, head, word, word), summed over blocks if chunked."""
    members = _relation_members(words, attention.dtype)  # (batch, word, relation)
    gold = words.head[:, None, :]  # (batch, 1, word)
    sums = []
    for predicted in (most_attended(attention), most_attended(attention.transpose(-1, -2))):  # the two directions
        correct = ((predicted == gold) & (gold >= 0)).to(attention.dtype)  # (batch, head, word)
        sums.append(correct @ members)  # (batch, head, relation)
    sums = torch.cat(sums, -1)  # (batch, head, column)
    counts = members.sum(1).repeat(1, len(DIRECTIONS))[:, None, :].expand_as(sums)  # (batch, head, column)
    return sums, counts


def offset_baseline(words: WordAlignment, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-segment sums and counts of the fixed-offset baseline, (batch, len(BASELINE_OFFSETS), len(COLUMNS)).

    Offset d predicts, for ``dependent_to_head``, head = dependent + d, and for ``head_to_dependent``,
    dependent = head + d (the attending word looks d words away). Counts equal `dependency_accuracy`'s.
    """
    members = _relation_members(words, dtype)  # (batch, word, relation)
    position = torch.arange(words.n_words, device=words.head.device)  # (word,)
    offsets = torch.tensor(BASELINE_OFFSETS, device=words.head.device)[:, None]  # (offset, 1)
    gold = words.head[:, None, :]  # (batch, 1, word)
    sums = torch.cat([
        (gold == position + offsets).to(dtype) @ members,  # (batch, offset, relation): head = dependent + d
        (gold == position - offsets).to(dtype) @ members,  # dependent = head + d
    ], -1)
    counts = members.sum(1).repeat(1, len(DIRECTIONS))[:, None, :].expand_as(sums)
    return sums, counts


def best_baseline(sums: torch.Tensor | np.ndarray, counts: torch.Tensor | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The best offset's accuracy and the offset, per column, from corpus totals (offset, column).

    NaN and offset 0 where a column has no dependent. Ties go to the larger offset (Clark's ``max``).

    >>> best_baseline(np.array([[1.0, 0], [3, 0], [3, 0], [0, 0], [0, 0], [0, 0]]), np.full((6, 2), 4.0))
    (array([0.75, 0.  ]), array([-1,  2]))
    """
    sums, counts = np.asarray(sums, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = np.where(counts > 0, sums / counts, -np.inf)  # (offset, column)
    last = accuracy.shape[0] - 1 - np.argmax(accuracy[::-1], axis=0)  # the largest offset among the best
    best = np.take_along_axis(accuracy, last[None], 0)[0]
    defined = np.isfinite(best)
    offsets = np.where(defined, np.asarray(BASELINE_OFFSETS)[last], 0)
    return np.where(defined, best, np.nan), offsets


def attach_baseline(frame: pd.DataFrame, sums, counts) -> pd.DataFrame:
    """`frame` (rows keyed by relation and direction) with ``baseline`` and ``baseline_offset`` columns.

    `sums` and `counts` are `offset_baseline`'s totals over the corpus, (offset, column).
    """
    value, offset = best_baseline(sums, counts)
    baseline = pd.DataFrame({"relation": [r for r, _ in COLUMNS], "direction": [d for _, d in COLUMNS],
                             "baseline": value, "baseline_offset": offset})
    return frame.drop(columns=["baseline", "baseline_offset"], errors="ignore").merge(
        baseline, on=["relation", "direction"], how="left", validate="many_to_one")


# --- registration ------------------------------------------------------------------------------------------


def syntax_metric(batch: AttentionBatch):
    """Share of dependents whose gold head is the head's most-attended word (Clark et al. 2019), per relation.

    Word attention: to a word, the sum over its tokens; from a word, the mean over its tokens; special tokens
    and the word itself are removed before the argmax, without renormalising. ``dependent_to_head``: the
    dependent's most-attended word is its head; ``head_to_dependent``: the head is the word that attends most
    to the dependent. Relations are UD's, subtypes folded into their base, plus ``all`` (every word but the
    root). Swept over CoNLL-U corpora only, with the corpus's own words.
    """
    if batch.words is None:
        b, h = batch.pattern.shape[:2]
        zeros = torch.zeros((b, h, len(COLUMNS)), dtype=batch.pattern.dtype, device=batch.pattern.device)
        return zeros, zeros
    raw = batch.raw_pattern  # before specials="exclude" renormalised it: Clark removes specials without renormalising
    return dependency_accuracy(batch.pattern if raw is None else raw, batch.words.to(batch.pattern.device))


# Registered on import; `headscan.scan` imports this module, and sweeps the metric only over CoNLL-U corpora.
register("syntax", unit="share of dependents", table="syntax",
         axis=Axis(("relation", "direction"), lambda config: list(COLUMNS)))(syntax_metric)
