"""Head metrics: pure, vectorised functions of one layer's attention pattern, registered once by name.

Every metric takes an `AttentionBatch` (one layer's pattern for a batch of segments, with its masks and token
ids) and returns per-segment ``(sums, counts)`` of shape ``(batch, head)`` (``(batch, head, n)`` for a metric
with an `Axis`, such as the offset profile). The pattern may hold only a block of queries (chunked attention,
`headscan.chunked`): positions are absolute, so the sums and counts of the blocks of a layer add up to those
of the whole pattern, and no metric builds anything larger than a small multiple of one block. The score of a head is ``sum / count`` over the whole corpus: a mean over the queries that
count for that metric, NaN when none does. Keeping sums and counts per segment lets the sweep add them up
exactly and bootstrap over segments without a second pass.

Notation used in every definition: ``A[q, k]`` is the attention weight of query position ``q`` on key
position ``k`` within one segment; a *real* token is one that is neither padding nor, when the sweep leaves
special tokens out (``specials="exclude"``), a special token ([CLS], [SEP], BOS). Only real queries count.

Which one should you use?

- ``prev_token`` / ``next_token`` score how much a head looks one token back or ahead; ``positional_prev`` /
  ``positional_next`` ask how *often* that is where it looks most (Voita et al. 2019 call a head positional
  when this share is at least 0.9).
- ``first_token`` and ``sep`` find "attention sinks" (Clark et al. 2019: much of BERT's attention goes to
  [CLS] and [SEP]); ``entropy`` and ``distance`` say how broad and how far a head looks.
- ``duplicate_token`` and ``induction`` (Olsson et al. 2022) need repeated tokens: sweep the
  ``repeat-random`` corpus for a clean signal.
- the offset profile (``offsets.parquet``) is the whole picture behind prev/self/next.

This module does not run models or read corpora; see `headscan.scan`.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import torch

from ..errors import MetricError

__all__ = ["AttentionBatch", "Axis", "Metric", "METRICS", "register", "get_metric", "metric_names", "offset_range",
           "buckets", "definitions_markdown"]


@dataclass(frozen=True)
class AttentionBatch:
    """One layer's attention for a batch of right-padded segments, with what the metrics need to read it.

    `pattern` holds the rows of queries ``query_start .. query_start + q - 1`` (all of them in eager mode, one
    block in chunked mode) against every key; query and key positions are absolute, counted from the first
    token. Tensors are never written to: metrics build new tensors from them.
    """

    pattern: torch.Tensor  # (batch, head, q, k) attention weights of the block's queries; real rows sum to 1
    query_mask: torch.Tensor  # (batch, q) bool: the block's queries that count (real, not special when excluded)
    key_mask: torch.Tensor  # (batch, k) bool: keys that count, over the whole sequence
    tokens: torch.Tensor  # (batch, k) token ids
    sep_mask: torch.Tensor  # (batch, k) bool: [SEP] tokens (all False for models without one)
    causal: bool  # True when a query can only see keys at or before it
    max_offset: int = 8  # K of the offset profile: offsets -K..K (at least 1: prev and next read from it)
    words: object = None  # a `headscan.syntax.WordAlignment` for CoNLL-U corpora, else None
    raw_pattern: torch.Tensor | None = None  # the pattern before specials="exclude" renormalised it (None: same)
    query_start: int = 0  # position of the pattern's first query row (0 in eager mode)
    max_len: int | None = None  # the sweep's max_len: sets the position buckets (None: the key length)
    # What the sweep captured besides the pattern (None where it did not; a metric's `needs` names what it reads):
    value_norms: torch.Tensor | None = None  # (batch, head, k) ||f(x_k)|| = ||v_k W_O^h||, b_V in, b_O out
    logit_contributions: torch.Tensor | None = None  # (batch, head, q) z_q^h W_O^h . d[:, t_{q+1}], before the scale
    final_scale: torch.Tensor | None = None  # (batch, q) the final norm's divisor, frozen from the forward pass

    def __post_init__(self):
        if self.max_offset < 1:
            raise MetricError(f"max_offset must be at least 1, got {self.max_offset}")

    @property
    def offsets(self) -> torch.Tensor:
        window = offset_range(self.max_offset)
        return torch.arange(window.start, window.stop, device=self.pattern.device)

    @property
    def query_positions(self) -> torch.Tensor:
        """(q,) the absolute position of each query row of the pattern."""
        n_q = self.pattern.shape[-2]
        return torch.arange(self.query_start, self.query_start + n_q, device=self.pattern.device)

    @property
    def key_positions(self) -> torch.Tensor:
        """(k,) the position of each key: 0 .. k - 1."""
        return torch.arange(self.pattern.shape[-1], device=self.pattern.device)

    # Derived tensors several metrics share, computed once per layer (new tensors, never the inputs).
    @cached_property
    def masked(self) -> torch.Tensor:
        """(batch, head, q, k) the pattern with keys that do not count set to 0, whatever they held."""
        if bool(self.key_mask.all()):
            return self.pattern  # nothing to drop: read-only use, so no copy is needed
        keep = self.key_mask[:, None, None, :]
        masked = self.pattern * keep  # four times faster than where() on CPU ...
        # ... but NaN or inf in a dropped cell would survive it. One sum finds them (weights are at most 1, so
        # a finite pattern cannot overflow it) without the bool tensor isfinite() would build.
        if not torch.isfinite(masked.sum()):
            masked = torch.where(keep, self.pattern, torch.zeros((), dtype=self.pattern.dtype))
        return masked

    @cached_property
    def entropy(self) -> torch.Tensor:
        """(batch, head, q) entropy of each query's attention over the keys that count, in nats."""
        # x log x with 0 log 0 = 0: clamping first is over twice as fast as torch.special.xlogy on CPU
        tiny = torch.finfo(self.masked.dtype).tiny
        return -(self.masked * torch.log(self.masked.clamp_min(tiny))).sum(-1)

    @cached_property
    def distance(self) -> torch.Tensor:
        """(batch, head, q) sum_k A[q, k] |q - k| over keys that count: shared by distance and its buckets."""
        gap = (self.query_positions[:, None] - self.key_positions[None, :]).abs().to(self.pattern.dtype)  # (q, k)
        return (self.masked * gap).sum(-1)

    @cached_property
    def top_key(self) -> torch.Tensor:
        """(batch, head, q) the key that gets each query's largest weight among keys that count; -1 where
        the query puts no weight at all on keys that count (it then has no "top key")."""
        largest, key = self.masked.max(-1)
        return torch.where(largest > 0, key, -1)

    @cached_property
    def at_offsets(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A[q, q + d] for every offset d in -K..K, and where it is defined (query and key q + d both count).

        (batch, head, q, offset) weights and (batch, q, offset) validity; prev/self/next read from it too.
        """
        b, h, n_q, n_k = self.pattern.shape
        keys = self.query_positions[:, None] + self.offsets[None, :]  # (q, offset) absolute key positions
        in_range = (keys >= 0) & (keys < n_k)
        keys = keys.clamp(0, n_k - 1)
        weights = self.pattern.gather(-1, keys.expand(b, h, n_q, -1))  # (batch, head, q, offset)
        valid = self.query_mask[:, :, None] & self.key_mask[:, keys] & in_range  # (batch, q, offset)
        return weights, valid

    @cached_property
    def other_occurrences(self) -> torch.Tensor:
        """(batch, q, k) bool: key k holds the query's token at another position that the query sees.

        Earlier positions only for causal models; both count.
        """
        queries, keys = self.query_positions, self.key_positions
        same = self.tokens[:, queries, None] == self.tokens[:, None, :]  # (batch, q, k)
        other = keys[None, :] < queries[:, None] if self.causal else keys[None, :] != queries[:, None]  # (q, k)
        return same & other & self.query_mask[:, :, None] & self.key_mask[:, None, :]

    def n_visible(self) -> torch.Tensor:
        """(batch, q) how many keys that count query q could see under the model's mask."""
        if self.causal:
            return self.key_mask.cumsum(-1)[:, self.query_positions]  # keys at or before q
        return self.key_mask.sum(-1, keepdim=True).expand(-1, self.pattern.shape[-2])


def offset_range(max_offset: int) -> range:
    """The offsets d of the offset profile, -K..K: the one place this range is built.

    >>> list(offset_range(2))
    [-2, -1, 0, 1, 2]
    """
    return range(-max_offset, max_offset + 1)


@dataclass(frozen=True)
class Axis:
    """Extra key columns a metric adds to its table's rows (the offsets of the offset profile, say).

    The metric's function then returns sums and counts of shape (batch, head, n) for the n `values`.
    """

    columns: tuple[str, ...]  # key columns of the metric's table that this axis fills
    values: Callable[[object], list[tuple]]  # sweep settings -> one tuple per position of the function's last axis


# Conditions under which a metric is structural rather than measured; the report says why (see Metric).
CONDITIONS = ("causal", "bidirectional", "no_sep")


@dataclass(frozen=True, eq=False)  # one object per registered name: compared and hashed by identity
class Metric:
    """A registered metric: its function and what tables, figures and the report need to know about it."""

    name: str
    function: Callable[[AttentionBatch], tuple[torch.Tensor, torch.Tensor]]
    definition: str  # the function's docstring: the precise definition, shown in README and report
    table: str  # the name of its table in headscan.tables.TABLES
    unit: str  # what a value is measured in; the colour-bar label
    bounded: bool  # values lie in [0, 1] (drawn on one shared 0-1 colour scale)
    striking: str  # "high" or "low": which end marks a head worth a look (low entropy = a focused head)
    structural: dict[str, str]  # condition in CONDITIONS -> why the metric is 0 or undefined under it
    axis: Axis | None = None  # extra key columns, or None for one value per head
    needs: tuple[str, ...] = ()  # AttentionBatch fields besides the pattern it reads (captured internals)

    def ranks_high(self) -> bool:
        return self.striking == "high"


METRICS: dict[str, Metric] = {}
CAPTURED = ("value_norms", "logit_contributions", "final_scale")  # optional AttentionBatch fields a metric may need


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
):
    """Register a metric function under `name`; its docstring becomes its definition.

    `table` names a table of `headscan.tables.TABLES`: the metric's rows go there, keyed by the metric's
    name where the table has a ``metric`` column and by `axis` for the rest of its keys. `needs` names the
    optional `AttentionBatch` fields the metric reads (``value_norms``, ``logit_contributions``,
    ``final_scale``); the sweep scores it only where it captured them, and leaves it NaN elsewhere.
    """
    from ..tables.io import TABLES

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
        METRICS[name] = Metric(name, function, definition, table, unit, bounded, striking, dict(structural or {}), axis,
                               tuple(needs))
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


# --- shared reductions -------------------------------------------------------------------------------------


def _mean_over_queries(score: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-segment sums and counts of `score` (batch, head, q) over queries where `valid` (batch, q)."""
    valid = valid[:, None, :]  # (batch, 1, q)
    # where() rather than multiply: whatever sits in invalid positions (even NaN) must not leak.
    sums = torch.where(valid, score, torch.zeros((), dtype=score.dtype, device=score.device)).sum(-1)
    counts = valid.sum(-1).to(score.dtype).expand_as(sums)
    return sums, counts  # (batch, head) each


def _mean_at_offset(batch: AttentionBatch, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    weights, valid = batch.at_offsets
    column = offset + batch.max_offset
    return _mean_over_queries(weights[..., column], valid[..., column])


def _share_where_argmax_at(batch: AttentionBatch, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    target = batch.query_positions + offset  # (q,)
    hit = (batch.top_key == target).to(batch.pattern.dtype)  # (batch, head, q)
    _, valid = batch.at_offsets
    return _mean_over_queries(hit, valid[..., offset + batch.max_offset])


def _first_token_per_query(batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, head, q) attention on the first token, and (batch, q) where it counts: real queries q >= 1."""
    weights = batch.masked[..., 0]  # (batch, head, q)
    valid = batch.query_mask & batch.key_mask[:, :1] & (batch.query_positions >= 1)
    return weights, valid


def buckets(max_len: int) -> list[int]:
    """The position buckets of segments of up to `max_len` tokens: 0 (position 0 alone), then 1, 2, 4, ...,
    each bucket b holding the positions [b, 2b) below max_len.

    >>> buckets(128)
    [0, 1, 2, 4, 8, 16, 32, 64]
    >>> buckets(5)
    [0, 1, 2, 4]
    """
    found = [0]
    bucket = 1
    while bucket < max_len:
        found.append(bucket)
        bucket *= 2
    return found


def _by_bucket(score: torch.Tensor, valid: torch.Tensor, batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums and counts of `score` (batch, head, q) over queries where `valid` (batch, q), by position bucket:
    (batch, head, bucket), with one matrix product by a (q, bucket) one-hot."""
    n_buckets = len(buckets(batch.max_len or batch.pattern.shape[-1]))
    positions = batch.query_positions
    # bucket of position p: 0 for p = 0, else floor(log2 p) + 1 (positions past max_len join the last bucket)
    index = torch.where(positions > 0, torch.frexp(positions.double())[1].long(), 0).clamp_max(n_buckets - 1)  # (q,)
    one_hot = torch.nn.functional.one_hot(index, n_buckets).to(score.dtype)  # (q, bucket)
    zero = torch.zeros((), dtype=score.dtype, device=score.device)
    sums = torch.where(valid[:, None, :], score, zero) @ one_hot  # (batch, head, bucket)
    counts = (valid.to(score.dtype) @ one_hot)[:, None, :].expand_as(sums)  # (batch, head, bucket)
    return sums, counts


_NO_FUTURE = "a causal model's queries cannot see later tokens, so it is 0 for every head"

# --- registered metrics ------------------------------------------------------------------------------------


@register("prev_token")
def prev_token(batch: AttentionBatch):
    """Mean of A[q, q-1] over real queries q whose previous position q-1 is a real token."""
    return _mean_at_offset(batch, -1)


@register("next_token", structural={"causal": _NO_FUTURE})
def next_token(batch: AttentionBatch):
    """Mean of A[q, q+1] over real queries q whose next position q+1 is a real token.

    Structurally 0 for causal models, whose queries cannot see the future; reported, not dropped.
    """
    return _mean_at_offset(batch, +1)


@register("self")
def self_attention(batch: AttentionBatch):
    """Mean of A[q, q] (attention to the query's own token) over real queries q."""
    return _mean_at_offset(batch, 0)


@register("first_token")
def first_token(batch: AttentionBatch):
    """Mean attention on the segment's first token (BOS or [CLS] when the model uses one) over real queries q >= 1.

    Undefined (NaN) when the first token does not count, e.g. when special tokens are left out.
    """
    return _mean_over_queries(*_first_token_per_query(batch))


@register("sep", structural={"no_sep": "the model has no [SEP] token, so it is undefined for every head"})
def sep(batch: AttentionBatch):
    """Mean over real queries of the total attention on [SEP] tokens.

    Defined only for segments holding a [SEP] that counts (NaN for models without one, such as GPT-2).
    """
    on_sep = batch.sep_mask & batch.key_mask  # (batch, k)
    # multiply-and-sum: several times faster than the equivalent einsum (a batched matmul) on CPU
    weights = (batch.masked * on_sep[:, None, None, :].to(batch.pattern.dtype)).sum(-1)  # (batch, head, q)
    valid = batch.query_mask & on_sep.any(-1, keepdim=True)
    return _mean_over_queries(weights, valid)


@register("entropy", unit="nats", bounded=False, striking="low")
def entropy(batch: AttentionBatch):
    """Mean over real queries of the entropy -sum_k A[q, k] log A[q, k] of the query's attention, in nats.

    Only keys that count enter the sum (0 log 0 = 0).
    """
    return _mean_over_queries(batch.entropy, batch.query_mask)


@register("entropy_norm", unit="fraction of the largest possible entropy", striking="low")
def entropy_norm(batch: AttentionBatch):
    """Mean over real queries of the entropy divided by log(n), n the number of keys the query could see.

    0 is attention on one key, 1 is uniform attention over all it could see. Queries that see a single key
    (the first token of a causal model) have no defined value and do not count.
    """
    n_visible = batch.n_visible().to(batch.pattern.dtype)  # (batch, q)
    normalised = batch.entropy / torch.log(n_visible.clamp_min(2))[:, None, :]
    return _mean_over_queries(normalised, batch.query_mask & (n_visible >= 2))


@register("distance", unit="tokens", bounded=False)
def distance(batch: AttentionBatch):
    """Mean over real queries of sum_k A[q, k] |q - k|: how far, in tokens, a head looks on average."""
    return _mean_over_queries(batch.distance, batch.query_mask)


@register("positional_prev", unit="share of queries")
def positional_prev(batch: AttentionBatch):
    """Share of real queries q (with q-1 real) whose largest attention weight is on q-1.

    A query with no weight on any key that counts has no largest weight and scores 0 (a miss).

    Voita et al. (2019) call a head positional when this share is at least 0.9.
    """
    return _share_where_argmax_at(batch, -1)


@register("positional_next", unit="share of queries", structural={"causal": _NO_FUTURE})
def positional_next(batch: AttentionBatch):
    """Share of real queries q (with q+1 real) whose largest attention weight is on q+1."""
    return _share_where_argmax_at(batch, +1)


def _attention_on(batch: AttentionBatch, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean total attention on `targets` (batch, q, k) over real queries that have at least one target."""
    weights = (batch.masked * targets[:, None].to(batch.pattern.dtype)).sum(-1)  # (batch, head, q)
    return _mean_over_queries(weights, batch.query_mask & targets.any(-1))


@register("duplicate_token")
def duplicate_token(batch: AttentionBatch):
    """Mean total attention on the other occurrences of the query's own token.

    Counts the real queries whose token occurs elsewhere in the segment: earlier (causal models), or earlier
    or later (bidirectional models, where all other occurrences are visible).
    """
    return _attention_on(batch, batch.other_occurrences)


@register("induction")
def induction(batch: AttentionBatch):
    """Mean total attention on the tokens right after other occurrences of the query's token, q-1 and q excluded.

    For a query q with token t, the targets are the keys k = j+1 such that token j is t, j != q, both j and
    k count, and k is neither q-1 nor q. Causal models: only j < q (Olsson et al. 2022's "attend to the
    token after the earlier occurrence"); on the `repeat-random` corpus these are the queries of the second
    copy. Bidirectional models: any j != q, so a first-copy query's target lies in the second copy; the
    score then means "attends to what followed this token elsewhere", which a bidirectional model can also
    do by looking ahead. Counts the real queries with at least one target.

    q-1 and q are excluded because a positional head looks there whatever the tokens: on natural text token
    q-2 often equals token q (", x ," or "the x the"), which would make q-1 a target, and "x x" would make q
    one, so a previous-token or self head would score as an induction head. A head that attends only to q-1
    or q now scores 0; on `repeat-random` (n >= 3) no target is excluded, so its scores are unchanged.
    """
    same = batch.other_occurrences  # (batch, q, j)
    # target key k = j + 1: shift along keys; the key at k must count too.
    targets = torch.zeros_like(same)
    targets[..., 1:] = same[..., :-1]  # a fresh tensor, so writing into it is safe
    gap = batch.key_positions[None, :] - batch.query_positions[:, None]  # (q, k): k - q
    not_positional = (gap != -1) & (gap != 0)  # (q, k): k is neither q-1 nor q
    targets = targets & not_positional & batch.key_mask[:, None, :]
    return _attention_on(batch, targets)


@register("offsets", table="offsets", axis=Axis(("offset",), lambda config: [(d,) for d in offset_range(config.max_offset)]))
def offset_profile(batch: AttentionBatch):
    """For each offset d in -K..K, the mean of A[q, q+d] over real queries q whose position q+d is a real token.

    d = -1 is prev_token, 0 is self and +1 is next_token. A row's profile sums to at most 1.
    """
    weights, valid = batch.at_offsets  # (batch, head, q, offset), (batch, q, offset)
    valid = valid[:, None]  # (batch, 1, q, n_off)
    zero = torch.zeros((), dtype=weights.dtype)
    sums = torch.where(valid, weights, zero).sum(-2)  # (batch, head, n_off)
    counts = valid.sum(-2).to(weights.dtype).expand_as(sums)
    return sums, counts


def _bucket_axis(config) -> list[tuple]:
    return [(b,) for b in buckets(config.max_len)]


@register("first_token_by_position", table="positions", axis=Axis(("bucket",), _bucket_axis))
def first_token_by_position(batch: AttentionBatch):
    """first_token by query position: for each bucket b, the mean attention on the first token over real queries
    q >= 1 whose position lies in [b, 2b) (bucket 0, position 0 alone, is always empty).

    How an attention sink's share changes along a long context; the buckets' sums add up to first_token's.
    """
    return _by_bucket(*_first_token_per_query(batch), batch)


@register("distance_by_position", table="positions", unit="tokens", bounded=False,
          axis=Axis(("bucket",), _bucket_axis))
def distance_by_position(batch: AttentionBatch):
    """distance by query position: for each bucket b, the mean over real queries q in [b, 2b) of
    sum_k A[q, k] |q - k| (bucket 0: position 0 alone).

    Whether a head looks a fixed distance back wherever the query is, or further the later the query.
    """
    return _by_bucket(batch.distance, batch.query_mask, batch)


# --- what heads move: value norms and direct logit attribution (headscan.values) ---------------------------


@register("moved", table="value", unit="times the mean value norm", bounded=False, needs=("value_norms",))
def moved(batch: AttentionBatch):
    """How much a head moves: the mean over real queries q of sum_k A[q, k] ||f(x_k)|| divided by the mean of
    ||f(x_k)|| over the segment's keys that count, where f(x_k) = (x_k W_V + b_V) W_O^h is the vector the head
    moves from key k (value bias in, output bias out; under grouped-query attention the key/value head the
    query head reads). Sums run over keys that count; queries that see a single key (the first token of a
    causal model) do not count. A head whose every f(x_k) is 0 scores 0.

    About 1 for a head that reads typical tokens; near 0 for a sink head whose target carries a near-zero
    value vector, however much attention it gets. Attention weights, not value-weighted ones, go into the sum.
    """
    _require(batch, moved)
    norms = batch.value_norms.to(torch.promote_types(batch.pattern.dtype, batch.value_norms.dtype))  # (batch, head, k)
    keys = batch.key_mask.to(norms.dtype)  # (batch, k)
    mean = (norms * keys[:, None, :]).sum(-1) / keys.sum(-1).clamp_min(1)[:, None]  # (batch, head)
    mass = (batch.masked * norms[:, :, None, :]).sum(-1)  # (batch, head, q): sum_k A[q, k] ||f(x_k)||
    zero = torch.zeros((), dtype=norms.dtype, device=norms.device)
    ratio = torch.where(mean[..., None] > 0, mass / mean.clamp_min(torch.finfo(norms.dtype).tiny)[..., None], zero)
    return _mean_over_queries(ratio, batch.query_mask & (batch.n_visible() >= 2))


_NO_LOGIT = "an encoder has no next-token logit; NaN for every head"


def _require(batch: AttentionBatch, function) -> None:
    """Refuse a batch without the captured tensors the metric registered as `function` needs."""
    metric = next(m for m in METRICS.values() if m.function is function)
    missing = [name for name in metric.needs if getattr(batch, name) is None]
    if missing:
        raise MetricError(f"metric {metric.name!r} needs {missing[0]}, which this AttentionBatch does not carry "
                          f"(the sweep captures it with values=True on the transformer_lens path)")


def _dla(batch: AttentionBatch, function):
    from .values import dla_sums, next_token_targets

    _require(batch, function)
    queries = torch.zeros_like(batch.key_mask)  # (batch, k): this batch's query rows at their absolute positions
    queries[:, batch.query_start: batch.query_start + batch.pattern.shape[-2]] = batch.query_mask  # a fresh tensor
    _, valid = next_token_targets(batch.tokens, queries, batch.key_mask)  # (batch, k)
    rows = slice(batch.query_start, batch.query_start + batch.pattern.shape[-2])
    return dla_sums(batch.logit_contributions, batch.final_scale[:, rows], valid[:, rows])


@register("dla", unit="logit", bounded=False, structural={"bidirectional": _NO_LOGIT},
          needs=("logit_contributions", "final_scale"))
def dla(batch: AttentionBatch):
    """Direct logit attribution: the mean over real queries q whose next token t is real of the head's output
    z_q W_O^h (its slice of the attention output through W_O, output bias left out) dotted with t's unembedding
    direction, divided by the final norm's scale at q (frozen from the forward pass), the direction having the
    final norm's gain folded in and being centred over the vocabulary (a logit relative to the mean logit).

    Positive: the head raises the logit of the token that actually comes next. Causal models only.
    """
    return _dla(batch, dla)[0]


@register("dla_positive", unit="share of queries", structural={"bidirectional": _NO_LOGIT},
          needs=("logit_contributions", "final_scale"))
def dla_positive(batch: AttentionBatch):
    """Share of the queries that count for dla where the head's direct logit attribution is positive."""
    return _dla(batch, dla_positive)[1]


def definitions_markdown() -> str:
    """The metric definitions as a Markdown list, straight from the registry (README and report use it)."""
    lines = []
    for metric in METRICS.values():
        where = f"{metric.table}.parquet, {metric.unit}"
        if metric.striking == "low":
            where += ", low is striking"
        body = " ".join(metric.definition.split())
        lines.append(f"- **`{metric.name}`** ({where}): {body}")
    return "\n".join(lines) + "\n"
