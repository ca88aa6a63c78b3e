"""Words of a treebank for a batch of tokens: which word each token belongs to, and each word's gold head.

For a CoNLL-U corpus each sentence is tokenised from its syntactic words (`encode_words`), so every token
belongs to one word; a `WordAlignment` carries, for a batch, each token's word and each word's gold head and
relation (UD relations, subtypes folded into their base: `relation_id`). The syntax metric
(`headscan.metrics.syntax`) reads them.

This module does not score heads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..errors import CorpusError

__all__ = ["RELATIONS", "DIRECTIONS", "ROOT", "WordAlignment", "relation_id", "encode_words", "word_alignment"]

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
    ([[-1, 0, 0, 1, -1]], [[1, -2]], [[27, -1]], 'nsubj')
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
        root = present[1:] & (gold == 0)  # a root word with a token: Clark et al. count it as a miss in "all"
        head[row, : len(gold)] = np.where(scored, gold - 1, np.where(root, ROOT, -1))
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
