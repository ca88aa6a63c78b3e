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
field; CoNLL-U sentences with wrong columns, word IDs, HEADs or no words; a corpus with no text at all.
A UTF-8 byte order mark is accepted. Settings (``limit``, ``max_len``, ``batch_size``) are checked once by
`headscan.config.SweepConfig`; the functions here trust them.

Segments are tokenised per model with its own special tokens ([CLS] ... [SEP] for BERT-family encoders,
BOS for decoders that use one), truncated to ``max_len`` tokens, and right-padded into batches.

This module does not run models.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from .errors import ConfigError, CorpusError

__all__ = ["Segment", "Corpus", "read_corpus", "EncodedCorpus", "encode", "batches", "Batch"]

REPEAT_RANDOM_DEFAULTS = {"n": 50, "count": 64, "seed": 0}
EACH_SEGMENT = "none: each segment is its own document"


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
    segments: tuple[Segment, ...]
    options: dict = field(default_factory=dict)  # repeat-random: n, count, seed
    documents: str = "as given by each segment's document field"  # how the documents were found

    @property
    def n_documents(self) -> int:
        return len({segment.document for segment in self.segments})

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


def _read_bytes(path: Path) -> bytes:
    try:
        if not path.exists():
            raise _error(path, None, "no such file; pass a .txt, .jsonl or .conllu file, 'builtin' or 'repeat-random'")
        if path.is_dir():
            raise _error(path, None, "is a directory; pass a .txt, .jsonl or .conllu file")
        if not path.is_file():
            raise _error(path, None, "is not a regular file; pass a .txt, .jsonl or .conllu file")
        return path.read_bytes()
    except OSError as error:
        raise _error(path, None, f"cannot be read ({error.strerror or error}); check its permissions") from None


def _decode(path: Path, data: bytes) -> str:
    """The file's text, without a UTF-8 byte order mark."""
    data = data.removeprefix(codecs.BOM_UTF8)
    if not data:
        raise _error(path, None, "is empty; pass a file with at least one segment of text")
    if b"\0" in data:
        line = data[: data.index(b"\0")].count(b"\n") + 1
        raise _error(path, line, "holds a NUL byte, so it looks binary (or UTF-16); pass a UTF-8 text file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise _error(path, line, "not UTF-8 text; convert it first (iconv -t utf-8)") from None


Lines = list[tuple[int, str]]  # (1-based line number, line without its newline)


def _lines(text: str) -> Lines:
    """Numbered lines, split on newlines only (JSON strings may hold U+2028 and other line separators)."""
    return [(number, line.rstrip("\r")) for number, line in enumerate(text.split("\n"), start=1)]


def _read_text(path: Path, lines: Lines, *, paragraphs: bool = True) -> tuple[list[Segment], str]:
    segments, paragraph = [], 0
    for number, line in lines:
        if line.strip():
            segments.append(Segment(line.strip(), number, document=paragraph))
        elif segments:
            paragraph += 1
    if paragraphs and segments and segments[-1].document > 0:  # at least two paragraphs
        return segments, "blank-line paragraphs"
    segments = [replace(s, document=i) for i, s in enumerate(segments)]
    if paragraphs:
        return segments, "none: no blank line between segments, so each line is its own document"
    return segments, EACH_SEGMENT


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "true or false", type(None): "null"}
_SURROGATE = re.compile("[\ud800-\udfff]")  # JSON escapes can write them; no tokenizer can read them


def _read_jsonl(path: Path, lines: Lines, text_field: str, document_field: str | None) -> tuple[list[Segment], str]:
    segments, document, previous = [], 0, None
    for number, line in lines:
        if not line.strip():
            continue
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
            document += 1
        elif document_field not in record:
            raise _error(path, number, f"no {document_field!r} field; every line needs one when documents come from it")
        elif (key := json.dumps(record[document_field], sort_keys=True)) != previous:
            document, previous = document + 1, key
        segments.append(Segment(text.strip(), number, document=document))
    if document_field is None:
        return segments, "none: each line is its own document"
    return segments, f"jsonl field {document_field!r}: consecutive lines with equal values"


_NEWDOC = re.compile(r"#\s*newdoc(\s|=|$)")
_WORD_ID = re.compile(r"[0-9]+")
_SKIPPED_ID = re.compile(r"[0-9]+-[0-9]+|[0-9]+\.[0-9]+")  # multiword token ranges and empty nodes
_HEAD = re.compile(r"-?[0-9]+")


def _blocks(lines: Lines) -> Iterator[list[tuple[int, str]]]:
    """Runs of non-blank lines (CoNLL-U sentences), trailing whitespace removed."""
    block = []
    for number, line in lines:
        if line.strip():
            block.append((number, line.rstrip()))
        elif block:
            yield block
            block = []
    if block:
        yield block


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


def _read_conllu(path: Path, lines: Lines) -> tuple[list[Segment], str]:
    segments, newdocs = [], 0
    for block in _blocks(lines):
        newdocs += any(_NEWDOC.match(line) for _, line in block)
        segments.append(_conllu_sentence(path, block, newdocs))
    if newdocs:
        return segments, "conllu # newdoc lines"
    segments = [replace(s, document=i) for i, s in enumerate(segments)]
    return segments, "none: no # newdoc lines, so each sentence is its own document"


def _number_documents(segments: list[Segment]) -> tuple[Segment, ...]:
    """Renumber nondecreasing document keys as 0, 1, 2, ... without gaps."""
    out, previous, index = [], None, -1
    for segment in segments:
        if segment.document != previous:
            index, previous = index + 1, segment.document
        out.append(replace(segment, document=index))
    return tuple(out)


_HOW = {
    "conllu": "give it sentences: word lines of 10 tab-separated columns, a blank line after each",
    "jsonl": "put one JSON object on each line, the segment in its {text_field!r} field",
    "text": "put one segment on each line",
}


def read_corpus(
    source: str | Path = "builtin",
    *,
    limit: int | None = None,
    text_field: str = "text",
    document_field: str | None = None,
) -> Corpus:
    """Read `source` into a `Corpus` of at most `limit` segments (the first ones; the last document may be cut).

    `text_field` and `document_field` name the JSONL fields that hold each line's text and its document;
    without `document_field` each JSONL line is its own document.

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
        data = resources.files("headscan").joinpath("data/sample.txt").read_bytes()
        path, kind = Path("builtin"), "builtin"
    else:
        path = Path(source).expanduser()
        data = _read_bytes(path)
        kind = {".conllu": "conllu", ".jsonl": "jsonl"}.get(path.suffix.lower(), "text")
    if document_field is not None and kind != "jsonl":
        raise _error(path, None, f"document_field={document_field!r} applies to .jsonl files only; leave it out")
    lines = _lines(_decode(path, data))
    if kind == "conllu":
        segments, documents = _read_conllu(path, lines)
    elif kind == "jsonl":
        segments, documents = _read_jsonl(path, lines, text_field, document_field)
    else:
        segments, documents = _read_text(path, lines, paragraphs=kind == "text")
    how = _HOW.get(kind, _HOW["text"]).format(text_field=text_field)
    if not segments:
        raise _error(path, None, f"holds only blank lines; {how}")
    segments = [s for s in segments if s.text.strip()]
    if not segments:
        raise _error(path, None, f"every segment is empty or whitespace; {how}")
    return Corpus(source, kind, hashlib.sha256(data).hexdigest(), _number_documents(segments)[:limit], {}, documents)


@dataclass(frozen=True)
class EncodedCorpus:
    """A corpus tokenised for one model."""

    token_ids: tuple[tuple[int, ...], ...]  # one tuple per segment, special tokens included
    n_truncated: int  # segments cut to max_len
    max_len: int

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
    tokenizer = model.tokenizer
    encoded = tokenizer([corpus.segments[i].text for i in indices], add_special_tokens=True, truncation=False)["input_ids"]
    out, n_truncated = [], 0
    for ids in encoded:
        if bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        if len(ids) > max_len:
            n_truncated += 1
            # keep the closing [SEP] of encoders: the model never sees a segment without one
            ids = ids[: max_len - 1] + ids[-1:] if model.family == "bidirectional" else ids[:max_len]
        out.append(tuple(ids))
    return EncodedCorpus(tuple(out), n_truncated, max_len)


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
