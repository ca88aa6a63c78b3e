"""Streaming heads (DuoAttention, Xiao et al. 2024): how much of a head's attention a sink-and-window cache loses.

DuoAttention serves *streaming* heads from a key/value cache that keeps only the first S tokens (the attention
sink) and the last W (the recent window), and *retrieval* heads from the whole cache. Its streaming attention
lets query q see the keys ``k < S`` and ``q - W + 1 <= k <= q`` (``duo_attn/patch/streaming_attn.py``);
`streaming` is the attention mass a head puts elsewhere: what a streaming cache would take from it. A head
scoring near 0 loses nothing to a short cache; a head with much mass there needs the whole context.

S and W are the sweep's ``sink`` and ``recent`` settings, 64 and 256 by default: DuoAttention's deployment
values (its evaluation scripts and README; its training used a sink of 128). The mass is read straight off the
pattern block with absolute positions, so chunked attention's blocks add up to the whole pattern's score.

This module does not run models; the KV budget that follows from these scores is
`headscan.analysis.context`'s.
"""

from __future__ import annotations

import torch

from .batch import AttentionBatch, mean_over_queries
from .chance import span_sums
from .registry import register

__all__ = ["streaming", "outside_cache"]


def outside_cache(batch: AttentionBatch) -> torch.Tensor:
    """(q, k) bool: the keys a sink-and-window cache drops for each query row, ``sink <= k <= q - recent``."""
    queries, keys = batch.query_positions, batch.key_positions
    return (keys[None, :] >= batch.sink) & (keys[None, :] <= queries[:, None] - batch.recent)


def _counted(batch: AttentionBatch) -> bool:
    """Whether any query row of the block can count: causal, and at position S + W or later."""
    return batch.causal and batch.query_start + batch.pattern.shape[-2] > batch.sink + batch.recent


def _streaming_chance(batch: AttentionBatch):
    """The null head's share on the keys the cache drops, S <= k <= q - W, over the keys the query sees: (the keys
    that count among them) / n for uniform attention."""
    null = batch.null
    if not _counted(batch):  # no query counts: nothing to add, and no pattern-sized work
        return torch.zeros((batch.pattern.shape[0], null.weights.shape[1]), dtype=null.dtype,
                           device=batch.pattern.device)
    cumulative = null.weights.cumsum(-1)  # (batch, H, k): the null head's weight on keys 0..k
    last = batch.query_positions - batch.recent  # (q,) the last dropped key of each query
    # the first dropped key: the sink's end, or where a sliding window starts to show keys (q - window)
    first = torch.full_like(last, batch.sink) if batch.window is None else (
        batch.query_positions - batch.window).clamp_min(batch.sink)  # (q,)
    zero = torch.zeros((), dtype=null.dtype)
    amount = torch.where(last >= first, span_sums(cumulative, first, last.clamp_min(0)), zero)  # (batch, H, q)
    valid = batch.query_mask & (batch.query_positions >= batch.sink + batch.recent)[None, :]
    return mean_over_queries(null.share(amount), valid)[0]


@register("streaming", structural={"bidirectional": "a sink-and-window cache serves decoding, where a query sees only "
                                                     "the past, so it is left undefined for encoders"},
          chance=_streaming_chance)
def streaming(batch: AttentionBatch):
    """Mean over real queries q >= S + W of the attention on the keys k with S <= k <= q - W: the share of the
    head's attention that a key/value cache holding only the first S tokens and the last W (the query's own
    included) would drop (DuoAttention's streaming attention).

    S and W are the sweep's sink and recent settings (DuoAttention's deployment values 64 and 256 by default).
    Queries before position S + W lose nothing by construction and do not count. Causal models only.
    """
    if not _counted(batch):  # a bidirectional model (undefined), or a block of queries before S + W: none counts
        zeros = batch.pattern.new_zeros(batch.pattern.shape[:2])
        return zeros, zeros
    dropped = outside_cache(batch).to(batch.pattern.dtype)  # (q, k)
    mass = (batch.masked * dropped).sum(-1)  # (batch, head, q)
    valid = batch.query_mask & (batch.query_positions >= batch.sink + batch.recent)[None, :]
    return mean_over_queries(mass, valid)
