"""Reading corpus files: one streaming pass that checks and indexes every segment, and `FileSegments`, which reads
a segment back from its file when it is asked for.

The pass reads the file once, in binary, line by line: it computes the sha256, checks every segment (each bad
input is one `CorpusError` naming the file, the line and the fix), assigns documents, and keeps a compact
index (`INDEX`, 40 bytes a segment), never the text. `FileSegments` is the read-only sequence a `Corpus` of a
file holds: a window of consecutive segments costs one read, each re-read segment is checked against its
digest, and a file changed since the pass is refused.

This module does not tokenise (see `headscan.corpus`).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import operator
import os
import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import CorpusError
from .conllu import NOTES, parse_sentence
from .segment import Segment, file_error

__all__ = ["Segment", "FileSegments", "INDEX", "EACH_SEGMENT", "CorpusFile", "scan", "segment", "open_corpus", "file_error", "unreadable"]

EACH_SEGMENT = "none: each segment is its own document"
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


def unreadable(path: Path, error: OSError) -> CorpusError:
    return file_error(path, None, f"cannot be read ({error.strerror or error}); check its permissions")


def open_corpus(path: Path) -> BinaryIO:
    try:
        if not path.exists():
            raise file_error(path, None, "no such file; pass a .txt, .jsonl or .conllu file, 'builtin' or 'repeat-random'")
        if path.is_dir():
            raise file_error(path, None, "is a directory; pass a .txt, .jsonl or .conllu file")
        if not path.is_file():
            raise file_error(path, None, "is not a regular file; pass a .txt, .jsonl or .conllu file")
        return open(path, "rb")
    except OSError as error:
        raise unreadable(path, error) from None


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
            raise file_error(path, number, f"not valid JSON ({error.msg}); put one JSON object on each line") from None
        except (ValueError, RecursionError) as error:  # Python's limits on digits and on nesting
            reason = "nested too deeply" if isinstance(error, RecursionError) else "a number has too many digits"
            raise file_error(path, number, f"not valid JSON ({reason}); put one JSON object on each line") from None
        if not isinstance(record, dict):
            raise file_error(path, number, f"expected a JSON object, found {_JSON_TYPES[type(record)]}; "
                                       f"put one object like {{{json.dumps(text_field)}: \"...\"}} on each line")
        if text_field not in record:
            raise file_error(path, number, f"no {text_field!r} field; every line needs one holding its text")
        text = record[text_field]
        if not isinstance(text, str):
            raise file_error(path, number, f"field {text_field!r} is {_JSON_TYPES[type(text)]}; it must be a string")
        if _SURROGATE.search(text):
            raise file_error(path, number, f"field {text_field!r} holds a lone surrogate (\\ud800-\\udfff); remove it")
        if document_field is None:
            self.document += 1
        elif document_field not in record:
            raise file_error(path, number, f"no {document_field!r} field; every line needs one when documents come from it")
        elif (key := json.dumps(record[document_field], sort_keys=True)) != self.previous:
            self.document, self.previous = self.document + 1, key
        self.index.add(start, raw, number, self.document, text)

    def finish(self) -> None:
        pass


_NEWDOC = re.compile(r"#\s*newdoc(\s|=|$)")


class _ConlluReader:
    """CoNLL-U: one segment per run of non-blank lines (a sentence); ``# newdoc`` comments start documents."""

    def __init__(self, path: Path, index: _Index):
        self.path, self.index = path, index
        self.block: list[tuple[int, str]] = []  # (line number, line) of the sentence being read
        self.raw: list[bytes] = []  # and its lines' bytes
        self.start, self.newdocs = 0, 0
        self.notes = dict.fromkeys(NOTES, 0)  # what reading the sentences kept counted (headscan.corpus.conllu)

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
        segment, notes = parse_sentence(self.path, block, self.newdocs)
        kept = self.index.n_kept
        self.index.add(self.start, raw, block[0][0], self.newdocs, segment.text)
        if self.index.n_kept > kept and len(self.index.records) // _RECORD.size == self.index.n_kept:
            for name, count in notes.items():
                self.notes[name] += count


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


def scan(path: Path, stream: BinaryIO, kind: str, text_field: str, document_field: str | None,
          limit: int | None) -> tuple[str, np.ndarray, str, dict]:
    """One pass over `stream`, a line at a time: its sha256, the `INDEX` of its first `limit` segments with
    text, how documents were found, and what reading the segments kept counted (CoNLL-U: multiword tokens,
    those merged into their first word, empty nodes, words not found in the text; {} otherwise). Every segment is checked, also those past `limit`.

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
            raise file_error(path, number, "holds a NUL byte, so it looks binary (or UTF-16); pass a UTF-8 text file")
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
        raise file_error(path, None, "is empty; pass a file with at least one segment of text")
    if not_utf8 is not None:
        raise file_error(path, not_utf8, "not UTF-8 text; convert it first (iconv -t utf-8)")
    if malformed is None:
        try:
            reader.finish()
        except CorpusError as error:
            malformed = error
    if malformed is not None:
        raise malformed
    how = _HOW.get(kind, _HOW["text"]).format(text_field=text_field)
    if not index.n_found:
        raise file_error(path, None, f"holds only blank lines; {how}")
    if not index.n_kept:
        raise file_error(path, None, f"every segment is empty or whitespace; {how}")
    keyed, documents = _documents(kind, index, document_field)
    return sha256.hexdigest(), index.array(keyed), documents, getattr(reader, "notes", {})


def segment(path: Path, kind: str, text_field: str, raw: bytes, line: int, document: int) -> Segment:
    """Parse one segment's bytes again (the reading pass checked them)."""
    text = raw.decode("utf-8")
    if kind == "conllu":
        return parse_sentence(path, [(line + i, row.rstrip()) for i, row in enumerate(text.split("\n"))], document)[0]
    text = text.rstrip("\r")
    if kind == "jsonl":
        text = json.loads(text)[text_field]
    return Segment(text.strip(), line, document=document)


# --- segments read when asked for ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusFile:
    """A corpus file as the reading pass found it."""

    path: Path
    kind: str
    text_field: str
    size: int
    mtime_ns: int

    def changed(self, why: str | None) -> CorpusError:
        what = f"changed since it was read ({why})" if why else "changed while it was being read"
        return file_error(self.path, None, f"{what}; read it again, and leave a corpus file unchanged while it is swept")

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

    >>> from importlib import resources
    >>> from headscan.corpus import read_corpus
    >>> segments = read_corpus(Path(resources.files("headscan") / "data/sample.txt")).segments
    >>> len(segments), segments[-1].line, type(segments[10:20]).__name__, len(segments[10:20])
    (80, 80, 'FileSegments', 10)
    """

    def __init__(self, file: CorpusFile, index: np.ndarray):
        self._file = file
        self._index = index
        self._cache: tuple[int, list[Segment]] = (0, [])  # the position of the first segment kept, and those kept
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
        first, cached = self._cache  # one read of one attribute: another thread may replace it, never tear it
        if not 0 <= position - first < len(cached):
            first, cached = self._cache = self._fill(position, first, cached)
        return cached[position - first]

    def __iter__(self) -> Iterator[Segment]:
        for position in range(len(self._index)):
            yield self[position]

    def _fill(self, position: int, first: int, cached: list[Segment]) -> tuple[int, list[Segment]]:
        """The cache with segments from `position` on: read further ahead when reading on from the last read."""
        if cached and position == first + len(cached):
            self._readahead = min(2 * self._readahead, READAHEAD)
        else:
            first, cached, self._readahead = position, [], 1
        new = self._read(position, self._readahead)
        cached = cached + new
        # forget the oldest: keep at most CACHE segments of at most CACHE_BYTES, and always the new ones
        rows = self._index[first : first + len(cached)]
        newest_bytes = np.cumsum((rows["stop"] - rows["start"])[::-1])
        kept = int(np.searchsorted(newest_bytes, CACHE_BYTES, side="right"))
        drop = max(0, min(len(cached) - min(kept, CACHE), len(cached) - len(new)))
        return first + drop, cached[drop:]

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
            out.append(segment(file.path, file.kind, file.text_field, piece, line, document))
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
