"""Head metrics: pure, vectorised functions of one layer's attention pattern, registered once by name.

Every metric takes an `headscan.metrics.batch.AttentionBatch` (one layer's pattern for a batch of segments, with its masks and token
ids) and returns per-segment ``(sums, counts)`` of shape ``(batch, head)`` (``(batch, head, n)`` for a metric
with an `Axis`, such as the offset profile). The pattern may hold only a block of queries (chunked attention,
`headscan.models.chunked`): positions are absolute, so the sums and counts of the blocks of a layer add up to those
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

import math

import torch

from .batch import AttentionBatch, mean_over_queries, offset_range
from .registry import Axis, register

__all__ = ["buckets", "prev_token", "next_token", "self_attention", "first_token", "sep", "entropy", "entropy_norm",
           "distance", "positional_prev", "positional_next", "duplicate_token", "induction", "offset_profile",
           "first_token_by_position", "distance_by_position"]

# --- shared reductions -------------------------------------------------------------------------------------


def _mean_at_offset(batch: AttentionBatch, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    weights, valid = batch.at_offsets
    column = offset + batch.max_offset
    return mean_over_queries(weights[..., column], valid[..., column])


def _share_where_argmax_at(batch: AttentionBatch, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    target = batch.query_positions + offset  # (q,)
    hit = (batch.top_key == target).to(batch.pattern.dtype)  # (batch, head, q)
    _, valid = batch.at_offsets
    return mean_over_queries(hit, valid[..., offset + batch.max_offset])


def _null_at_offset(batch: AttentionBatch, offset: int) -> torch.Tensor:
    """Sums of the null head's weight on q + offset over the queries `_mean_at_offset` counts."""
    _, valid = batch.at_offsets
    column = offset + batch.max_offset
    return mean_over_queries(batch.null.at_offsets[..., column], valid[..., column])[0]


def first_token_per_query(batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor]:
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


def _prev_chance(batch: AttentionBatch):
    """1/n, n the keys that count and that the query sees: uniform attention's weight on q-1."""
    return _null_at_offset(batch, -1)


def _next_chance(batch: AttentionBatch):
    """1/n, as for prev_token (0 for a causal model, whose queries cannot see q+1)."""
    return _null_at_offset(batch, +1)


def _self_chance(batch: AttentionBatch):
    """1/n, n the keys that count and that the query sees."""
    return _null_at_offset(batch, 0)


# Why argmax and entropy scores are tested against random-init controls, not uniform attention (the registry's null).
_ARGMAX_NULL = ("a share of queries whose largest weight falls somewhere: a random head's argmax lands where its "
                "random preferences put it (untrained heads range from about 0.01 to 0.35 around a uniform chance "
                "of 0.14 on smollm2), so only the range of random-init controls' heads is a null")
_ENTROPY_NULL = ("uniform attention has the largest entropy there is, so every head that is not exactly uniform, "
                 "trained or not, lies beyond it: only the range of random-init controls' heads is a null")


@register("prev_token", chance=_prev_chance, shuffled="position")
def prev_token(batch: AttentionBatch):
    """Mean of A[q, q-1] over real queries q whose previous position q-1 is a real token."""
    return _mean_at_offset(batch, -1)


@register("next_token", structural={"causal": _NO_FUTURE}, chance=_next_chance, shuffled="position")
def next_token(batch: AttentionBatch):
    """Mean of A[q, q+1] over real queries q whose next position q+1 is a real token.

    Structurally 0 for causal models, whose queries cannot see the future; reported, not dropped.
    """
    return _mean_at_offset(batch, +1)


@register("self", chance=_self_chance, shuffled="position")
def self_attention(batch: AttentionBatch):
    """Mean of A[q, q] (attention to the query's own token) over real queries q."""
    return _mean_at_offset(batch, 0)


def _first_chance(batch: AttentionBatch):
    """1/n at each query, n the keys it sees: 1/(q+1) at position q of a causal model whose every token counts
    (and no sliding window hides the first token: then 0)."""
    _, valid = first_token_per_query(batch)
    return mean_over_queries(batch.null.first, valid)[0]


@register("first_token", chance=_first_chance, shuffled="position")
def first_token(batch: AttentionBatch):
    """Mean attention on the segment's first token (BOS or [CLS] when the model uses one) over real queries q >= 1.

    Undefined (NaN) when the first token does not count, e.g. when special tokens are left out.
    """
    return mean_over_queries(*first_token_per_query(batch))


def _sep_on(batch: AttentionBatch) -> torch.Tensor:
    return batch.sep_mask & batch.key_mask  # (batch, k)


def _sep_chance(batch: AttentionBatch):
    """The number of [SEP] tokens the query sees over n, the keys it sees."""
    on_sep = _sep_on(batch)
    return mean_over_queries(batch.null.expect(on_sep[:, None, :]), batch.query_mask & on_sep.any(-1, keepdim=True))[0]


@register("sep", structural={"no_sep": "the model has no [SEP] token, so it is undefined for every head"},
          chance=_sep_chance)
def sep(batch: AttentionBatch):
    """Mean over real queries of the total attention on [SEP] tokens.

    Defined only for segments holding a [SEP] that counts (NaN for models without one, such as GPT-2).
    """
    on_sep = _sep_on(batch)  # (batch, k)
    # a segment holds a [SEP] or two: gather those keys' columns rather than multiply every key by a mask
    n_sep = int(on_sep.sum(-1).max()) if on_sep.numel() else 0  # no segments (or no keys): nothing to gather
    keys = on_sep.to(torch.uint8).argsort(dim=-1, descending=True, stable=True)[:, :n_sep]  # (batch, sep): [SEP]s first
    is_sep = on_sep.gather(-1, keys).to(batch.pattern.dtype)  # (batch, sep): 0 where a segment has fewer
    pattern = batch.masked
    columns = pattern.gather(-1, keys[:, None, None, :].expand(*pattern.shape[:-1], n_sep))  # (batch, head, q, sep)
    weights = (columns * is_sep[:, None, None, :]).sum(-1)  # (batch, head, q)
    valid = batch.query_mask & on_sep.any(-1, keepdim=True)
    return mean_over_queries(weights, valid)


def _entropy_chance(batch: AttentionBatch):
    """log n, n the keys that count and that the query sees: uniform attention's entropy, the largest possible."""
    return mean_over_queries(batch.null.entropy, batch.query_mask)[0]


def _entropy_norm_chance(batch: AttentionBatch):
    """1: uniform attention's entropy is log n (value-weighted: its entropy over log n)."""
    n_visible = batch.n_visible().to(torch.float64)  # (batch, q)
    normalised = batch.null.entropy / torch.log(n_visible.clamp_min(2))[:, None, :]
    return mean_over_queries(normalised, batch.query_mask & (n_visible >= 2))[0]


def _most_entropy(keys: int) -> float:
    """ln keys: uniform attention's entropy over every key, the most any attention over `keys` keys has."""
    return math.log(keys)


def _farthest(keys: int) -> float:
    """keys - 1: no key of a segment of `keys` tokens lies further than that from a query."""
    return keys - 1.0


@register("entropy", unit="nats", bounded=False, striking="low", chance=_entropy_chance, null="controls",
          null_why=_ENTROPY_NULL, ceiling=_most_entropy)
def entropy(batch: AttentionBatch):
    """Mean over real queries of the entropy -sum_k A[q, k] log A[q, k] of the query's attention, in nats.

    Only keys that count enter the sum (0 log 0 = 0).
    """
    return mean_over_queries(batch.entropy, batch.query_mask)


@register("entropy_norm", unit="fraction of the largest possible entropy", striking="low", chance=_entropy_norm_chance,
          null="controls", null_why=_ENTROPY_NULL)
def entropy_norm(batch: AttentionBatch):
    """Mean over real queries of the entropy divided by log(n), n the number of keys the query could see.

    0 is attention on one key, 1 is uniform attention over all it could see. Queries that see a single key
    (the first token of a causal model) have no defined value and do not count.
    """
    n_visible = batch.n_visible().to(batch.pattern.dtype)  # (batch, q)
    normalised = batch.entropy / torch.log(n_visible.clamp_min(2))[:, None, :]
    return mean_over_queries(normalised, batch.query_mask & (n_visible >= 2))


def _distance_chance(batch: AttentionBatch):
    """The mean of |q - k| over the keys k that count and that the query sees: q/2 at position q of a causal
    model whose every token counts and that has no sliding window (d/2 once q is past a window reaching d back)."""
    return mean_over_queries(batch.null.distance(), batch.query_mask)[0]


@register("distance", unit="tokens", bounded=False, chance=_distance_chance, null="controls", ceiling=_farthest,
          null_why="far keys are where sink heads (first_token) look, whatever they learned, and a random head's "
                   "mean distance spreads around uniform attention's: only untrained heads say what no learning gives")
def distance(batch: AttentionBatch):
    """Mean over real queries of sum_k A[q, k] |q - k|: how far, in tokens, a head looks on average."""
    return mean_over_queries(batch.distance, batch.query_mask)


def _positional_prev_chance(batch: AttentionBatch):
    """The probability that a key drawn from uniform attention is q-1: 1/n, n the keys the query sees."""
    return _null_at_offset(batch, -1)


def _positional_next_chance(batch: AttentionBatch):
    """The probability that a key drawn from uniform attention is q+1: 1/n (0 for a causal model)."""
    return _null_at_offset(batch, +1)


@register("positional_prev", unit="share of queries", chance=_positional_prev_chance, null="controls", null_why=_ARGMAX_NULL,
          shuffled="position")
def positional_prev(batch: AttentionBatch):
    """Share of real queries q (with q-1 real) whose largest attention weight is on q-1.

    A query with no weight on any key that counts has no largest weight and scores 0 (a miss).

    Voita et al. (2019) call a head positional when this share is at least 0.9.
    """
    return _share_where_argmax_at(batch, -1)


@register("positional_next", unit="share of queries", structural={"causal": _NO_FUTURE}, chance=_positional_next_chance,
          null="controls", null_why=_ARGMAX_NULL, shuffled="position")
def positional_next(batch: AttentionBatch):
    """Share of real queries q (with q+1 real) whose largest attention weight is on q+1."""
    return _share_where_argmax_at(batch, +1)


def _attention_on(batch: AttentionBatch, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean total attention on `targets` (batch, q, k) over real queries that have at least one target."""
    weights = (batch.masked * targets[:, None].to(batch.pattern.dtype)).sum(-1)  # (batch, head, q)
    return mean_over_queries(weights, batch.query_mask & targets.any(-1))


def _duplicate_chance(batch: AttentionBatch):
    """The number of other occurrences of the query's token that it sees, over n, the keys it sees."""
    targets = batch.other_occurrences
    return mean_over_queries(batch.null.on(targets), batch.query_mask & targets.any(-1))[0]


def _induction_chance(batch: AttentionBatch):
    """The number of the query's targets over n, the keys that count and that it sees."""
    targets = batch.induction_targets
    return mean_over_queries(batch.null.on(targets), batch.query_mask & targets.any(-1))[0]


@register("duplicate_token", sparse=True, chance=_duplicate_chance)
def duplicate_token(batch: AttentionBatch):
    """Mean total attention on the other occurrences of the query's own token.

    Counts the real queries whose token occurs elsewhere in the segment where the query can see it: earlier
    (causal models), or earlier or later (bidirectional models), and within the layer's sliding window where
    it has one.
    """
    return _attention_on(batch, batch.other_occurrences)


@register("induction", sparse=True, chance=_induction_chance)
def induction(batch: AttentionBatch):
    """Mean total attention on the tokens right after other occurrences of the query's token, q-1 and q excluded.

    For a query q with token t, the targets are the keys k = j+1 such that token j is t, j != q, both j and
    k count, and k is neither q-1 nor q. Causal models: only j < q (Olsson et al. 2022's "attend to the
    token after the earlier occurrence"); on the `repeat-random` corpus these are the queries of the second
    copy. Bidirectional models: any j != q, so a first-copy query's target lies in the second copy; the
    score then means "attends to what followed this token elsewhere", which a bidirectional model can also
    do by looking ahead. Under a sliding window a target k must lie in the window (j need not: a head finds k
    through what k's residual stream holds of j). Counts the real queries with at least one target.

    q-1 and q are excluded because a positional head looks there whatever the tokens: on natural text token
    q-2 often equals token q (", x ," or "the x the"), which would make q-1 a target, and "x x" would make q
    one, so a previous-token or self head would score as an induction head. A head that attends only to q-1
    or q scores 0; on `repeat-random` (n >= 3) no target is ever q-1 or q, so the exclusion changes nothing there.
    """
    return _attention_on(batch, batch.induction_targets)


def _by_offset(weights: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums and counts of `weights` (batch, head, q, offset) over queries where `valid` (batch, q, offset)."""
    valid = valid[:, None]  # (batch, 1, q, n_off)
    zero = torch.zeros((), dtype=weights.dtype)
    sums = torch.where(valid, weights, zero).sum(-2)  # (batch, head, n_off)
    counts = valid.sum(-2).to(weights.dtype).expand_as(sums)
    return sums, counts


def _offsets_chance(batch: AttentionBatch):
    """1/n where the query sees q+d, n the keys that count and that it sees; 0 where it cannot see q+d."""
    return _by_offset(batch.null.at_offsets, batch.at_offsets[1])[0]


@register("offsets", table="offsets", axis=Axis(("offset",), lambda config: [(d,) for d in offset_range(config.max_offset)]),
          chance=_offsets_chance)
def offset_profile(batch: AttentionBatch):
    """For each offset d in -K..K, the mean of A[q, q+d] over real queries q whose position q+d is a real token.

    d = -1 is prev_token, 0 is self and +1 is next_token. One query's values sum to at most 1 (shares of one
    attention row), but a head's profile over the corpus may sum to a little more: each offset averages over its
    own queries, and a query near a segment's end, which has fewer offsets to spread over, counts only in those.
    """
    return _by_offset(*batch.at_offsets)  # (batch, head, q, offset), (batch, q, offset)


def _bucket_axis(config) -> list[tuple]:
    return [(b,) for b in buckets(config.max_len)]


def _first_by_position_chance(batch: AttentionBatch):
    """1/n at each query, n the keys it sees, averaged over the bucket's queries: 1/(q+1) at position q of a
    causal model whose every token counts and that has no sliding window."""
    _, valid = first_token_per_query(batch)
    return _by_bucket(batch.null.first, valid, batch)[0]


@register("first_token_by_position", table="positions", axis=Axis(("bucket",), _bucket_axis),
          chance=_first_by_position_chance)
def first_token_by_position(batch: AttentionBatch):
    """first_token by query position: for each bucket b, the mean attention on the first token over real queries
    q >= 1 whose position lies in [b, 2b) (bucket 0, position 0 alone, is always empty).

    How an attention sink's share changes along a long context; the buckets' sums add up to first_token's.
    """
    return _by_bucket(*first_token_per_query(batch), batch)


def _distance_by_position_chance(batch: AttentionBatch):
    """The same sum, first token left out, under uniform attention over the keys that count and that the query
    sees, averaged over the bucket's queries: q(q - 1) / (2(q + 1)), about q/2, at position q of a causal model
    whose every token counts and that has no sliding window."""
    return _by_bucket(batch.null.distance(skip_first=True), batch.query_mask, batch)[0]


@register("distance_by_position", table="positions", unit="tokens", bounded=False, ceiling=_farthest,
          axis=Axis(("bucket",), _bucket_axis), chance=_distance_by_position_chance, null="controls")
def distance_by_position(batch: AttentionBatch):
    """distance by query position, the first token left out: for each bucket b, the mean over real queries q in
    [b, 2b) of sum_{k >= 1} A[q, k] |q - k| (bucket 0: position 0 alone).

    Whether a head looks a fixed distance back wherever the query is, or further the later the query. The
    first token is left out of the sum (not renormalised away) because a sink head's attention on it would
    read as looking far back: a sink scores near 0 here, and `first_token_by_position` shows it instead;
    `distance` keeps the first token.
    """
    first = batch.masked[..., 0] * batch.query_positions.to(batch.pattern.dtype)  # (batch, head, q): A[q, 0] |q - 0|
    return _by_bucket(batch.distance - first, batch.query_mask, batch)
