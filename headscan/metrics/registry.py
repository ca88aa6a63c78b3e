"""The metric registry: each metric registered once by name, with its definition and what a report needs.

`register` records a metric's function, its docstring (the definition), its chance level (a function of the
same batch whose docstring says how chance is defined for the metric; by default the metric applied to the
null head, `headscan.metrics.chance`), its table, unit, bounds, striking end and structural zeros; `get_metric` finds one by name ("did you mean"); `describe` is the one way to ask a
metric's unit, bounds and striking end, also for a name this headscan does not register (another version's
run).

This module holds no metric itself: `headscan.metrics` imports every module that registers one.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import MetricError
from ..tables import TABLES

if TYPE_CHECKING:
    import torch

    from .batch import AttentionBatch

__all__ = ["Axis", "Metric", "METRICS", "CONDITIONS", "CAPTURED", "DECODED", "DEFAULT_CHANCE", "NULLS", "SHUFFLED",
           "register", "get_metric", "metric_names", "describe",
           "definitions_markdown"]


@dataclass(frozen=True)
class Axis:
    """Extra key columns a metric adds to its table's rows (the offsets of the offset profile, say).

    The metric's function then returns sums and counts of shape (batch, head, n) for the n `positions` of the
    model it is given: `values`, or, with `for_model`, the positions that model's family fills.
    """

    columns: tuple[str, ...]  # key columns of the metric's table that this axis fills
    values: Callable[[object], list[tuple]]  # sweep settings -> one tuple per position any model's sweep fills
    # (sweep settings, the model is causal) -> the positions that model fills, for an axis whose positions depend
    # on the model's family (the syntax table's ``_visible`` directions: a causal model's alone); None: `values`
    for_model: Callable[[object, bool], list[tuple]] | None = None

    def positions(self, config, causal: bool) -> list[tuple]:
        """The positions of the function's last axis for a model that is `causal` (or not), swept with `config`."""
        return self.values(config) if self.for_model is None else self.for_model(config, causal)


# Conditions under which a metric is structural rather than measured; the report says why (see Metric).
CONDITIONS = ("causal", "bidirectional", "no_sep")


@dataclass(frozen=True, eq=False)  # one object per registered name: compared and hashed by identity
class Metric:
    """A registered metric: its function and what tables, figures and the report need to know about it."""

    name: str
    function: Callable[[AttentionBatch], tuple[torch.Tensor, torch.Tensor]]
    definition: str  # the function's docstring: the precise definition, shown in docs/metrics.md and the report
    table: str  # the name of its table in headscan.tables.TABLES
    unit: str  # what a value is measured in; the colour-bar label
    bounded: bool  # values lie in [0, 1] (drawn on one shared 0-1 colour scale)
    striking: str  # "high" or "low": which end marks a head worth a look (low entropy = a focused head)
    structural: dict[str, str]  # condition in CONDITIONS -> why the metric is 0 or undefined under it
    axis: Axis | None = None  # extra key columns, or None for one value per head
    needs: tuple[str, ...] = ()  # AttentionBatch fields besides the pattern it reads (captured internals)
    chance: Callable[[AttentionBatch], torch.Tensor | None] | None = None  # sums of the null head's score; None: default
    chance_definition: str = ""  # how its chance is defined: the chance function's docstring
    # Its queries are picked by the text's content (a repeated token), so a few rare units can hold most of the
    # population's sum: `headscan.intervals.thin` trusts its interval only where the sum is spread evenly.
    sparse: bool = False
    signed: bool = False  # values may be negative (a logit, a change); else >= 0, and intervals are clipped there
    # What a finding is tested against without random-init controls in the run (`headscan.metrics.nulls`):
    # "uniform" (the row's chance) or "controls" (nothing: only untrained heads say what no learning gives)
    null: str = "uniform"
    null_why: str = ""
    # Where a metric defined outside headscan came from (`headscan.metrics.custom`): its module or function and
    # the sha256 of its text, for run.json and the fingerprint; None for headscan's own.
    origin: dict | None = None
    # The largest value it can take when no query sees more than `keys` keys, for a metric whose range grows with
    # the context (entropy: ln keys nats); None where `bounded` and `signed` say all there is.
    ceiling: Callable[[int], float] | None = None
    # What a score kept on the shuffled-words control says the head follows (`SHUFFLED`): "position" where the
    # metric is defined by positions, which shuffling keeps (prev_token); "content" where the targets move with
    # the words (syntax: the tree is permuted with them); "" where shuffling asks no question of it
    shuffled: str = ""

    def bounds(self, keys: int | None = None) -> tuple[float, float]:
        """The range its values lie in, into which its intervals are clipped: (0, 1), (0, inf) or (-inf, inf);
        given `keys`, the most keys any query saw (a sweep's max_len), the top is `ceiling` of it where it has one.

        >>> get_metric("entropy").bounds(), get_metric("entropy").bounds(keys=128)  # ln 128
        ((0.0, inf), (0.0, 4.852030263919617))
        >>> get_metric("prev_token").bounds(keys=128), get_metric("dla").bounds(keys=128)
        ((0.0, 1.0), (-inf, inf))
        """
        high = 1.0 if self.bounded else np.inf
        if keys is not None and self.ceiling is not None:
            high = min(high, float(self.ceiling(keys)))
        return (-np.inf if self.signed else 0.0, high)

    def ranks_high(self) -> bool:
        return self.striking == "high"

    def chance_sums(self, batch: AttentionBatch) -> torch.Tensor | None:
        """Per-segment sums of the null head's score over the queries the metric counts, (batch, H[, axis]) with
        H 1 (the same for every head) or the number of heads; None where it cannot be computed (NaN)."""
        if self.chance is not None:
            return self.chance(batch)
        return self.function(batch.null_batch())[0]


METRICS: dict[str, Metric] = {}
# Optional AttentionBatch fields a metric may need: what a sweep captures, then what only decoding fills.
CAPTURED = ("value_norms", "logit_contributions", "final_scale", "output_norms", "attended_contributions", "needle",
            "generated")
DECODED = ("needle", "generated")  # filled by `headscan retrieval`'s decoding steps: such metrics are never swept
NULLS = ("uniform", "controls")
# What a score that survives the shuffled-words control says a head follows (`Metric.shuffled`), and why.
SHUFFLED = {
    "position": "defined by positions, which shuffling the words keeps: a head that keeps its score on shuffled "
                "words follows position, one that loses it followed the words that stood there",
    "content": "its targets move with the words when they are shuffled (the tree is permuted with them): a head "
               "that keeps its score follows the words, one that loses it needs them in their order (which carries "
               "position and syntax alike)",
}
# Why a metric's findings are tested against the null they are, where the metric does not say more.
DEFAULT_NULL_WHY = {
    "uniform": "a mean of attention weights: without random-init controls, uniform attention (the row's chance) is "
               "the null; with them, the range of the controls' heads at the same layer, and chance as well",
    "controls": "not a mean of attention weights, so uniform attention's value is not what an untrained head "
                "scores (random weights spread such scores far around it): only the range of random-init "
                "controls' heads at the same layer is a null, and without controls no row is tested",
}
DEFAULT_CHANCE = ("The metric itself on the null head (uniform attention over the keys each query sees, "
                  "value-weighted for value.parquet).")


def register(
    name: str,
    *,
    unit: str = "share of attention",
    bounded: bool = True,
    striking: str = "high",
    structural: dict[str, str] | None = None,
    table: str = "heads",
    axis: Axis | None = None,
    needs: tuple[str, ...] = (),
    chance: Callable | None = None,
    sparse: bool = False,
    signed: bool = False,
    null: str = "uniform",
    null_why: str = "",
    origin: dict | None = None,
    ceiling: Callable[[int], float] | None = None,
    shuffled: str = "",
):
    """Register a metric function under `name`; its docstring becomes its definition.

    `chance` computes the sums of the metric's chance level on the same batch and queries (so that the
    metric's counts are its counts; `headscan.metrics.chance`): a function whose docstring says how chance is
    defined for the metric. Without one, chance is the metric applied to the null head's attention
    (`AttentionBatch.null_batch`), which is right for metrics that are averages of the attention weights and
    wrong for argmax metrics, whose chance is the probability that the null head's draw hits the target.

    `sparse` marks a metric whose queries the text's content picks (a repeated token), so that a few rare units
    can hold most of its sum (`headscan.intervals.thin`); `signed` one whose values can be negative (else its
    intervals are clipped at 0, and at 1 where `bounded`); `ceiling`, for a metric whose largest value grows with
    the number of keys a query sees, gives that value for a number of keys (`Metric.bounds`): the intervals of a
    sweep whose segments hold at most max_len tokens are clipped there.

    `null` says what its findings are tested against when a run has no random-init controls: "uniform" (the
    row's chance, right for a mean of attention weights) or "controls" (nothing but untrained heads can say, so
    no row is tested without them); `null_why` says why, where `DEFAULT_NULL_WHY` does not (`headscan.metrics.nulls`).
    `shuffled` says what a score kept on the shuffled-words control means (`SHUFFLED`: "position", "content";
    "" where that control asks no question of the metric).

    `table` names a table of `headscan.tables.TABLES`: the metric's rows go there, keyed by the metric's
    name where the table has a ``metric`` column and by `axis` for the rest of its keys. `needs` names the
    optional `AttentionBatch` fields the metric reads (``value_norms``, ``logit_contributions``,
    ``final_scale``); the sweep scores it only where it captured them, and leaves it NaN elsewhere. A metric
    that needs a field of `DECODED` (``needle``, ``generated``) is scored by ``headscan retrieval``'s decoding
    steps and never by a sweep.
    """

    def decorate(function):
        if name in METRICS:
            raise MetricError(f"metric {name!r} is registered twice ({METRICS[name].function.__qualname__} "
                              f"and {function.__qualname__}); pick another name")
        definition = inspect.cleandoc(function.__doc__ or "")
        if not definition:
            raise MetricError(f"metric {name!r} has no docstring: its docstring is its definition")
        if table not in TABLES:
            raise MetricError(f"metric {name!r}: no table {table!r}; register it first (tables: {', '.join(TABLES)})")
        extra_keys = [key for key in TABLES[table].keys if key != "metric"]
        if list(axis.columns if axis else ()) != extra_keys:
            raise MetricError(f"metric {name!r}: table {table!r} is keyed by {extra_keys} beyond the metric, "
                              f"so the metric's axis must fill exactly those columns")
        if striking not in ("high", "low") or set(structural or {}) - set(CONDITIONS):
            raise MetricError(f"metric {name!r}: striking is 'high' or 'low'; structural conditions are {CONDITIONS}")
        unknown = sorted(set(needs) - set(CAPTURED))
        if unknown:
            raise MetricError(f"metric {name!r}: needs {unknown[0]!r}, which no sweep captures (choose from {CAPTURED})")
        if null not in NULLS:
            raise MetricError(f"metric {name!r}: null is one of {', '.join(NULLS)}, got {null!r}")
        if shuffled and shuffled not in SHUFFLED:
            raise MetricError(f"metric {name!r}: shuffled is '' or one of {', '.join(SHUFFLED)}, got {shuffled!r}")
        chance_definition = inspect.cleandoc(chance.__doc__ or "") if chance is not None else DEFAULT_CHANCE
        if not chance_definition:
            raise MetricError(f"metric {name!r}: its chance function has no docstring; say how chance is defined")
        METRICS[name] = Metric(name, function, definition, table, unit, bounded, striking, dict(structural or {}), axis,
                               tuple(needs), chance, chance_definition, bool(sparse), bool(signed), null,
                               null_why or DEFAULT_NULL_WHY[null], origin, ceiling, shuffled)
        return function

    return decorate


def get_metric(name: str) -> Metric:
    """The registered metric called `name`; an unknown name gets "did you mean".

    >>> get_metric("entropy").unit, get_metric("entropy").striking
    ('nats', 'low')
    >>> get_metric("prev_tokens")
    Traceback (most recent call last):
    ...
    headscan.errors.MetricError: unknown metric 'prev_tokens'. Did you mean 'prev_token'? Available: ...
    """
    if name in METRICS:
        return METRICS[name]
    close = difflib.get_close_matches(name, METRICS, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise MetricError(f"unknown metric {name!r}.{hint} Available: {', '.join(METRICS)}")


def metric_names(table: str = "heads") -> list[str]:
    """Names of the metrics whose rows go into `table`, in registry order."""
    return [m.name for m in METRICS.values() if m.table == table]


def _unknown(function):
    raise MetricError("a metric this headscan does not register cannot be computed")


def describe(name: str) -> Metric:
    """The registered metric called `name`, or, for a name this headscan does not register (a run written by
    another version), a stand-in measured in "value", taken to lie in [0, 1] with its high end striking and
    nothing structural: the one way to ask a metric's unit, bounds and striking end.

    >>> describe("entropy").unit, describe("entropy").bounded, describe("entropy").ranks_high()
    ('nats', False, False)
    >>> describe("from_the_future").unit, describe("from_the_future").bounded, describe("from_the_future").ranks_high()
    ('value', True, True)
    """
    if name in METRICS:
        return METRICS[name]
    return Metric(name, _unknown, "", "heads", "value", True, "high", {}, null="controls",
                  null_why=DEFAULT_NULL_WHY["controls"])


def definitions_markdown() -> str:
    """The metric definitions as a Markdown list, straight from the registry, for docs/metrics.md and the report."""
    lines = []
    for metric in METRICS.values():
        where = f"{metric.table}.parquet, {metric.unit}"
        if metric.striking == "low":
            where += ", low is striking"
        body = " ".join(metric.definition.split())
        chance = " ".join(metric.chance_definition.split())
        null = " ".join(metric.null_why.split())
        lines.append(f"- **`{metric.name}`** ({where}): {body} *Chance:* {chance} *Null of its findings:* {null}.")
    return "\n".join(lines) + "\n"
