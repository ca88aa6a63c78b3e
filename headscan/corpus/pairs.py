"""Prompt pairs for contrastive patching: a clean prompt, a corrupted one, and the answer that tells them apart.

A pairs file is JSON lines, one pair a line: ``{"clean": ..., "corrupted": ..., "answer": ..., "wrong": ...}``.
The model should continue ``clean`` with ``answer`` and ``corrupted`` with ``wrong`` (or at least not with
``answer``); what is measured is the logit difference ``logit(answer) - logit(wrong)`` at the prompt's last
token (the first token of each answer, so write answers with the space that precedes them: ``" Mary"``). Extra
keys (``template``, ...) are kept and ignored.

`generate_pairs` writes such pairs from word lists, seeded: ``ioi`` (indirect object identification, Wang et al.
2022: "When Mary and John went to the store, John gave a drink to" -> " Mary", corrupted by a third name in
place of the repeated one, the ABC corruption), ``induction`` (a run of words repeated, corrupted by changing
the word the repeat continues from) and ``capitals`` (factual recall: "The capital of France is" -> " Paris",
corrupted by another country). Each clean prompt and its corruption differ in one word, so they have the same
number of tokens wherever the words are single tokens, as patching head by head needs.

This module reads no model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CorpusError

__all__ = ["Pair", "read_pairs", "write_pairs", "pairs_text", "generate_pairs", "PAIR_KINDS"]

_NAMES = ["Mary", "John", "Tom", "James", "Anna", "Paul", "Sarah", "David", "Laura", "Peter", "Kate", "Mark",
          "Emma", "Jack", "Lucy", "Sam", "Alice", "Daniel", "Rose", "Henry"]
_PLACES = ["store", "park", "school", "office", "beach", "market", "station", "library", "garden", "river"]
_OBJECTS = ["drink", "book", "ball", "letter", "bag", "ring", "key", "card", "pen", "cake"]
_IOI = ["When {a} and {b} went to the {place}, {c} gave a {thing} to",
        "After {a} and {b} arrived at the {place}, {c} handed a {thing} to",
        "Then {a} and {b} had a long talk at the {place}, and {c} passed a {thing} to"]
_CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo", "Egypt": "Cairo",
             "Russia": "Moscow", "Germany": "Berlin", "China": "Beijing", "Greece": "Athens", "Peru": "Lima",
             "Kenya": "Nairobi", "Cuba": "Havana", "Ireland": "Dublin", "Norway": "Oslo", "Poland": "Warsaw"}
_WORDS = ["dog", "tree", "house", "river", "king", "song", "paper", "water", "horse", "door", "fish", "ship",
          "book", "city", "road", "star", "moon", "fire", "rock", "bird", "wood", "gold", "snow", "rain"]
PAIR_KINDS = ("ioi", "induction", "capitals")


@dataclass(frozen=True)
class Pair:
    """One clean prompt, its corruption, the answer the clean one calls for and the wrong one it is read against."""

    clean: str
    corrupted: str
    answer: str
    wrong: str
    template: str = ""

    def to_json(self) -> dict:
        return {"clean": self.clean, "corrupted": self.corrupted, "answer": self.answer, "wrong": self.wrong,
                "template": self.template}


def read_pairs(path: str | Path) -> list[Pair]:
    """The pairs of a JSON-lines file; a malformed line is refused in one line naming the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"pairs file {path} does not exist; write one JSON object a line with clean, corrupted, "
                          f"answer and wrong, or make one with `headscan pairs`")
    pairs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise CorpusError(f"{where}: not JSON ({error.msg}); each line holds one pair") from None
        if not isinstance(item, dict):
            raise CorpusError(f"{where}: a pair is a JSON object, got {type(item).__name__}")
        missing = [key for key in ("clean", "corrupted", "answer", "wrong") if not isinstance(item.get(key), str)
                   or not item[key]]
        if missing:
            raise CorpusError(f"{where}: {', '.join(missing)} missing or not a non-empty string")
        if item["answer"] == item["wrong"]:
            raise CorpusError(f"{where}: answer and wrong are the same ({item['answer']!r}), so their logit "
                              f"difference is 0 on every prompt")
        pairs.append(Pair(item["clean"], item["corrupted"], item["answer"], item["wrong"],
                          str(item.get("template", ""))))
    if not pairs:
        raise CorpusError(f"{path}: no pairs in it")
    return pairs


def pairs_text(pairs: list[Pair]) -> str:
    """`pairs` as the JSON lines of a pairs file (what `write_pairs` writes and a run's sha256 is taken of)."""
    return "".join(json.dumps(pair.to_json()) + "\n" for pair in pairs)


def write_pairs(pairs: list[Pair], path: str | Path) -> Path:
    """Write `pairs` as JSON lines, whole or not at all."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(pairs_text(pairs), encoding="utf-8")
    partial.replace(path)
    return path


def generate_pairs(kind: str, n: int, seed: int = 0, *, single_token=None) -> list[Pair]:
    """`n` seeded pairs of one kind (`PAIR_KINDS`). `single_token(text)`, if given, says whether a word (with
    its leading space) is one token for the model the pairs are for: words that are not are left out of the word
    lists, so that each clean prompt and its corruption have the same number of tokens.

    >>> pair = generate_pairs("ioi", 1, seed=0)[0]
    >>> pair.clean.endswith(" to") and pair.answer.startswith(" ")
    True
    >>> len(pair.clean.split()) == len(pair.corrupted.split())
    True
    """
    if kind not in PAIR_KINDS:
        raise CorpusError(f"pair kind {kind!r} is not one of {', '.join(PAIR_KINDS)}")
    if n < 1:
        raise CorpusError(f"number of pairs must be at least 1, got {n}")
    rng = np.random.default_rng([seed, PAIR_KINDS.index(kind)])
    keep = (lambda words: [w for w in words if single_token(" " + w)]) if single_token else list  # noqa: E731
    lists = {"names": keep(_NAMES), "words": keep(_WORDS),
             "capitals": {k: v for k, v in _CAPITALS.items() if not single_token or (single_token(" " + k)
                                                                                     and single_token(" " + v))}}
    need = {"ioi": ("names", 3), "induction": ("words", 7), "capitals": ("capitals", 2)}[kind]
    if len(lists[need[0]]) < need[1]:
        raise CorpusError(f"pair kind {kind!r}: only {len(lists[need[0]])} of headscan's {need[0]} are one token for "
                          f"this model, {need[1]} are needed; write the pairs yourself")
    return [_MAKERS[kind](rng, i, lists) for i in range(n)]


def _ioi(rng, i: int, lists: dict) -> Pair:
    a, b, c = rng.choice(lists["names"], 3, replace=False)
    template = _IOI[i % len(_IOI)]
    words = {"place": rng.choice(_PLACES), "thing": rng.choice(_OBJECTS)}
    if rng.random() < 0.5:  # ABBA and BABA orders, as Wang et al. balance them
        a, b = b, a
        clean = template.format(a=a, b=b, c=a, **words)  # the repeated name is a: the answer is b
        return Pair(clean, template.format(a=a, b=b, c=c, **words), f" {b}", f" {a}", "ioi:BABA")
    clean = template.format(a=a, b=b, c=b, **words)
    return Pair(clean, template.format(a=a, b=b, c=c, **words), f" {a}", f" {b}", "ioi:ABBA")


def _induction(rng, i: int, lists: dict) -> Pair:
    words = list(rng.choice(lists["words"], 7, replace=False))
    run, other = words[:6], words[6]
    # clean: w0 .. w5 w1 -> w2; corrupted: the first w1 replaced, so nothing earlier says what follows w1
    clean = " " + " ".join(run + [run[1]])  # every word with its leading space, as in running text
    corrupted = " " + " ".join([run[0], other] + run[2:] + [run[1]])
    return Pair(clean, corrupted, f" {run[2]}", f" {run[3]}", "induction")


def _capitals(rng, i: int, lists: dict) -> Pair:
    capitals = lists["capitals"]
    country, other = rng.choice(list(capitals), 2, replace=False)
    template = "The capital of {} is the city of"
    return Pair(template.format(country), template.format(other), f" {capitals[country]}", f" {capitals[other]}",
                "capitals")


_MAKERS = {"ioi": _ioi, "induction": _induction, "capitals": _capitals}
