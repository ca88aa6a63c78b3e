"""A CoNLL-U sentence read as written: its own text, its syntactic words, and where each word lies in the text.

A sentence is fed to a model as its text (``# text = ...``; where there is none, its surface tokens joined
with a space except after those marked ``SpaceAfter=No``), tokenised exactly as a line of a plain-text
corpus would be. Its words are then found in that text, so that each token can be given to a word by
character offsets (`headscan.corpus.words.align_tokens`):

- Each *surface token* (a word, or a multiword token ``1-2 don't`` standing for several words) is looked for
  in the text from where the previous one ended, after any whitespace; where it is not there, further on.
  A surface token the text does not hold gives its words no characters (``words_not_in_text``).
- A multiword token's span is split between its words by characters where their forms spell it, in any case
  ("do" + "n't" = "don't", "can" + "not", "gon" + "na", "it" + "'s": every multiword token of UD English EWT);
  otherwise (Spanish "del" = "de" + "el") the whole span goes to its first word and the others get none
  (``multiword_tokens_merged``).
- Empty nodes (``3.1``) are not words of the basic tree: skipped (``empty_nodes``).

>>> segment, notes = parse_sentence(Path("s.conllu"), list(enumerate([
...     "1-2\\tdon't\\t_\\t_\\t_\\t_\\t_\\t_\\t_\\t_", "1\\tdo\\tdo\\tAUX\\t_\\t_\\t3\\taux\\t_\\t_",
...     "2\\tn't\\tnot\\tPART\\t_\\t_\\t3\\tadvmod\\t_\\t_", "3\\tgo\\tgo\\tVERB\\t_\\t_\\t0\\troot\\t_\\tSpaceAfter=No",
...     "4\\t!\\t!\\tPUNCT\\t_\\t_\\t3\\tpunct\\t_\\t_"], start=1)), document=0)
>>> segment.text, segment.spans, notes["multiword_tokens"]
("don't go!", ((0, 2), (2, 5), (6, 8), (8, 9)), 1)

This module does not tokenise (see `headscan.corpus.words`) or read files (see `headscan.corpus.files`).
"""

from __future__ import annotations

import re
from pathlib import Path

from .segment import NO_SPAN, Segment, file_error

__all__ = ["NOTES", "parse_sentence", "surface_spans"]

# What reading a sentence counts, summed over a corpus into its provenance.
NOTES = ("multiword_tokens", "multiword_tokens_merged", "empty_nodes", "words_not_in_text")

_WORD_ID = re.compile(r"[0-9]+")
_RANGE_ID = re.compile(r"([0-9]+)-([0-9]+)")
_EMPTY_ID = re.compile(r"[0-9]+\.[0-9]+")
_HEAD = re.compile(r"-?[0-9]+")


def _space_after(misc: str) -> bool:
    return "SpaceAfter=No" not in misc.split("|")


def parse_sentence(path: Path, block: list[tuple[int, str]], document: int) -> tuple[Segment, dict[str, int]]:
    """One sentence's `Segment` (text, words, heads, relations, each word's span in the text) from its lines
    (line number, line), and what reading it counted (`NOTES`). Bad lines raise `CorpusError` naming the line."""
    text, words, misc, heads, deprels, head_lines = None, [], [], [], [], []
    ranges: list[tuple[int, int, str, str]] = []  # first and last word, surface form, MISC
    empty = 0
    for number, line in block:
        if line.startswith("#"):
            key, equals, value = line[1:].partition("=")
            if key.strip() == "text" and equals:
                text = value.strip()
            continue
        columns = line.split("\t")
        if len(columns) != 10:
            raise file_error(path, number, f"a CoNLL-U word line has 10 tab-separated columns, found {len(columns)}; "
                                       "separate columns with tabs and write _ for an empty one")
        word_id, head = columns[0], columns[6]
        if _EMPTY_ID.fullmatch(word_id):
            empty += 1
            continue  # not a word of the basic tree
        if match := _RANGE_ID.fullmatch(word_id):
            ranges.append((int(match[1]), int(match[2]), columns[1], columns[9]))
            continue
        if not _WORD_ID.fullmatch(word_id):
            raise file_error(path, number, f"ID column is {word_id!r}, expected a whole number; "
                                       "number words 1, 2, 3, ... (ranges like 2-3 and empty nodes like 3.1 are skipped)")
        if int(word_id) != len(words) + 1:
            raise file_error(path, number, f"word ID is {int(word_id)}, expected {len(words) + 1}; "
                                       "number each sentence's words 1, 2, 3, ... in order")
        if not _HEAD.fullmatch(head):
            raise file_error(path, number, f"HEAD column is {head!r}, expected a whole number; "
                                       "write the ID of the word's head, 0 for the root")
        words.append(columns[1])
        misc.append(columns[9])
        heads.append(int(head))
        deprels.append(columns[7])
        head_lines.append(number)
    if not words:
        raise file_error(path, block[0][0], "sentence has no word lines; add them, or a blank line is missing")
    for head, number in zip(heads, head_lines):
        if not 0 <= head <= len(words):
            raise file_error(path, number, f"HEAD is {head} but the sentence has {len(words)} words; "
                                       f"use 0 for the root or a word ID from 1 to {len(words)}")
    surfaces = _surface_tokens(words, misc, ranges)
    if not text:  # no (or an empty) # text line
        text = "".join(form + (" " if space else "") for form, _, space in surfaces).strip()
    spans, notes = surface_spans(text, words, surfaces)
    notes |= {"multiword_tokens": sum(len(members) > 1 for _, members, _ in surfaces), "empty_nodes": empty}
    return Segment(text, block[0][0], tuple(words), tuple(heads), tuple(deprels), document, spans), notes


def _surface_tokens(words: list[str], misc: list[str], ranges) -> list[tuple[str, range, bool]]:
    """The sentence's surface tokens in order: (form, the 0-based words it stands for, space after it).

    A range outside the sentence, backwards or overlapping an earlier one is not a multiword token: its words
    stand for themselves."""
    starts = {}
    for first, last, form, notes in ranges:
        if 1 <= first <= last <= len(words) and first not in starts:
            starts[first] = (last, form, notes)
    surfaces, word = [], 1
    while word <= len(words):
        last, form, notes = starts.get(word, (word, words[word - 1], misc[word - 1]))
        if any(first in starts for first in range(word + 1, last + 1)):  # overlaps the next range: not a range
            last, form, notes = word, words[word - 1], misc[word - 1]
        surfaces.append((form, range(word - 1, last), _space_after(notes)))
        word = last + 1
    return surfaces


def surface_spans(text: str, words: list[str], surfaces: list[tuple[str, range, bool]]
                  ) -> tuple[tuple[tuple[int, int], ...], dict[str, int]]:
    """Each word's [start, stop) in `text`, found surface token by surface token (see the module docstring),
    and how many multiword tokens were merged into their first word and how many words the text lacks.

    >>> surface_spans("I can't", ["I", "ca", "n't"], [("I", range(0, 1), True), ("can't", range(1, 3), False)])
    (((0, 1), (2, 4), (4, 7)), {'multiword_tokens_merged': 0, 'words_not_in_text': 0})
    >>> surface_spans("del mar", ["de", "el", "mar"], [("del", range(0, 2), True), ("mar", range(2, 3), False)])
    (((0, 3), (-1, -1), (4, 7)), {'multiword_tokens_merged': 1, 'words_not_in_text': 0})
    """
    spans = [NO_SPAN] * len(words)
    merged = missing = cursor = 0
    for form, members, _ in surfaces:
        while cursor < len(text) and text[cursor].isspace():
            cursor += 1
        start = cursor if text.startswith(form, cursor) else text.find(form, cursor)
        if start < 0 or not form:
            missing += len(members)
            continue
        cursor = start + len(form)
        forms = [words[w] for w in members]
        if len(members) == 1:
            spans[members[0]] = (start, cursor)
        elif "".join(forms).lower() == form.lower() and len("".join(forms)) == len(form):
            # the words spell the surface form (in any case): split it by characters
            for w, piece in zip(members, forms):
                spans[w] = (start, start + len(piece))
                start += len(piece)
        else:
            spans[members[0]] = (start, cursor)
            merged += 1
    return tuple(spans), {"multiword_tokens_merged": merged, "words_not_in_text": missing}
