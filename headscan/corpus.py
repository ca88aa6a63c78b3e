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

import codecs
import hashlib
import io
import json
import operator
import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np
import torch

from .errors import ConfigError, CorpusError

__all__ = ["Segment", "Corpus", "FileSegments", "read_corpus", "EncodedCorpus", "encode", "batches", "Batch"]

REPEAT_RANDOM_DEFAULTS = {"n": 50, "count": 64, "seed": 0}
EACH_SEGMENT = "none: each segment is its own document"

# One record per segment of a corpus file: 40 bytes.
INDEX = np.dtype([
    ("start", "<i8"),  # byte offset in the file of the segment's first line (after a byte order mark)
    ("stop", "<i8"),  # byte offset just past its last line, without that line's newline
    ("line", "<i8"),  # 1-based line number of its first line
    ("document", "<i8"),  # 0-based index of its document
    ("digest", "<u8"),  # the first 8 bytes of the sha256 of its bytes, to notice a file changed since
])
_RECORD = struct.Struct("<qqqqQ")  # INDEX packed, as the reading pass appends it
READAHEAD = 256  # most segments that one read of a FileSegments brings in
READ_BYTES = 1 << 20  # and most bytes (beyond a first segment that is longer)
CACHE = 1024  # most parsed segments a FileSegments keeps, the last ones read
CACHE_BYTES = 8 << 20  # and the most bytes of the file they may span (beyond the last read)


@dataclass(frozen=True)
class Segment:
    """One unit of text that goes through the model on its own (a sentence or a line)."""

    text: str
    line: int  # 1-based line of the file where the segment starts (0 for generated segments)
    words: tuple[str, ...] = ()  # CoNLL-U only: the gold words
    heads: tuple[int, ...] = ()  # CoNLL-U only: 1-based head of each word, 0 for the root
    deprels: tuple[str, ...] = ()  # CoNLL-U only: dependency relation of each word to its head
    document: int = 0  # 0-based index of the segment's document in the corpus


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
        return np.fromiter((s.document for s in self.segments), dtype=np.int64, count=len(self.segments))

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


def _error(path: Path, line: int | None, message: str) -> CorpusError:
    """The one shape of every file error: ``{path}, line {line}: {what is wrong}; {how to fix it}``."""
    return CorpusError(f"{path}, line {line}: {message}" if line else f"{path}: {message}")


def _unreadable(path: Path, error: OSError) -> CorpusError:
    return _error(path, None, f"cannot be read ({error.strerror or error}); check its permissions")


def _open(path: Path) -> BinaryIO:
    try:
        if not path.exists():
            raise _error(path, None, "no such file; pass a .txt, .jsonl or .conllu file, 'builtin' or 'repeat-random'")
        if path.is_dir():
            raise _error(path, None, "is a directory; pass a .txt, .jsonl or .conllu file")
        if not path.is_file():
            raise _error(path, None, "is not a regular file; pass a .txt, .jsonl or .conllu file")
        return open(path, "rb")
    except OSError as error:
        raise _unreadable(path, error) from None


def _digest(raw: bytes) -> int:
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "little")


# --- the reading pass ----------------------------------------------------------------------------------------


class _Index:
    """What the reading pass keeps: one packed `INDEX` record per segment with text, the first `limit` of them.

    Documents are recorded as the readers find them (a paragraph, a ``# newdoc`` count, a JSONL key) and
    numbered 0, 1, 2, ... at the end, when the whole file has said how it marks them.
    """

    def __init__(self, limit: int | None):
        self.records = bytearray()
        self.limit = limit
        self.n_found = 0  # segments, empty ones included
        self.n_kept = 0  # segments with text
        self.last_key = None  # the document key of the last segment found

    def add(self, start: int, raw: bytes, line: int, key: int, text: str) -> None:
        self.n_found += 1
        self.last_key = key
        if not text.strip():
            return  # no text left for a model: dropped (its document may still count as one)
        if self.limit is None or self.n_kept < self.limit:
            self.records += _RECORD.pack(start, start + len(raw), line, key, _digest(raw))
        self.n_kept += 1

    def array(self, keyed: bool) -> np.ndarray:
        """The records, documents numbered from their keys (`keyed`) or one per segment."""
        index = np.frombuffer(self.records, dtype=INDEX) if self.records else np.zeros(0, INDEX)
        keys = index["document"]
        if keyed and len(index):
            index["document"] = np.concatenate([[0], np.cumsum(keys[1:] != keys[:-1])])
        else:
            index["document"] = np.arange(len(index))
        return index


class _TextReader:
    """Plain text: one segment per non-blank line; blank lines end paragraphs."""

    def __init__(self, path: Path, index: _Index):
        self.index, self.paragraph = index, 0

    def line(self, number: int, start: int, raw: bytes, line: str) -> None:
        if line.strip():
            self.index.add(start, raw, number, self.paragraph, line)
        elif self.index.n_found:
            self.paragraph += 1

    def finish(self) -> None:
        pass


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "true or false", type(None): "null"}
_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON escapes can write them; no tokenizer can read them


class _JsonlReader:
    """JSONL: one object per non-blank line, its text in `text_field`, its document in `document_field`."""

    def __init__(self, path: Path, index: _Index, text_field: str, document_field: str | None):
        self.path, self.index, self.text_field, self.document_field = path, index, text_field, document_field
        self.document, self.previous = 0, None

    def line(self, number: int, start: int, raw: bytes, line: str) -> None:
        if not line.strip():
            return
        path, text_field, document_field = self.path, self.text_field, self.document_field
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise _error(path, number, f"not valid JSON ({error.msg}); put one JSON object on each line") from None
        except (ValueError, RecursionError) as error:  # Python's limits on digits and on nesting
            reason = "nested too deeply" if isinstance(error, RecursionError) else "a number has too many digits"
            raise _error(path, number, f"not valid JSON ({reason}); put one JSON object on each line") from None
        if not isinstance(record, dict):
            raise _error(path, number, f"expected a JSON object, found {_JSON_TYPES[type(record)]}; "
                                       f"put one object like {{{json.dumps(text_field)}: \"...\"}} on each line")
        if text_field not in record:
            raise _error(path, number, f"no {text_field!r} field; every line needs one holding its text")
        text = record[text_field]
        if not isinstance(text, str):
            raise _error(path, number, f"field {text_field!r} is {_JSON_TYPES[type(text)]}; it must be a string")
        if _SURROGATE.search(text):
            raise _error(path, number, f"field {text_field!r} holds a lone surrogate (\\ud800-\\udfff); remove it")
        if document_field is None:
            self.document += 1
        elif document_field not in record:
            raise _error(path, number, f"no {document_field!r} field; every line needs one when documents come from it")
        elif (key := json.dumps(record[document_field], sort_keys=True)) != self.previous:
            self.document, self.previous = self.document + 1, key
        self.index.add(start, raw, number, self.document, text)

    def finish(self) -> None:
        pass


_NEWDOC = re.compile(r"#\s*newdoc(\s|=|$)")
_WORD_ID = re.compile(r"[0-9]+")
_SKIPPED_ID = re.compile(r"[0-9]+-[0-9]+|[0-9]+\.[0-9]+")  # multiword token ranges and empty nodes
_HEAD = re.compile(r"-?[0-9]+")


def _conllu_sentence(path: Path, block: list[tuple[int, str]], document: int) -> Segment:
    text, words, heads, deprels, head_lines = None, [], [], [], []
    for number, line in block:
        if line.startswith("#"):
            key, equals, value = line[1:].partition("=")
            if key.strip() == "text" and equals:
                text = value.strip()
            continue
        columns = line.split("\t")
        if len(columns) != 10:
            raise _error(path, number, f"a CoNLL-U word line has 10 tab-separated columns, found {len(columns)}; "
                                       "separate columns with tabs and write _ for an empty one")
        word_id, head = columns[0], columns[6]
        if _SKIPPED_ID.fullmatch(word_id):
            continue  # not words of the basic tree
        if not _WORD_ID.fullmatch(word_id):
            raise _error(path, number, f"ID column is {word_id!r}, expected a whole number; "
                                       "number words 1, 2, 3, ... (ranges like 2-3 and empty nodes like 3.1 are skipped)")
        if int(word_id) != len(words) + 1:
            raise _error(path, number, f"word ID is {int(word_id)}, expected {len(words) + 1}; "
                                       "number each sentence's words 1, 2, 3, ... in order")
        if not _HEAD.fullmatch(head):
            raise _error(path, number, f"HEAD column is {head!r}, expected a whole number; "
                                       "write the ID of the word's head, 0 for the root")
        words.append(columns[1])
        heads.append(int(head))
        deprels.append(columns[7])
        head_lines.append(number)
    if not words:
        raise _error(path, block[0][0], "sentence has no word lines; add them, or a blank line is missing")
    for head, number in zip(heads, head_lines):
        if not 0 <= head <= len(words):
            raise _error(path, number, f"HEAD is {head} but the sentence has {len(words)} words; "
                                       f"use 0 for the root or a word ID from 1 to {len(words)}")
    return Segment(text or " ".join(words), block[0][0], tuple(words), tuple(heads), tuple(deprels), document)


class _ConlluReader:
    """CoNLL-U: one segment per run of non-blank lines (a sentence); ``# newdoc`` comments start documents."""

    def __init__(self, path: Path, index: _Index):
        self.path, self.index = path, index
        self.block: list[tuple[int, str]] = []  # (line number, line) of the sentence being read
        self.raw: list[bytes] = []  # and its lines' bytes
        self.start, self.newdocs = 0, 0

    def line(self, number: int, start: int, raw: bytes, line: str) -> None:
        if line.strip():
            if not self.block:
                self.start = start
            self.block.append((number, line.rstrip()))
            self.raw.append(raw)
        elif self.block:
            self.finish()

    def finish(self) -> None:
        if not self.block:
            return
        block, raw = self.block, b"\n".join(self.raw)  # the sentence's bytes, as they lie in the file
        self.block, self.raw = [], []
        self.newdocs += any(_NEWDOC.match(line) for _, line in block)
        segment = _conllu_sentence(self.path, block, self.newdocs)
        self.index.add(self.start, raw, block[0][0], self.newdocs, segment.text)


def _documents(kind: str, index: _Index, document_field: str | None) -> tuple[bool, str]:
    """Whether documents come from the readers' keys, and how they were found."""
    if kind == "conllu":
        if index.last_key:  # some sentence had a # newdoc before it
            return True, "conllu # newdoc lines"
        return False, "none: no # newdoc lines, so each sentence is its own document"
    if kind == "jsonl":
        if document_field is None:
            return False, "none: each line is its own document"
        return True, f"jsonl field {document_field!r}: consecutive lines with equal values"
    if kind == "text" and index.last_key:  # at least two paragraphs
        return True, "blank-line paragraphs"
    if kind == "text":
        return False, "none: no blank line between segments, so each line is its own document"
    return False, EACH_SEGMENT


_HOW = {
    "conllu": "give it sentences: word lines of 10 tab-separated columns, a blank line after each",
    "jsonl": "put one JSON object on each line, the segment in its {text_field!r} field",
    "text": "put one segment on each line",
}


def _scan(path: Path, stream: BinaryIO, kind: str, text_field: str, document_field: str | None,
          limit: int | None) -> tuple[str, np.ndarray, str]:
    """One pass over `stream`, a line at a time: its sha256, the `INDEX` of its first `limit` segments with
    text, and how documents were found. Every segment is checked, also those past `limit`.

    The errors are those of reading the whole file at once: an empty file, then the first NUL byte, then the
    first line that is not UTF-8, then the first malformed segment, then a file without text.
    """
    sha256 = hashlib.sha256()
    index = _Index(limit)
    if kind == "conllu":
        reader = _ConlluReader(path, index)
    elif kind == "jsonl":
        reader = _JsonlReader(path, index, text_field, document_field)
    else:
        reader = _TextReader(path, index)
    size = number = bom = 0
    not_utf8: int | None = None  # the first line that is not UTF-8
    malformed: CorpusError | None = None  # the first malformed segment
    for raw in stream:  # lines split on b"\n" only: JSON strings may hold U+2028 and other line separators
        sha256.update(raw)
        start = size
        size += len(raw)
        if number == 0 and raw.startswith(codecs.BOM_UTF8):
            raw, start, bom = raw[len(codecs.BOM_UTF8):], start + len(codecs.BOM_UTF8), len(codecs.BOM_UTF8)
        number += 1
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        if b"\0" in raw:
            raise _error(path, number, "holds a NUL byte, so it looks binary (or UTF-16); pass a UTF-8 text file")
        if not_utf8 is not None:
            continue  # only a NUL byte could still come first
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            not_utf8 = number
            continue
        if malformed is None:
            try:
                reader.line(number, start, raw, line.rstrip("\r"))
            except CorpusError as error:
                malformed = error
    if size == bom:
        raise _error(path, None, "is empty; pass a file with at least one segment of text")
    if not_utf8 is not None:
        raise _error(path, not_utf8, "not UTF-8 text; convert it first (iconv -t utf-8)")
    if malformed is None:
        try:
            reader.finish()
        except CorpusError as error:
            malformed = error
    if malformed is not None:
        raise malformed
    how = _HOW.get(kind, _HOW["text"]).format(text_field=text_field)
    if not index.n_found:
        raise _error(path, None, f"holds only blank lines; {how}")
    if not index.n_kept:
        raise _error(path, None, f"every segment is empty or whitespace; {how}")
    keyed, documents = _documents(kind, index, document_field)
    return sha256.hexdigest(), index.array(keyed), documents


def _segment(path: Path, kind: str, text_field: str, raw: bytes, line: int, document: int) -> Segment:
    """Parse one segment's bytes again (the reading pass checked them)."""
    text = raw.decode("utf-8")
    if kind == "conllu":
        return _conllu_sentence(path, [(line + i, row.rstrip()) for i, row in enumerate(text.split("\n"))], document)
    text = text.rstrip("\r")
    if kind == "jsonl":
        text = json.loads(text)[text_field]
    return Segment(text.strip(), line, document=document)


# --- segments read when asked for ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _File:
    """A corpus file as the reading pass found it."""

    path: Path
    kind: str
    text_field: str
    size: int
    mtime_ns: int

    def changed(self, why: str) -> CorpusError:
        return _error(self.path, None, f"changed since it was read ({why}); read it again, and leave a corpus file "
                                       "unchanged while it is swept")

    def read(self, start: int, stop: int) -> bytes:
        try:
            with open(self.path, "rb") as stream:
                status = os.fstat(stream.fileno())
                if (status.st_size, status.st_mtime_ns) != (self.size, self.mtime_ns):
                    raise self.changed("its size or modification time differ")
                stream.seek(start)
                return stream.read(stop - start)
        except OSError as error:
            raise self.changed(error.strerror or str(error)) from None


class FileSegments(Sequence):
    """The segments of a corpus file, each read and parsed from the file when asked for.

    It keeps the file's `INDEX` (40 bytes a segment) and the segments it read last (at most `CACHE`). Reading
    on from the last segment read reads further ahead each time (up to `READAHEAD` segments or `READ_BYTES`
    in one read), so a sweep's window of consecutive segments costs one or two reads. Slicing gives a
    `FileSegments` over the same file; equality is segment by segment. A segment whose bytes differ from
    those of the reading pass (or a file whose size or modification time changed) raises `CorpusError`.

    >>> segments = read_corpus(Path(resources.files("headscan") / "data/sample.txt")).segments
    >>> len(segments), segments[-1].line, type(segments[10:20]).__name__, len(segments[10:20])
    (80, 80, 'FileSegments', 10)
    """

    def __init__(self, file: _File, index: np.ndarray):
        self._file = file
        self._index = index
        self._first = 0  # the position of _cached[0]
        self._cached: list[Segment] = []
        self._readahead = 1

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def documents(self) -> np.ndarray:
        """The document of each segment, (segment,) int64 (read-only)."""
        documents = self._index["document"]
        documents.flags.writeable = False
        return documents

    @property
    def nbytes(self) -> int:
        """Bytes of memory the index holds."""
        return self._index.nbytes

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, key):
        if isinstance(key, slice):
            return FileSegments(self._file, self._index[key])
        try:
            position = operator.index(key)
        except TypeError:
            raise TypeError(f"segment indices must be integers or slices, not {type(key).__name__}") from None
        n = len(self._index)
        if position < 0:
            position += n
        if not 0 <= position < n:
            raise IndexError(f"segment {key} is out of range: the corpus has {n} segments")
        if not 0 <= position - self._first < len(self._cached):
            self._fill(position)
        return self._cached[position - self._first]

    def __iter__(self) -> Iterator[Segment]:
        for position in range(len(self._index)):
            yield self[position]

    def _fill(self, position: int) -> None:
        """Read segments from `position` on into the cache: further ahead when reading on from the last read."""
        if self._cached and position == self._first + len(self._cached):
            self._readahead = min(2 * self._readahead, READAHEAD)
        else:
            self._first, self._cached, self._readahead = position, [], 1
        new = self._read(position, self._readahead)
        self._cached += new
        # forget the oldest: keep at most CACHE segments of at most CACHE_BYTES, and always the new ones
        rows = self._index[self._first : self._first + len(self._cached)]
        newest_bytes = np.cumsum((rows["stop"] - rows["start"])[::-1])
        kept = int(np.searchsorted(newest_bytes, CACHE_BYTES, side="right"))
        drop = min(len(self._cached) - min(kept, CACHE), len(self._cached) - len(new))
        if drop > 0:
            self._first, self._cached = self._first + drop, self._cached[drop:]

    def _read(self, position: int, count: int) -> list[Segment]:
        rows = self._index[position : position + count]
        backwards = np.flatnonzero(rows["start"][1:] <= rows["start"][:-1])  # in a slice with a negative step
        if len(backwards):
            rows = rows[: backwards[0] + 1]
        start = int(rows["start"][0])
        rows = rows[: max(1, int(np.searchsorted(rows["stop"], start + READ_BYTES, side="right")))]
        raw = self._file.read(start, int(rows["stop"][-1]))
        file, out = self._file, []
        for first, stop, line, document, digest in rows.tolist():
            piece = raw[first - start : stop - start]
            if len(piece) != stop - first or _digest(piece) != digest:
                raise file.changed(f"line {line} differs")
            out.append(_segment(file.path, file.kind, file.text_field, piece, line, document))
        return out

    def __eq__(self, other) -> bool:
        if isinstance(other, FileSegments) and other._file == self._file:
            return np.array_equal(self._index, other._index)
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"<FileSegments: {len(self)} segments of {self._file.path}>"

    def __getstate__(self) -> dict:
        return {"file": self._file, "index": self._index}  # not the cache

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["file"], state["index"])


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
            raise _error(path, None, f"document_field={document_field!r} applies to .jsonl files only; leave it out")
        data = resources.files("headscan").joinpath("data/sample.txt").read_bytes()  # 80 lines: kept as a tuple
        sha256, index, documents = _scan(path, io.BytesIO(data), "builtin", text_field, None, limit)
        segments = tuple(_segment(path, "builtin", text_field, data[start:stop], line, document)
                         for start, stop, line, document, _ in index.tolist())
        return Corpus(source, "builtin", sha256, segments, {}, documents)
    path = Path(source).expanduser()
    kind = {".conllu": "conllu", ".jsonl": "jsonl"}.get(path.suffix.lower(), "text")
    with _open(path) as stream:
        if document_field is not None and kind != "jsonl":
            raise _error(path, None, f"document_field={document_field!r} applies to .jsonl files only; leave it out")
        try:
            before = os.fstat(stream.fileno())
            sha256, index, documents = _scan(path, stream, kind, text_field, document_field, limit)
            after = os.fstat(stream.fileno())
        except OSError as error:
            raise _unreadable(path, error) from None
    file = _File(path, kind, text_field, before.st_size, before.st_mtime_ns)
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise file.changed("it was written to while being read")
    return Corpus(source, kind, sha256, FileSegments(file, index), {}, documents)


@dataclass(frozen=True)
class EncodedCorpus:
    """A corpus tokenised for one model."""

    token_ids: tuple[tuple[int, ...], ...]  # one tuple per segment, special tokens included
    n_truncated: int  # segments cut to max_len
    max_len: int
    n_tokens_lost: int = 0  # tokens cut off those segments

    @property
    def n_tokens(self) -> int:
        return sum(map(len, self.token_ids))


def _special_ids(tokenizer) -> set[int]:
    return {int(i) for i in getattr(tokenizer, "all_special_ids", []) if i is not None}


def encode(corpus: Corpus, model, max_len: int, indices: list[int] | None = None) -> EncodedCorpus:
    """Tokenise the segments at `indices` (all by default) for `model` (a `headscan.models.HookedModel`),
    truncated to `max_len` tokens."""
    max_len = min(max_len, model.max_context)
    indices = range(len(corpus.segments)) if indices is None else indices
    bos = model.special_token_ids["bos"] if model.prepend_bos else None
    if corpus.kind == "repeat-random":
        ids, n_truncated = _repeat_random_ids(corpus, model, max_len, bos, indices)
        return EncodedCorpus(ids, n_truncated, max_len)
    # The model decides the special tokens: BOS exactly when it says so, whatever its tokenizer does alone.
    encoded = model.token_ids([corpus.segments[i].text for i in indices])
    out, n_truncated, lost = [], 0, 0
    for ids in encoded:
        if len(ids) > max_len:
            n_truncated += 1
            lost += len(ids) - max_len
            # keep the closing [SEP] of encoders: the model never sees a segment without one
            ids = ids[: max_len - 1] + ids[-1:] if model.family == "bidirectional" else ids[:max_len]
        out.append(tuple(ids))
    return EncodedCorpus(tuple(out), n_truncated, max_len, lost)


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

    index: torch.Tensor  # (batch,) positions of the segments in the corpus
    input_ids: torch.Tensor  # (batch, seq)
    attention_mask: torch.Tensor  # (batch, seq) 1 for real tokens, 0 for padding

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
        yield Batch(torch.tensor(chosen, dtype=torch.long), ids, mask)
