"""A segment: one unit of text that goes through a model on its own, and the one shape of a file's errors.

This module reads nothing: `headscan.corpus.files` and `headscan.corpus.conllu` make segments.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import CorpusError

__all__ = ["Segment", "file_error", "NO_SPAN"]

NO_SPAN = (-1, -1)  # a word whose characters could not be found in its sentence's text


@dataclass(frozen=True)
class Segment:
    """One unit of text that goes through the model on its own (a sentence or a line)."""

    text: str
    line: int  # 1-based line of the file where the segment starts (0 for generated segments)
    words: tuple[str, ...] = ()  # CoNLL-U only: the gold (syntactic) words
    heads: tuple[int, ...] = ()  # CoNLL-U only: 1-based head of each word, 0 for the root
    deprels: tuple[str, ...] = ()  # CoNLL-U only: dependency relation of each word to its head
    document: int = 0  # 0-based index of the segment's document in the corpus
    # CoNLL-U only: each word's characters in `text`, [start, stop); NO_SPAN where they were not found
    spans: tuple[tuple[int, int], ...] = ()


def file_error(path: Path, line: int | None, message: str) -> CorpusError:
    """The one shape of every file error: ``{path}, line {line}: {what is wrong}; {how to fix it}``."""
    return CorpusError(f"{path}, line {line}: {message}" if line else f"{path}: {message}")
