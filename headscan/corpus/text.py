"""Corpora: read text into segments grouped in documents, tokenise them per model, and batch them with padding.

Sources (`read_corpus`):

- ``builtin``: 80 sentences that ship with headscan (``headscan/data/sample.txt``, CC0), so that a fresh
  install sweeps offline;
- a ``.conllu`` treebank: one segment per sentence (its ``# text =`` line), keeping the words, their
  dependency heads and relations for syntax scores;
- a ``.jsonl`` file: one JSON object per line, the segment in its ``text`` field;
- any other file: plain text, one segment per non-blank line;
- ``repeat-random``: a random token sequence of length ``n`` repeated twice (Olsson et al. 2022), drawn
  per model from its own vocabulary; options as ``repeat-random:n=50,count=64,seed=0``.

Files are read as a stream, never whole: `read_corpus` makes one pass over the file, line by line, that
computes its sha256, checks every segment, numbers the documents and keeps only an index of 40 bytes per
segment (`INDEX`: its byte range, first line, document and a digest of its bytes). `Corpus.segments` is then a
`FileSegments`, a read-only sequence that reads and parses a segment from the file when it is asked for,
consecutive segments in one read; if the file has changed since the pass, it raises `CorpusError` rather
than return other text. A `Corpus` made by hand holds a tuple of `Segment`s instead.

Documents, so that a bootstrap can resample whole documents rather than sentences: each segment carries the
0-based index of its document, and `Corpus.documents` says how they were found.

- CoNLL-U: a ``# newdoc`` (or ``# newdoc id = ...``) comment starts a document; sentences before the first one
  form document 0. A file without any ``# newdoc`` makes each sentence its own document.
- JSONL: with ``document_field="doc"``, consecutive lines with the same ``doc`` value form one document (every
  line must have the field); without it, each line is its own document.
- Plain text: paragraphs separated by blank lines; a file with no blank line between its segments makes each
  line its own document.
- ``builtin`` and ``repeat-random``: each segment is its own document.

Bad input raises `CorpusError` with one line that names the file, the line where there is one, and the fix:
missing, unreadable, empty, binary or non-UTF-8 files; JSONL lines that are not objects with a string text
field; CoNLL-U sentences with wrong columns, word IDs, HEADs or no words; a corpus with no text at all; a file
changed after it was read. A UTF-8 byte order mark is accepted. Settings (``limit``, ``max_len``,
``batch_size``) are checked once by `headscan.config.SweepConfig`; the functions here trust them.

Segments are tokenised per model with its own special tokens ([CLS] ... [SEP] for BERT-family encoders,
BOS for decoders that use one), truncated to ``max_len`` tokens, and right-padded into batches.

This module does not run models.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from ..errors import ConfigError, CorpusError
from .files import EACH_SEGMENT, CorpusFile, FileSegments, Segment, file_error, open_corpus, scan, segment, unreadable

__all__ = ["Segment", "Corpus", "FileSegments", "read_corpus", "pack_corpus", "EncodedCorpus", "encode", "batches",
           "Batch"]

REPEAT_RANDOM_DEFAULTS = {"n": 50, "count": 64, "seed": 0}

# One record per segment of a corpus file: 40 bytes.


@dataclass(frozen=True)
class Corpus:
    """Segments read from one source, with what provenance needs.

    >>> corpus = read_corpus("builtin", limit=3)
    >>> corpus.documents, corpus.n_documents, [s.document for s in corpus.segments]
    ('none: each segment is its own document', 3, [0, 1, 2])
    """

    source: str  # the path as given, "builtin", or the repeat-random spec
    kind: str  # "builtin", "conllu", "jsonl", "text" or "repeat-random"
    sha256: str  # of the file's bytes (of the spec for repeat-random)
    segments: Sequence[Segment]  # a tuple, or a `FileSegments` that reads each segment from its file when asked
    options: dict = field(default_factory=dict)  # repeat-random: n, count, seed
    documents: str = "as given by each segment's document field"  # how the documents were found

    @cached_property
    def segment_documents(self) -> np.ndarray:
        """The document of each segment, (segment,) int64, read from the index of a file: no segment is parsed.

        >>> read_corpus("builtin", limit=4).segment_documents.tolist()
        [0, 1, 2, 3]
        """
        if isinstance(self.segments, FileSegments):
            return self.segments.documents
        documents = np.fromiter((s.document for s in self.segments), dtype=np.int64, count=len(self.segments))
        documents.flags.writeable = False
        return documents

    @property
    def n_documents(self) -> int:
        return len(np.unique(self.segment_documents))

    def provenance(self) -> dict:
        return {
            "source": self.source, "kind": self.kind, "sha256": self.sha256, "n_segments": len(self.segments),
            "documents": self.documents, "n_documents": self.n_documents, **self.options,
        }


def _parse_repeat_random(spec: str) -> dict:
    options = dict(REPEAT_RANDOM_DEFAULTS)
    _, _, rest = spec.partition(":")
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key not in options or not value.isdigit():
            raise CorpusError(
                f"corpus {spec!r}: bad option {item!r}; use repeat-random:n=50,count=64,seed=0 "
                f"(whole numbers; options {', '.join(options)})"
            )
        options[key] = int(value)
    if options["n"] < 2 or options["count"] < 1:
        raise CorpusError(f"corpus {spec!r}: needs n >= 2 and count >= 1")
    return options


def read_corpus(
    source: str | Path = "builtin",
    *,
    limit: int | None = None,
    text_field: str = "text",
    document_field: str | None = None,
) -> Corpus:
    """Read `source` into a `Corpus` of at most `limit` segments (the first ones; the last document may be cut).

    `text_field` and `document_field` name the JSONL fields that hold each line's text and its document;
    without `document_field` each JSONL line is its own document. The file is read in one pass that checks
    all of it; its segments are read again from it when asked for (see `FileSegments`).

    >>> corpus = read_corpus("builtin", limit=2)
    >>> corpus.kind, len(corpus.segments), corpus.segments[0].text[:24]
    ('builtin', 2, 'The old lighthouse keepe')
    >>> read_corpus("repeat-random:n=10,count=3").options
    {'n': 10, 'count': 3, 'seed': 0}
    """
    source = str(source)
    if source == "repeat-random" or source.startswith("repeat-random:"):
        options = _parse_repeat_random(source)
        count = options["count"] if limit is None else min(limit, options["count"])
        options["count"] = count
        spec = f"repeat-random:n={options['n']},count={count},seed={options['seed']}"
        segments = tuple(Segment("", 0, document=i) for i in range(count))  # tokens are drawn per model in `encode`
        return Corpus(spec, "repeat-random", hashlib.sha256(spec.encode()).hexdigest(), segments, options, EACH_SEGMENT)
    if source == "builtin":
        path = Path("builtin")
        if document_field is not None:
            raise file_error(path, None, f"document_field={document_field!r} applies to .jsonl files only; leave it out")
        data = resources.files("headscan").joinpath("data/sample.txt").read_bytes()  # 80 lines: kept as a tuple
        sha256, index, documents, _ = scan(path, io.BytesIO(data), "builtin", text_field, None, limit)
        segments = tuple(segment(path, "builtin", text_field, data[start:stop], line, document)
                         for start, stop, line, document, _ in index.tolist())
        return Corpus(source, "builtin", sha256, segments, {}, documents)
    path = Path(source).expanduser()
    kind = {".conllu": "conllu", ".jsonl": "jsonl"}.get(path.suffix.lower(), "text")
    with open_corpus(path) as stream:
        if document_field is not None and kind != "jsonl":
            raise file_error(path, None, f"document_field={document_field!r} applies to .jsonl files only; leave it out")
        try:
            before = os.fstat(stream.fileno())
            sha256, index, documents, skipped = scan(path, stream, kind, text_field, document_field, limit)
            after = os.fstat(stream.fileno())
        except OSError as error:
            raise unreadable(path, error) from None
    file = CorpusFile(path, kind, text_field, before.st_size, before.st_mtime_ns)
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise file.changed(None)
    options = {f"skipped_{name}": count for name, count in skipped.items()}  # CoNLL-U: not words of the tree
    return Corpus(source, kind, sha256, FileSegments(file, index), options, documents)


def pack_corpus(corpus: Corpus, how: str, words: int) -> Corpus:
    """Long inputs from a corpus of short segments: consecutive segments joined into one, in order.

    ``how="documents"``: each document becomes one segment. ``how="sentences"``: consecutive segments are
    joined until the segment holds at least `words` whitespace-separated words (CoNLL-U: syntactic words),
    across document boundaries; each packed segment is then its own document. With ``words = max_len`` every
    packed segment fills ``max_len`` tokens for any tokenizer that spends at least one token a word, and
    ``--long truncate`` cuts the rest (counted in ``n_tokens_lost``). The packing does not depend on the
    model, so every model reads the same text. CoNLL-U trees are joined with their HEADs shifted, so that
    no word of one sentence is the head of a word of another. The packed corpus is held in memory.

    >>> corpus = Corpus("c", "text", "", tuple(Segment(t, i + 1, document=i // 2) for i, t in enumerate("ab cd ef gh".split())))
    >>> [(s.text, s.document) for s in pack_corpus(corpus, "documents", 0).segments]
    [('ab cd', 0), ('ef gh', 1)]
    >>> [s.text for s in pack_corpus(corpus, "sentences", 3).segments]
    ['ab cd ef', 'gh']
    """
    if how == "none":
        return corpus
    groups: list[list[Segment]] = []
    size = 0
    for index, segment in enumerate(corpus.segments):
        document = int(corpus.segment_documents[index])
        count = len(segment.words) if segment.words else len(segment.text.split())
        if (not groups or (how == "documents" and document != groups[-1][0].document)
                or (how == "sentences" and size >= words)):
            groups.append([])
            size = 0
        groups[-1].append(segment)
        size += count
    packed = tuple(_joined(group, n if how == "sentences" else group[0].document) for n, group in enumerate(groups))
    documents = ("packed: each document is one segment" if how == "documents"
                 else "packed: each packed segment is its own document")
    options = corpus.options | {"pack": how, "pack_words": words if how == "sentences" else None,
                                "n_segments_before_packing": len(corpus.segments)}
    return Corpus(corpus.source, corpus.kind, corpus.sha256, packed, options, documents)


def _joined(group: list[Segment], document: int) -> Segment:
    words, heads, deprels = [], [], []
    for segment in group:
        shift = len(words)
        words += segment.words
        heads += [head + shift if head else 0 for head in segment.heads]
        deprels += segment.deprels
    text = " ".join(segment.text for segment in group)
    return Segment(text, group[0].line, tuple(words), tuple(heads), tuple(deprels), document)


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
    from ..metrics.syntax import encode_words  # torch-side; corpus reading itself needs none of it

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
    words: object = None  # CoNLL-U: the batch's `headscan.syntax.WordAlignment`, else None

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
            from ..metrics.syntax import word_alignment

            words = word_alignment([encoded.word_ids[i] for i in chosen], [encoded.trees[i][0] for i in chosen],
                                   [encoded.trees[i][1] for i in chosen], width)
        yield Batch(torch.tensor(chosen, dtype=torch.long), ids, mask, words)
