"""What a sweep computes and in what order, resolved once per model into a `SweepPlan`: its settings, score
columns, fingerprint and windows.

A sweep's *columns* are every registered metric once per position of its axis (then, with ``values``, the
heads metrics again on value-weighted attention); its *fingerprint* is all that two partial states must share
to be added up or resumed; its *windows* cut the corpus (or a shard) between bootstrap units.

This module runs no model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import __version__
from ..config import SweepConfig
from ..corpus import Corpus, Segment  # noqa: F401  (Segment: the doctest's)
from ..metrics import DECODED, METRICS, Metric
from ..setting import fingerprinted
from ..setting_values import check_layers
from .passes.base import PASSES
from .state import Shard

if TYPE_CHECKING:
    from ..models import HookedModel

__all__ = ["Column", "SweepPlan", "plan_sweep", "has_words", "for_model", "columns_of", "column_names", "pattern_columns",
           "fingerprint", "plan_windows",
           "resolve_unit", "unit_of"]

# A metric, one position of its axis (() for a metric without one), and the table its rows go to: the metric's
# own, or "value" for a heads metric computed on value-weighted attention.
Column = tuple[Metric, tuple, str]


def has_words(corpus_kind: str) -> bool:
    """Whether a corpus of this kind carries gold words and trees (for the syntax table): CoNLL-U."""
    return corpus_kind == "conllu"


def for_model(config: SweepConfig, model: HookedModel) -> tuple[SweepConfig, str | None]:
    """The settings `model` is swept with, and the line that says what changed (None: nothing did).

    ``max_len`` is clamped to the model's context: a longer segment could not go through the model, and
    everything that follows from ``max_len`` (the position buckets, eager or chunked) must follow the clamp.
    With ``importance_models``, a model it does not name is swept without importance (`SweepConfig.for_swept`):
    its fingerprint says so, and a state saved under another choice does not resume.
    """
    config = config.for_swept(model.name)
    if config.max_len <= model.max_context:
        return config, None
    note = (f"{model.name}: --max-len {config.max_len} is past its context of {model.max_context} tokens; "
            f"swept with --max-len {model.max_context}")
    return dataclasses.replace(config, max_len=model.max_context), note


def columns_of(config: SweepConfig, words: bool = False, *, causal: bool) -> list[Column]:
    """The score columns of one head of a model that is `causal` (or bidirectional): each metric once per position
    of its axis for that model (`headscan.metrics.Axis.positions`: a bidirectional model's syntax table has no
    ``_visible`` directions), in registry order; then, with
    ``config.values``, every pattern metric of heads.parquet again on value-weighted attention (table "value");
    last, with ``config.importance``, the importance columns (one per method and target), which no attention
    pattern fills (`headscan.scan.importance` does).

    The syntax metric only where the corpus has `words` (CoNLL-U): elsewhere it would be an all-NaN table.
    Metrics that need captured internals (`Metric.needs`: moved, dla) only with ``config.values``; metrics
    read while decoding (retrieval) never.
    """
    own = [(metric, key, metric.table) for metric in METRICS.values()
           if (words or metric.table != "syntax") and (config.values or not metric.needs)
           and not set(metric.needs) & set(DECODED)  # scored while decoding (headscan retrieval), never swept
           for key in (metric.axis.positions(config, causal) if metric.axis else [()])]
    weighted = [(metric, (), "value") for metric in METRICS.values() if metric.table == "heads" and not metric.needs]
    pattern = [column for column in own if column[2] != "importance"]
    return pattern + (weighted if config.values else []) + [column for column in own if column[2] == "importance"]


def pattern_columns(columns: list[Column]) -> list[Column]:
    """The columns an attention pattern fills: all but importance's, which come last."""
    return [column for column in columns if column[2] != "importance"]


def column_names(columns) -> list[list]:
    """The score columns as the fingerprint holds them: [metric, [axis position]] (and the table, where it is not
    the metric's own), as JSON gives them back."""
    return [[metric.name, list(key)] + ([table] if table != metric.table else []) for metric, key, table in columns]


@dataclass(frozen=True)
class SweepPlan:
    """Everything one model's sweep needs, resolved once (`plan_sweep`); nothing downstream resolves it again."""

    config: SweepConfig  # as the model is swept: max_len within its context, the bootstrap unit resolved
    unit_why: str  # why the bootstrap resamples that unit, in words (`resolve_unit`)
    clamped: str | None  # the line that says max_len was clamped to the model's context (None: it was not)
    shard: Shard | None  # the part of the corpus swept (None: all of it)
    words: bool  # the corpus carries gold words and trees (CoNLL-U): the syntax table and its baseline
    columns: tuple[Column, ...]  # the score columns of one head (`columns_of`)
    windows: tuple[tuple[int, ...], ...]  # segment indices, window by window (`plan_windows`)
    fingerprint: dict  # all that a saved or another shard's state must share with this sweep's
    passes: tuple[str, ...] = ()  # the registered passes this sweep runs (`headscan.scan.passes`), in order
    # the model's layers this sweep hooks and scores (all of them unless ``config.layers``): the layer axis of every
    # array of its state is these, in order
    layers: tuple[int, ...] = ()


def plan_sweep(model: HookedModel, corpus: Corpus, config: SweepConfig, shard: Shard | None = None, *,
               unit_why: str | None = None) -> SweepPlan:
    """The plan of `model`'s sweep over `corpus` (or its `shard`). `config`'s bootstrap unit is resolved here unless
    `unit_why` says it was already (`headscan.sweep` resolves it once for all its models)."""
    config, clamped = for_model(config, model)
    if unit_why is None:
        config, unit_why = resolve_unit(corpus, config)
    elif config.bootstrap_unit == "auto":
        raise ValueError("plan_sweep: unit_why given for a config whose bootstrap_unit is still 'auto'")
    layers = check_layers(config.layers, model.n_layers, model.name)  # refuses a layer the model does not have
    words = has_words(corpus.kind)
    columns = tuple(columns_of(config, words, causal=model.causal))
    windows = tuple(tuple(window) for window in plan_windows(corpus, config, shard))
    marks = {
        "headscan": __version__,
        "model": {"name": model.name, "id": model.id, "revision": model.revision,
                  "control": model.extra.get("control"), "control_seed": model.extra.get("control_seed"),
                  # chance and the occurrence metrics see only a sliding window: a state from before headscan
                  # read windows (no entry) does not resume into one that does
                  **({"windows": list(model.windows)} if model.windows else {})},
        "corpus": {"source": corpus.source, "kind": corpus.kind, "sha256": corpus.sha256},
        # the settings whose change changes the numbers, as declared (`headscan.setting.fingerprinted`), as JSON
        # gives them back (a saved state's are lists)
        "settings": {name: list(value) if isinstance(value := getattr(config, name), tuple) else value
                     for name in fingerprinted(SweepConfig)},
        "columns": column_names(columns),
    }
    # a metric defined outside headscan: its text's hash, so a state swept with another definition never mixes in
    custom = {metric.name: metric.origin["sha256"] for metric, _, _ in columns if metric.origin is not None}
    if custom:
        marks["custom_metrics"] = custom
    plan = SweepPlan(config, unit_why, clamped, shard, words, columns, windows, marks, layers=layers)
    passes = tuple(name for name, one in PASSES.items() if one.wanted(plan))
    marks["passes"] = list(passes)  # a state swept without a pass cannot resume or merge into a sweep with it
    return dataclasses.replace(plan, passes=passes)


def fingerprint(model: HookedModel, corpus: Corpus, config: SweepConfig) -> dict:
    """Everything two partial states must share to be added up, or a saved state to be resumed (the settings
    as `model` is swept with them: `plan_sweep`)."""
    return plan_sweep(model, corpus, config).fingerprint


# --- windows -----------------------------------------------------------------------------------------------


def resolve_unit(corpus: Corpus, config: SweepConfig) -> tuple[SweepConfig, str]:
    """`config` with its bootstrap unit resolved for `corpus`, and why, in words (said on the terminal and kept
    in the run's provenance). ``"auto"`` resamples documents where some document holds several segments,
    whose segments are not independent, and segments otherwise (also for a corpus of one document, which
    cannot be resampled); an explicit unit is kept.

    >>> corpus = Corpus("c", "text", "", tuple(Segment("a", i, document=i // 3) for i in range(7)), documents="paragraphs")
    >>> resolve_unit(corpus, SweepConfig())
    (..., 'auto: documents, since the corpus has 3 documents of 7 segments (paragraphs), whose segments are not independent')
    >>> resolve_unit(corpus, SweepConfig(bootstrap_unit="segment"))[1]
    'segment, as asked, though the corpus has 3 documents of 7 segments (paragraphs), whose segments are not independent'
    """
    n_documents, n_segments = corpus.n_documents, len(corpus.segments)
    grouped = n_documents < n_segments  # some document holds several segments
    found = f"the corpus has {n_documents:,} documents of {n_segments:,} segments ({corpus.documents})"
    if config.bootstrap_unit != "auto":
        why = f"{config.bootstrap_unit}, as asked"
        if config.bootstrap_unit == "segment" and grouped:
            why += f", though {found}, whose segments are not independent"
        return config, why
    if grouped and n_documents < 2:  # one document: resampling it cannot give an interval
        unit, why = "segment", (f"auto: segments, since the corpus is one document ({corpus.documents}), which "
                                f"cannot be resampled; its segments are not independent, so intervals are too narrow")
    elif grouped:
        unit, why = "document", f"auto: documents, since {found}, whose segments are not independent"
    else:
        unit, why = "segment", f"auto: segments, since {_one_segment_each(corpus.documents)}"
    return dataclasses.replace(config, bootstrap_unit=unit), why


def _one_segment_each(documents: str) -> str:
    """Why every document of a corpus is one segment, as a clause: a reader's "none: ..." note turned around, so
    that the terminal line holds no parentheses inside parentheses.

    >>> _one_segment_each("none: each segment is its own document")
    'each segment is its own document'
    >>> _one_segment_each("none: no # newdoc lines, so each sentence is its own document")
    'each sentence is its own document (no # newdoc lines)'
    >>> _one_segment_each("blank-line paragraphs")
    'every document holds one segment (blank-line paragraphs)'
    """
    if not documents.startswith("none: "):
        return f"every document holds one segment ({documents})"
    cause, _, result = documents.removeprefix("none: ").rpartition(", so ")
    return f"{result} ({cause})" if cause else result


def unit_of(index: int, document: int, config: SweepConfig) -> int:
    """The bootstrap unit of a segment: its document, or itself (`config`'s unit resolved: `resolve_unit`)."""
    if config.bootstrap_unit == "auto":
        raise ValueError("bootstrap_unit 'auto' must be resolved for the corpus first (resolve_unit)")
    return document if config.bootstrap_unit == "document" else index


def plan_windows(corpus: Corpus, config: SweepConfig, shard: Shard | None = None) -> list[list[int]]:
    """The sweep's windows: segment indices in windows of at least ``config.window`` segments, cut only between
    bootstrap units (`config`'s, resolved: `resolve_unit`), restricted to `shard`. The same corpus, settings and shard always give the same plan.

    >>> corpus = Corpus("c", "text", "", tuple(Segment("a", i, document=i // 3) for i in range(7)))
    >>> plan_windows(corpus, SweepConfig(window=2, bootstrap_unit="segment"))
    [[0, 1], [2, 3], [4, 5], [6]]
    >>> plan_windows(corpus, SweepConfig(window=2, bootstrap_unit="document"))
    [[0, 1, 2], [3, 4, 5], [6]]
    >>> plan_windows(corpus, SweepConfig(window=2, bootstrap_unit="segment"), Shard(1, 2))
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
