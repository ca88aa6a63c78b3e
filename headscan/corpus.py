"""Corpora: read text into segments, tokenise them per model, and batch them with padding.

Sources (`read_corpus`):

- ``builtin``: 80 sentences that ship with headscan (``headscan/data/sample.txt``, CC0), so that a fresh
  install sweeps offline;
- a ``.conllu`` treebank: one segment per sentence (its ``# text =`` line), keeping the words, their
  dependency heads and relations for syntax scores;
- a ``.jsonl`` file: one JSON object per line, the segment in its ``text`` field;
- any other file: plain text, one segment per non-blank line;
- ``repeat-random``: a random token sequence of length ``n`` repeated twice (Olsson et al. 2022), drawn
  per model from its own vocabulary; options as ``repeat-random:n=50,count=64,seed=0``.

Segments are tokenised per model with its own special tokens ([CLS] ... [SEP] for BERT-family encoders,
BOS for decoders that use one), truncated to ``max_len`` tokens, and right-padded into batches.

This module does not run models.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from .errors import ConfigError, CorpusError

__all__ = ["Segment", "Corpus", "read_corpus", "EncodedCorpus", "encode", "batches", "Batch"]

REPEAT_RANDOM_DEFAULTS = {"n": 50, "count": 64, "seed": 0}


@dataclass(frozen=True)
class Segment:
    """One unit of text that goes through the model on its own (a sentence or a line)."""

    text: str
    line: int  # 1-based line of the file where the segment starts (0 for generated segments)
    words: tuple[str, ...] = ()  # CoNLL-U only: the gold words
    heads: tuple[int, ...] = ()  # CoNLL-U only: 1-based head of each word, 0 for the root
    deprels: tuple[str, ...] = ()  # CoNLL-U only: dependency relation of each word to its head


@dataclass(frozen=True)
class Corpus:
    """Segments read from one source, with what provenance needs."""

    source: str  # the path as given, "builtin", or the repeat-random spec
    kind: str  # "builtin", "conllu", "jsonl", "text" or "repeat-random"
    sha256: str  # of the file's bytes (of the spec for repeat-random)
    segments: tuple[Segment, ...]
    options: dict = field(default_factory=dict)  # repeat-random: n, count, seed

    def provenance(self) -> dict:
        return {"source": self.source, "kind": self.kind, "sha256": self.sha256, "n_segments": len(self.segments), **self.options}


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


def _read_conllu(path: Path, text: str) -> list[Segment]:
    segments: list[Segment] = []
    words: list[str] = []
    heads: list[int] = []
    deprels: list[str] = []
    sentence_text, start = None, None

    def flush():
        if words:
            segments.append(Segment(sentence_text or " ".join(words), start, tuple(words), tuple(heads), tuple(deprels)))

    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if not line:
            flush()
            words, heads, deprels, sentence_text, start = [], [], [], None, None
            continue
        start = start or number
        if line.startswith("#"):
            if line.startswith("# text ="):
                sentence_text = line.split("=", 1)[1].strip()
            continue
        columns = line.split("\t")
        if len(columns) != 10:
            raise CorpusError(f"{path}, line {number}: a CoNLL-U word line has 10 tab-separated columns, found {len(columns)}")
        if "-" in columns[0] or "." in columns[0]:
            continue  # multiword token ranges and empty nodes are not words of the basic tree
        try:
            heads.append(int(columns[6]))
        except ValueError:
            raise CorpusError(f"{path}, line {number}: HEAD column is {columns[6]!r}, expected a whole number") from None
        words.append(columns[1])
        deprels.append(columns[7])
    flush()
    return segments


def _read_jsonl(path: Path, text: str, field_name: str) -> list[Segment]:
    segments = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise CorpusError(f"{path}, line {number}: not valid JSON ({error.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get(field_name), str):
            raise CorpusError(f"{path}, line {number}: expected an object with a string field {field_name!r}")
        if record[field_name].strip():
            segments.append(Segment(record[field_name].strip(), number))
    return segments


def read_corpus(source: str | Path = "builtin", *, limit: int | None = None, text_field: str = "text") -> Corpus:
    """Read `source` into a `Corpus` of at most `limit` segments.

    >>> corpus = read_corpus("builtin", limit=2)
    >>> corpus.kind, len(corpus.segments), corpus.segments[0].text[:24]
    ('builtin', 2, 'The old lighthouse keepe')
    >>> read_corpus("repeat-random:n=10,count=3").options
    {'n': 10, 'count': 3, 'seed': 0}
    """
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {limit}")
    source = str(source)
    if source == "repeat-random" or source.startswith("repeat-random:"):
        options = _parse_repeat_random(source)
        count = options["count"] if limit is None else min(limit, options["count"])
        options["count"] = count
        spec = f"repeat-random:n={options['n']},count={count},seed={options['seed']}"
        segments = tuple(Segment("", 0) for _ in range(count))  # tokens are drawn per model in `encode`
        return Corpus(spec, "repeat-random", hashlib.sha256(spec.encode()).hexdigest(), segments, options)
    if source == "builtin":
        data = resources.files("headscan").joinpath("data/sample.txt").read_bytes()
        path, kind = Path("builtin"), "builtin"
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise CorpusError(f"{path}: no such file; pass a .txt, .jsonl or .conllu file, 'builtin' or 'repeat-random'")
        data = path.read_bytes()
        kind = {".conllu": "conllu", ".jsonl": "jsonl"}.get(path.suffix.lower(), "text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise CorpusError(f"{path}, line {line}: not UTF-8 text; convert it first (iconv -t utf-8)") from None
    if kind == "conllu":
        segments = _read_conllu(path, text)
    elif kind == "jsonl":
        segments = _read_jsonl(path, text, text_field)
    else:
        segments = [Segment(line.strip(), number) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not segments:
        raise CorpusError(f"{path}: holds no text segments (empty, or only blank lines)")
    return Corpus(source, kind, hashlib.sha256(data).hexdigest(), tuple(segments[:limit]))


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


def encode(corpus: Corpus, model, max_len: int) -> EncodedCorpus:
    """Tokenise every segment for `model` (a `headscan.models.HookedModel`), truncated to `max_len` tokens."""
    if max_len < 4:
        raise ConfigError(f"--max-len must be at least 4 tokens, got {max_len}")
    max_len = min(max_len, model.max_context)
    bos = model.special_token_ids["bos"] if model.prepend_bos else None
    if corpus.kind == "repeat-random":
        ids, n_truncated = _repeat_random_ids(corpus, model, max_len, bos)
        return EncodedCorpus(ids, n_truncated, max_len)
    tokenizer = model.tokenizer
    encoded = tokenizer([s.text for s in corpus.segments], add_special_tokens=True, truncation=False)["input_ids"]
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


def _repeat_random_ids(corpus: Corpus, model, max_len: int, bos: int | None):
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
    for index in range(len(corpus.segments)):
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
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {batch_size}")
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
