"""What a sweep computes and in what order: its score columns, its fingerprint, and its windows.

A sweep's *columns* are every registered metric once per position of its axis (then, with ``values``, the
heads metrics again on value-weighted attention); its *fingerprint* is all that two partial states must share
to be added up or resumed; its *windows* cut the corpus (or a shard) between bootstrap units.

This module runs no model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import __version__
from ..config import SweepConfig
from ..corpus import Corpus, Segment  # noqa: F401  (Segment: the doctest's)
from ..metrics import DECODED, METRICS, Metric
from .state import FINGERPRINT_FIELDS, Shard

if TYPE_CHECKING:
    from ..models import HookedModel

__all__ = ["Column", "has_words", "columns_of", "fingerprint", "plan_windows", "unit_of"]

# A metric, one position of its axis (() for a metric without one), and the table its rows go to: the metric's
# own, or "value" for a heads metric computed on value-weighted attention.
Column = tuple[Metric, tuple, str]


def has_words(corpus_kind: str) -> bool:
    """Whether a corpus of this kind carries gold words and trees (for the syntax table): CoNLL-U."""
    return corpus_kind == "conllu"


def columns_of(config: SweepConfig, words: bool = False) -> list[Column]:
    """The score columns of one head: each metric once per position of its axis, in registry order; then, with
    ``config.values``, every pattern metric of heads.parquet again on value-weighted attention (table "value").

    The syntax metric only where the corpus has `words` (CoNLL-U): elsewhere it would be an all-NaN table.
    Metrics that need captured internals (`Metric.needs`: moved, dla) only with ``config.values``; metrics
    read while decoding (retrieval) never.
    """
    own = [(metric, key, metric.table) for metric in METRICS.values()
           if (words or metric.table != "syntax") and (config.values or not metric.needs)
           and not set(metric.needs) & set(DECODED)  # scored while decoding (headscan retrieval), never swept
           for key in (metric.axis.values(config) if metric.axis else [()])]
    weighted = [(metric, (), "value") for metric in METRICS.values() if metric.table == "heads" and not metric.needs]
    return own + (weighted if config.values else [])


def _column_name(column: Column) -> list:
    metric, key, table = column
    return [metric.name, list(key)] + ([table] if table != metric.table else [])


def fingerprint(model: HookedModel, corpus: Corpus, config: SweepConfig) -> dict:
    """Everything two partial states must share to be added up, or a saved state to be resumed."""
    return {
        "headscan": __version__,
        "model": {"name": model.name, "id": model.id, "revision": model.revision},
        "corpus": {"source": corpus.source, "kind": corpus.kind, "sha256": corpus.sha256},
        "settings": {name: getattr(config, name) for name in FINGERPRINT_FIELDS},
        "columns": [_column_name(column) for column in columns_of(config, has_words(corpus.kind))],
    }


# --- windows -----------------------------------------------------------------------------------------------


def unit_of(index: int, document: int, config: SweepConfig) -> int:
    return document if config.bootstrap_unit == "document" else index


def plan_windows(corpus: Corpus, config: SweepConfig, shard: Shard | None = None) -> list[list[int]]:
    """The sweep's plan: segment indices in windows of at least ``config.window`` segments, cut only between
    bootstrap units, restricted to `shard`. The same corpus, settings and shard always give the same plan.

    >>> corpus = Corpus("c", "text", "", tuple(Segment("a", i, document=i // 3) for i in range(7)))
    >>> plan_windows(corpus, SweepConfig(window=2))
    [[0, 1], [2, 3], [4, 5], [6]]
    >>> plan_windows(corpus, SweepConfig(window=2, bootstrap_unit="document"))
    [[0, 1, 2], [3, 4, 5], [6]]
    >>> plan_windows(corpus, SweepConfig(window=2), Shard(1, 2))
    [[3, 4], [5]]
    """
    windows: list[list[int]] = []
    current: list[int] = []
    last_unit = None
    for index, document in enumerate(corpus.segment_documents.tolist()):  # no segment is read from a file
        if shard is not None and not shard.holds(document):
            continue
        unit = unit_of(index, document, config)
        if len(current) >= config.window and unit != last_unit:
            windows.append(current)
            current = []
        current.append(index)
        last_unit = unit
    if current:
        windows.append(current)
    return windows
