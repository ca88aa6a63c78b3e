"""Attention sinks counted as Gu et al. count them: the share of queries that give the first token over 0.3.

``first_token`` is the mean weight on the first token; Gu et al. (ICLR 2025, "When attention sink emerges in
language models") count a head as sinking at a query when that weight passes a threshold of 0.3, and call the
share of such queries its sink ratio. A threshold separates a head that parks most of its attention there on
some queries from one that spreads a little there on all of them, which a mean cannot. With `output_norm`, it
is the second of the inactivity scores: a head whose attention sinks and that writes little is dormant (Guo et
al. 2024). This module registers ``sink_ratio``; it does not run models.
"""

from __future__ import annotations

from .attention import first_token_per_query  # the queries first_token counts, so the two scores share them
from .batch import AttentionBatch, mean_over_queries
from .registry import register

__all__ = ["SINK_THRESHOLD", "sink_ratio"]

SINK_THRESHOLD = 0.3  # Gu et al.'s threshold on the first token's weight


def _sink_chance(batch: AttentionBatch):
    """The share of those queries where uniform attention's weight on the first token, 1/n for the n keys the
    query sees, exceeds 0.3: the queries that see at most 3 keys (position 1 and 2 of a causal model)."""
    _, valid = first_token_per_query(batch)
    return mean_over_queries((batch.null.first > SINK_THRESHOLD).to(batch.pattern.dtype), valid)[0]


@register("sink_ratio", unit="share of queries", chance=_sink_chance,
          null_why="a share of queries thresholded on the first token's weight: untrained heads attend nearly "
                   "uniformly, so uniform attention's share (the row's chance) is what no learning gives; with "
                   "random-init controls, their heads' range at the same layer, and chance as well")
def sink_ratio(batch: AttentionBatch):
    """Sink ratio (Gu et al., ICLR 2025, "When attention sink emerges in language models"): the share of real
    queries q >= 1 whose attention on the segment's first token exceeds 0.3 (BOS or [CLS] when the model uses
    one). Undefined (NaN) when the first token does not count, e.g. when special tokens are left out.

    With output_norm, an inactivity score: a head that sinks on most queries and writes little is a dormant head
    (Guo et al. 2024, "Active-dormant attention heads").
    """
    weights, valid = first_token_per_query(batch)  # (batch, head, q), (batch, q)
    return mean_over_queries((weights > SINK_THRESHOLD).to(weights.dtype), valid)
