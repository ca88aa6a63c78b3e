"""Needle-in-a-haystack trials: needles, haystacks cut from any corpus, and prompts with the answer's tokens found.

A trial plants a *needle* sentence in a *haystack* of corpus text at a *depth* (0: first, 1: last), asks the
needle's question after it, and expects the needle's *answer* (Wu et al.'s ``real_needle``) back. What the
reference code does differently, and why (see docs/retrieval.md):

- The needle goes between two sentences of the haystack, found in the text (`sentences`: a segment's end, or
  ``.``, ``!`` or ``?`` and one closing quote or bracket before white space), never by a tokenizer's id for a
  period (the reference code's ids are Llama's, so on other tokenizers every depth fell back to 0).
- Each trial's haystack starts at a segment of the corpus drawn with a seed (`plan_trials`), the same draws
  for every model; the haystack holds as many whole sentences as fit the trial's length in the model's tokens.
- The answer's tokens are found by character offsets in the prompt (`Prompt.answer`), not by matching a
  separately tokenised answer (its first token changes with the space before it).
- The needle, question and answer are tokenised without special tokens; BOS goes in front of the whole prompt
  when the model's sweep would put it there (raw template), and the chat template brings its own.

Needles are a JSONL file of ``{"needle", "question", "answer"}`` objects, the answer a verbatim part of the
needle; `read_needles` with no path reads headscan's own (``headscan/data/needles.jsonl``: invented facts no
model can know, so an answer can only be retrieved).

This module does not run models; tokenizers are handed in.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from ..errors import ConfigError, CorpusError
from .text import Corpus

__all__ = ["Needle", "TrialPlan", "Prompt", "TEMPLATES", "SENTENCE_RULE", "SPAN_RULE", "read_needles", "sentences",
           "plan_trials", "build_prompt"]

# The question after the haystack, as Wu et al. ask it; "chat" is the user's turn of the tokenizer's chat template
# (with its generation prompt), as they prompt chat models.
TEMPLATES = {
    "raw": "{haystack}\nBased on the content of the book, Question: {question}\nAnswer:",
    "chat": "<book>{haystack}</book>\nBased on the content of the book, Question: {question}\nAnswer:",
}
SENTENCE_RULE = ("a segment's end, or '.', '!' or '?' (and one closing quote or bracket) before white space; "
                 "sentences joined by one space")
SPAN_RULE = ("the prompt tokens whose character offsets overlap the answer inside the needle; |answer| is their "
             "count")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"'”’)\]])\s+")  # the end mark (and one closing mark) stays


@dataclass(frozen=True)
class Needle:
    """One needle: the sentence planted, the question asked after the haystack, the answer expected."""

    needle: str
    question: str
    answer: str  # a verbatim part of `needle`: the tokens a retrieval head copies


@dataclass(frozen=True)
class TrialPlan:
    """One trial, the same for every model: which needle, how long, how deep, where the haystack starts."""

    index: int
    length: int  # the prompt's tokens at most, template and question included
    depth: float  # 0: the needle opens the haystack; 1: it closes it
    needle: int  # index into the needles
    start: int  # the corpus segment the haystack starts at


@dataclass(frozen=True)
class Prompt:
    """A trial's prompt in one model's tokens."""

    ids: list[int]
    answer: tuple[int, int] | None  # token positions [start, stop) of the answer inside the needle; None: not found
    sentences: int  # haystack sentences kept


def read_needles(path: str | Path | None = None) -> tuple[tuple[Needle, ...], dict]:
    """The needles of a JSONL file (headscan's own when `path` is None), and their provenance.

    >>> needles, about = read_needles()
    >>> len(needles) >= 3, all(n.answer in n.needle for n in needles), about["source"]
    (True, True, 'headscan/data/needles.jsonl')
    """
    if path is None:
        raw = resources.files("headscan").joinpath("data/needles.jsonl").read_bytes()
        source = "headscan/data/needles.jsonl"
    else:
        path = Path(path)
        try:
            raw = path.read_bytes()
        except OSError as error:
            raise CorpusError(f"{path}: cannot read the needles ({error.strerror}); pass a JSONL file of "
                              f'{{"needle", "question", "answer"}} objects') from None
        source = str(path)
    needles = []
    for number, line in enumerate(raw.decode("utf-8-sig", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise CorpusError(f"{source}, line {number}: not JSON; each line holds one "
                              f'{{"needle", "question", "answer"}} object') from None
        fields = {name: record.get(name) if isinstance(record, dict) else None for name in ("needle", "question", "answer")}
        missing = [name for name, value in fields.items() if not isinstance(value, str) or not value.strip()]
        if missing:
            raise CorpusError(f"{source}, line {number}: needs a non-empty string {missing[0]!r}; each line holds "
                              f'{{"needle", "question", "answer"}}')
        if fields["answer"] not in fields["needle"]:
            raise CorpusError(f"{source}, line {number}: the answer {fields['answer']!r} is not a verbatim part of the "
                              f"needle; quote it exactly as the needle says it")
        needles.append(Needle(**{name: value.strip() for name, value in fields.items()}))
    if not needles:
        raise CorpusError(f"{source}: holds no needle; add lines of {{\"needle\", \"question\", \"answer\"}}")
    about = {"source": source, "sha256": hashlib.sha256(raw).hexdigest(), "n_needles": len(needles),
             "needles": [vars(n) for n in needles]}
    return tuple(needles), about


def sentences(text: str) -> list[str]:
    """The sentences of one segment's text, by `SENTENCE_RULE`.

    >>> sentences('He left. "Why?" she asked (twice). Fine')
    ['He left.', '"Why?"', 'she asked (twice).', 'Fine']
    """
    return [part.strip() for part in _SENTENCE_END.split(text) if part.strip()]


def plan_trials(corpus: Corpus, n_needles: int, lengths, depths, seed: int) -> list[TrialPlan]:
    """One trial per (length, depth, needle), in that order, each haystack starting at a segment of `corpus`
    drawn by numpy's ``default_rng(seed)``: the same trials for every model.

    >>> from headscan.corpus import read_corpus
    >>> [(t.length, t.depth, t.needle) for t in plan_trials(read_corpus("builtin"), 2, [64], [0.0, 1.0], 0)]
    [(64, 0.0, 0), (64, 0.0, 1), (64, 1.0, 0), (64, 1.0, 1)]
    """
    cells = [(length, depth, needle) for length in lengths for depth in depths for needle in range(n_needles)]
    starts = np.random.default_rng(seed).integers(0, len(corpus.segments), size=len(cells))
    return [TrialPlan(i, int(length), float(depth), needle, int(start))
            for i, ((length, depth, needle), start) in enumerate(zip(cells, starts))]


def _n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _prompt_text(tokenizer, template: str, haystack: str, question: str) -> str:
    content = TEMPLATES[template].format(haystack=haystack, question=question)
    if template == "raw":
        return content
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"template chat: {type(tokenizer).__name__} has no chat template; use --template raw",
                          setting="template")
    return tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)


def _haystack(corpus: Corpus, plan: TrialPlan, tokenizer, budget: int) -> tuple[list[str], list[int]]:
    """Whole sentences from segment `plan.start` on (wrapping around) until they hold `budget` tokens, with each
    one's token count (read with a space before it, as it sits in the haystack)."""
    found, counts, total = [], [], 0
    n = len(corpus.segments)
    for step in range(n):
        for sentence in sentences(corpus.segments[(plan.start + step) % n].text):
            found.append(sentence)
            counts.append(_n_tokens(tokenizer, " " + sentence))
            total += counts[-1]
        if total >= budget:
            return found, counts
    raise CorpusError(f"{corpus.source}: the whole corpus holds about {total:,} tokens, fewer than a haystack of "
                      f"{plan.length:,} needs; use a longer corpus or shorter --lengths")


def build_prompt(corpus: Corpus, needle: Needle, plan: TrialPlan, tokenizer, *, template: str,
                 bos: int | None) -> Prompt:
    """The prompt of trial `plan` in `tokenizer`'s tokens: at most ``plan.length`` of them, BOS (when not None)
    included, with the needle between two sentences of the haystack at the depth asked for and the answer's
    token span located (`SPAN_RULE`)."""
    fixed = len(_ids(tokenizer, _prompt_text(tokenizer, template, needle.needle, needle.question), bos)[0])
    found, counts = _haystack(corpus, plan, tokenizer, max(plan.length - fixed, 0))
    cumulative = np.concatenate([[0], np.cumsum(counts)])  # tokens before each sentence boundary
    keep = int(np.searchsorted(cumulative, plan.length - fixed, side="right")) - 1  # sentences that fit
    while keep >= 0:
        # the needle goes at the last sentence boundary at or before the depth asked for (in tokens)
        at = int(np.searchsorted(cumulative[: keep + 1], plan.depth * cumulative[keep], side="right")) - 1
        before, after = " ".join(found[:at]), " ".join(found[at:keep])
        haystack = " ".join(part for part in (before, needle.needle, after) if part)
        text = _prompt_text(tokenizer, template, haystack, needle.question)
        ids, offsets = _ids(tokenizer, text, bos)
        if len(ids) <= plan.length:
            start = text.index(haystack) + (len(before) + 1 if before else 0) + needle.needle.index(needle.answer)
            return Prompt(ids, _span(offsets, start, start + len(needle.answer)), keep)
        keep -= 1  # sentences tokenised alone can add up to a little less than the whole
    raise ConfigError(f"lengths: {plan.length} tokens cannot hold the needle and question ({fixed} tokens); use "
                      f"longer --lengths", setting="lengths")


def _ids(tokenizer, text: str, bos: int | None) -> tuple[list[int], list | None]:
    """Token ids of `text` (special tokens written in it become theirs; none added) with BOS in front when
    given, and each token's character offsets in `text` (None for BOS, and for a tokenizer without offsets)."""
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = [tuple(pair) for pair in encoded["offset_mapping"]]
    except (NotImplementedError, TypeError, ValueError):  # a slow tokenizer has no offsets
        encoded, offsets = tokenizer(text, add_special_tokens=False), None
    ids = list(encoded["input_ids"])
    if bos is None:
        return ids, offsets
    return [bos] + ids, None if offsets is None else [None] + offsets


def _span(offsets: list | None, start: int, stop: int) -> tuple[int, int] | None:
    """Token positions [first, last + 1) of the tokens whose characters overlap [start, stop); None without
    offsets, or when none does."""
    if offsets is None:
        return None
    hits = [i for i, pair in enumerate(offsets) if pair is not None and pair[1] > pair[0]
            and pair[0] < stop and pair[1] > start]
    return (hits[0], hits[-1] + 1) if hits else None
