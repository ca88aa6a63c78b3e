"""A run's inputs checked without torch: what a user can get wrong, refused in about the time of ``--help``.

`check_sweep` checks a sweep's models (named once, each one findable), its output folder and partial-state
folder, its shard, how often it saves and its corpus (`headscan.corpus.check_source`: a missing or empty file, a
bad spec); `check_retrieval` the same of a retrieval run, and its needles file (read whole: it is small). The command line calls them
before it imports the sweep, which imports torch; the library's `headscan.sweep` and `headscan.retrieval` call
them too, so that both refuse alike. Settings themselves are checked by their config (`headscan.config`).

This module imports no torch, transformers or model code beyond `headscan.models.specs`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..config import SweepConfig
from ..corpus import Corpus, check_source
from ..corpus.needles import read_needles
from ..errors import ConfigError, TablesError
from ..tables import check_out
from ..tables.folders import where

__all__ = ["Shard", "check_models", "check_sweep", "check_retrieval", "partial_folder"]


def check_models(models, example: str = "--model minilm") -> list[str]:
    """`models` (one spec or several) as a list, each named once and each one found (`check_spec`: an installed
    alias, a checkpoint, a cached Hugging Face id), or one clear error naming the model."""
    from ..models.specs import check_spec

    models = [models] if isinstance(models, str) else list(models)
    if not models:
        raise ConfigError(f"models: none named; pass --model (for example {example})", setting="models")
    if len(set(models)) != len(models):
        twice = sorted({m for m in models if models.count(m) > 1})
        raise ConfigError(f"models: {', '.join(twice)} named twice; name each model once (their rows would "
                          f"collide)", setting="models")
    for spec in models:
        check_spec(spec)
    return models


def check_sweep(models, corpus, out, config: SweepConfig, *, overwrite: bool, save_every: float,
                shard: Shard | str | None = None) -> tuple[list[str], Shard | None]:
    """Refuse, before anything is loaded, a sweep that would fail on its inputs; return its models as a list and
    its shard parsed. `corpus` is what `headscan.sweep` takes (a file or spec is checked by a look, not read)."""
    shard = Shard.parse(shard) if isinstance(shard, str) else shard
    models = check_models(models)
    if not save_every >= 0:  # NaN too: it would never save, silently
        raise ConfigError(f"save_every must be a number of seconds >= 0 (0 saves at every window's end, inf never), "
                          f"got {save_every}", setting="save_every")
    if out is not None:
        check_out(out, overwrite=overwrite)
        partial_folder(out)
    if isinstance(corpus, (Corpus, list, tuple)):
        if config.document_field is not None:
            raise ConfigError("document_field names a field of a .jsonl file's lines; leave it out for a list of "
                              "texts or a Corpus (give each Segment its document)", setting="document_field")
    else:
        check_source(corpus, document_field=config.document_field)
    return models, shard


def check_retrieval(models, haystack, out, *, needles: str | Path | None, overwrite: bool) -> list[str]:
    """Refuse, before anything is loaded, a retrieval run that would fail on its inputs; return its models."""
    models = check_models(models, example="--model smollm2")
    if out is not None:
        check_out(out, overwrite=overwrite)
        partial_folder(out)
    check_source(haystack)
    if needles is not None:
        read_needles(needles)  # a small file, read whole: every line checked
    return models


@dataclass(frozen=True)
class Shard:
    """The K-th of N disjoint parts of a corpus (0-based K): the documents whose index is K modulo N.

    >>> Shard.parse("2/4")
    Shard(index=2, count=4)
    >>> Shard.parse("4/4")
    Traceback (most recent call last):
    ...
    headscan.errors.ConfigError: shard must be K/N with 0 <= K < N, got '4/4' (K counts from 0)
    """

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        k, _, n = str(text).partition("/")
        if not (k.strip().isdigit() and n.strip().isdigit()) or not 0 <= int(k) < int(n):
            raise ConfigError(f"shard must be K/N with 0 <= K < N, got {text!r} (K counts from 0)", setting="shard")
        return cls(int(k), int(n))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, document: int) -> bool:
        return document % self.count == self.index


# All that a sweep (`state_file`, saved through a hidden temporary file) or a retrieval run (its trials, and its
# masked trials) keeps in OUT.partial/
_PARTIAL_ENTRY = re.compile(r"[^.].*\.npz|(retrieval|masking)-.+\.jsonl|\..+\.tmp")


def partial_folder(out: str | Path) -> Path:
    """Where a sweep into `out` keeps its partial states until it finishes: ``OUT.partial`` beside it.

    Refuses one that holds anything else, naming it: the sweep removes the folder whole once it finishes (or on
    `restart`), which must never take a user's files with it. Call it before any work.
    """
    out = where(out)  # as the system resolves it: "." and "link/.." name the folder they stand for
    partial = out.with_name(out.name + ".partial")
    if partial.is_dir():
        others = sorted(entry.name for entry in partial.iterdir() if not _PARTIAL_ENTRY.fullmatch(entry.name))
        if others:
            named = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
            them = "it" if len(others) == 1 else "them"
            raise TablesError(f"{partial}: holds {named}, which a stopped sweep does not keep there, and the sweep "
                              f"removes the folder once it finishes; move {them} out, or choose another --out")
    elif os.path.lexists(partial):
        raise TablesError(f"{partial}: is not a folder, and a sweep into {out.name} keeps its partial states there; "
                          f"move it, or choose another --out")
    return partial


