"""Corpora: read text into segments grouped in documents, tokenise them per model, and batch them with padding.

Sources (`read_corpus`):

- ``builtin``: 80 sentences that ship with headscan (``headscan/data/sample.txt``, CC0), so that a fresh
  install sweeps offline;
- a ``.conllu`` treebank: one segment per sentence (its ``# text =`` line), keeping the words, their
  dependency heads and relations for syntax scores;
- a ``.jsonl`` file: one JSON object per line, the segment in its ``text`` field;
- any other file: plain text, one segment per non-blank line;
- ``repeat-random``: a random token sequence of length ``n`` repeated twice (Olsson et al. 2022), drawn
  per model from its own vocabulary; options as ``repeat-random:n=50,count=64,seed=0``;
- ``hf:NAME``: a Hugging Face dataset (a ``save_to_disk`` folder, a folder of data files, or a Hub id), one
  segment per row, streamed where it can be (`headscan.corpus.hub`).

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

Tokenising is `headscan.corpus.tokens`; reading the files themselves, `headscan.corpus.files`.

This module does not run models.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path

import numpy as np

from ..errors import ConfigError, CorpusError
from . import hub
from .files import EACH_SEGMENT, CorpusFile, FileSegments, Segment, file_error, open_corpus, scan, segment, unreadable
from .segment import NO_SPAN

__all__ = ["Segment", "Corpus", "FileSegments", "read_corpus", "check_source", "pack_corpus", "texts_corpus"]

REPEAT_RANDOM_DEFAULTS = {"n": 50, "count": 64, "seed": 0}

@dataclass(frozen=True)
class Corpus:
    """Segments read from one source, with what provenance needs.

    >>> corpus = read_corpus("builtin", limit=3)
    >>> corpus.documents, corpus.n_documents, [s.document for s in corpus.segments]
    ('none: each segment is its own document', 3, [0, 1, 2])
    """

    source: str  # the path as given, "builtin", or the repeat-random spec
    kind: str  # "builtin", "conllu", "jsonl", "text", "repeat-random" or "hf"
    sha256: str  # of the file's bytes (of the spec for repeat-random)
    segments: Sequence[Segment]  # a tuple, or a `FileSegments` that reads each segment from its file when asked
    options: dict = field(default_factory=dict)  # repeat-random: n, count, seed; hf: dataset, split, config, ...
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


def check_source(source: str | Path, *, document_field: str | None = None) -> None:
    """Refuse at once, without reading it through, a `source` that `read_corpus` would refuse for what a look
    shows: a ``repeat-random`` or ``hf:`` spec's options, a file that is missing, not a regular file or empty, and
    `document_field` for a source other than a ``.jsonl`` file (or an ``hf:`` dataset). The errors are
    `read_corpus`'s own; the rest of a file (its text, its lines) is checked when it is read.

    The command line calls it before torch is imported, so that a bad ``--corpus`` answers at once.

    >>> check_source("repeat-random:n=1")
    Traceback (most recent call last):
    ...
    headscan.errors.CorpusError: corpus 'repeat-random:n=1': needs n >= 2 and count >= 1
    """
    source = str(source)
    if source == "repeat-random" or source.startswith("repeat-random:"):
        _parse_repeat_random(source)
        return
    if source.startswith(hub.PREFIX):
        hub.parse_spec(source)
        return
    path = Path(source).expanduser()
    kind = "text" if source == "builtin" else {".conllu": "conllu", ".jsonl": "jsonl"}.get(path.suffix.lower(), "text")
    if source != "builtin":
        with open_corpus(path) as stream:
            try:
                size = os.fstat(stream.fileno()).st_size
                start = stream.read(len(codecs.BOM_UTF8))
            except OSError as error:
                raise unreadable(path, error) from None
        if size == 0 or (size == len(codecs.BOM_UTF8) and start == codecs.BOM_UTF8):
            raise file_error(path, None, "is empty; pass a file with at least one segment of text")
    if document_field is not None and kind != "jsonl":
        raise file_error(path, None, f"document_field={document_field!r} applies to .jsonl files only; leave it out")


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
    if source.startswith(hub.PREFIX):
        segments, sha256, options, documents = hub.read_hub_corpus(source, limit=limit, text_field=text_field,
                                                                   document_field=document_field)
        return Corpus(source, "hf", sha256, segments, options, documents)
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
            sha256, index, documents, notes = scan(path, stream, kind, text_field, document_field, limit)
            after = os.fstat(stream.fileno())
        except OSError as error:
            raise unreadable(path, error) from None
    file = CorpusFile(path, kind, text_field, before.st_size, before.st_mtime_ns)
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise file.changed(None)
    # CoNLL-U: multiword tokens (and how many were merged into their first word), skipped empty nodes, words
    # the text does not hold (headscan.corpus.conllu)
    options = {("skipped_" if name == "empty_nodes" else "") + name: count for name, count in notes.items()}
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
    for index, piece in enumerate(corpus.segments):  # `segment` is the parser imported above
        document = int(corpus.segment_documents[index])
        count = len(piece.words) if piece.words else len(piece.text.split())
        if (not groups or (how == "documents" and document != groups[-1][0].document)
                or (how == "sentences" and size >= words)):
            groups.append([])
            size = 0
        groups[-1].append(piece)
        size += count
    packed = tuple(_joined(group, n if how == "sentences" else group[0].document) for n, group in enumerate(groups))
    documents = ("packed: each document is one segment" if how == "documents"
                 else "packed: each packed segment is its own document")
    options = corpus.options | {"pack": how, "pack_words": words if how == "sentences" else None,
                                "n_segments_before_packing": len(corpus.segments)}
    return Corpus(corpus.source, corpus.kind, corpus.sha256, packed, options, documents)


def _joined(group: list[Segment], document: int) -> Segment:
    words, heads, deprels, spans, start = [], [], [], [], 0
    for piece in group:
        shift = len(words)
        words += piece.words
        heads += [head + shift if head else 0 for head in piece.heads]
        deprels += piece.deprels
        spans += [span if span == NO_SPAN else (span[0] + start, span[1] + start) for span in piece.spans]
        start += len(piece.text) + 1  # the space that joins it to the next
    text = " ".join(segment.text for segment in group)
    return Segment(text, group[0].line, tuple(words), tuple(heads), tuple(deprels), document, tuple(spans))


def texts_corpus(texts: list[str], limit: int | None) -> Corpus:
    """A corpus of the given strings, one segment (and one document) each: a notebook's list of sentences."""
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise ConfigError(f"corpus: item {bad[0]} of the list is a {type(texts[bad[0]]).__name__}, not a string",
                          setting="corpus")
    kept = [t.strip() for t in texts if t.strip()][:limit]
    segments = tuple(Segment(text, i + 1, document=i) for i, text in enumerate(kept))
    if not segments:
        raise ConfigError("corpus: the list holds no text (every item is empty)", setting="corpus")
    digest = hashlib.sha256(json.dumps(texts).encode()).hexdigest()
    return Corpus(f"<list of {len(texts)} texts>", "list", digest, segments, documents="none: each text is its own document")
