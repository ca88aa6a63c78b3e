"""The metrics' view of one layer's attention: `AttentionBatch`, and the reduction every metric ends with.

Every metric takes an `AttentionBatch` (one layer's pattern for a batch of segments, with its masks and token
ids) and returns per-segment ``(sums, counts)`` of shape ``(batch, head)`` (``(batch, head, n)`` for a metric
with an axis); `mean_over_queries` makes them from a per-query score.

This module registers no metric (see `headscan.metrics.registry`).
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass
from functools import cached_property

import torch

from ..errors import MetricError
from .chance import NullHead

__all__ = ["AttentionBatch", "offset_range", "mean_over_queries"]


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
    words: object = None  # a `headscan.corpus.words.WordAlignment` for CoNLL-U corpora, else None
    raw_pattern: torch.Tensor | None = None  # the pattern before specials="exclude" renormalised it (None: same)
    query_start: int = 0  # position of the pattern's first query row (0 in eager mode)
    max_len: int | None = None  # the sweep's max_len: sets the position buckets (None: the key length)
    # What the sweep captured besides the pattern (None where it did not; a metric's `needs` names what it reads):
    value_norms: torch.Tensor | None = None  # (batch, head, k) ||f(x_k)|| = ||v_k W_O^h||, b_V in, b_O out
    logit_contributions: torch.Tensor | None = None  # (batch, head, q) z_q^h W_O^h . d[:, t_{q+1}], before the scale
    final_scale: torch.Tensor | None = None  # (batch, q) the final norm's divisor, frozen from the forward pass
    null_logit_contributions: torch.Tensor | None = None  # (batch, head, q) the same for the null head's output
    output_norms: torch.Tensor | None = None  # (batch, head, q) ||z_q^h W_O^h||, what the head writes (b_O out)
    # (batch, head, q) sum_k A[q, k] z_q^h W_O^h . d[:, t_k] over keys that count, before the final scale
    attended_contributions: torch.Tensor | None = None
    # The null head's weight on each key (`headscan.metrics.chance`): None is uniform attention; value-weighted
    # attention sets the value norms, (batch, head, k).
    key_weights: torch.Tensor | None = None
    # What a decoding step of `headscan retrieval` adds (None in a sweep):
    needle: torch.Tensor | None = None  # (batch, k) bool: the keys holding the answer's tokens inside the needle
    generated: torch.Tensor | None = None  # (batch,) the token the last query row's forward pass generated
    # Streaming (DuoAttention's sink and recent window): the keys a streaming head keeps.
    sink: int = 64  # the first `sink` positions
    recent: int = 256  # the last `recent` positions up to the query, the query's own included
    # A sliding-window layer's reach: the largest |q - k| a query sees (`headscan.models.windows`); None: the
    # causal mask alone (or nothing, bidirectional) limits what it sees.
    window: int | None = None
    # The model's tokenizer's strings (`headscan.metrics.custom.Vocabulary`), for patterns that read token text.
    vocabulary: object = None

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

    def sees(self, gap: torch.Tensor) -> torch.Tensor:
        """Whether a query sees a key at ``gap = q - k`` (any shape) under the model's mask (causal, sliding
        window), padding and specials aside; positions out of range are the caller's to drop."""
        seen = gap >= 0 if self.causal else torch.ones_like(gap, dtype=torch.bool)
        return seen if self.window is None else seen & (gap.abs() <= self.window)

    @cached_property
    def null(self) -> NullHead:
        """The null head of these queries: what uniform attention over what each query sees would score."""
        # A weak reference back: a NullHead cached on its batch that held the batch would make a cycle, and each
        # layer's batch (its pattern and cached temporaries) would then live until the garbage collector ran, so
        # an eager sweep held many layers' patterns at once (smollm2 at 4k tokens: 15.9 GB, now 6.0).
        return NullHead(weakref.proxy(self))

    def null_batch(self) -> AttentionBatch:
        """The same queries with the null head's attention as the pattern, (batch, H, q, k), H = 1 for uniform
        weights: what a metric that registers no chance of its own is computed on."""
        pattern = self.null.pattern().to(self.pattern.dtype)
        return dataclasses.replace(self, pattern=pattern, raw_pattern=None, key_weights=None)

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
        terms = self.masked.clamp_min(tiny)  # a new tensor, so the log and the product can run in place on it
        return -terms.log_().mul_(self.masked).sum(-1)

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

        Earlier positions only for causal models; within the layer's sliding window where it has one; both
        count.
        """
        same = self._occurrences
        if self.window is None:
            return same
        return same & self.sees(self.query_positions[:, None] - self.key_positions[None, :])

    @cached_property
    def _occurrences(self) -> torch.Tensor:
        """(batch, q, j) bool: j holds the query's token at another position (earlier in a causal model), both
        counting, whether or not a sliding window shows j."""
        queries, keys = self.query_positions, self.key_positions
        same = self.tokens[:, queries, None] == self.tokens[:, None, :]  # (batch, q, k)
        other = keys[None, :] < queries[:, None] if self.causal else keys[None, :] != queries[:, None]  # (q, k)
        return same & other & self.query_mask[:, :, None] & self.key_mask[:, None, :]

    @cached_property
    def induction_targets(self) -> torch.Tensor:
        """(batch, q, k) bool: the keys k = j + 1 after another occurrence j of the query's token (see `induction`),
        k counting, seen by the query, and neither q - 1 nor q. Under a sliding window k must be in it, j need
        not be: a head finds k through what k's own residual stream holds of j."""
        same = self._occurrences  # (batch, q, j)
        targets = torch.zeros_like(same)
        targets[..., 1:] = same[..., :-1]  # a fresh tensor, so writing into it is safe: k = j + 1
        gap = self.key_positions[None, :] - self.query_positions[:, None]  # (q, k): k - q
        not_positional = (gap != -1) & (gap != 0)  # (q, k): k is neither q-1 nor q
        if self.window is not None:
            not_positional = not_positional & self.sees(-gap)
        return targets & not_positional & self.key_mask[:, None, :]

    def n_visible(self) -> torch.Tensor:
        """(batch, q) how many keys that count query q could see under the model's mask."""
        if self.window is not None:
            seen = self.sees(self.query_positions[:, None] - self.key_positions[None, :])  # (q, k)
            return (seen[None] & self.key_mask[:, None, :]).sum(-1)
        if self.causal:
            return self.key_mask.cumsum(-1)[:, self.query_positions]  # keys at or before q
        return self.key_mask.sum(-1, keepdim=True).expand(-1, self.pattern.shape[-2])


def offset_range(max_offset: int) -> range:
    """The offsets d of the offset profile, -K..K: the one place this range is built.

    >>> list(offset_range(2))
    [-2, -1, 0, 1, 2]
    """
    return range(-max_offset, max_offset + 1)


def mean_over_queries(score: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-segment sums and counts of `score` (batch, head, q) over queries where `valid` (batch, q)."""
    valid = valid[:, None, :]  # (batch, 1, q)
    # where() rather than multiply: whatever sits in invalid positions (even NaN) must not leak.
    sums = torch.where(valid, score, torch.zeros((), dtype=score.dtype, device=score.device)).sum(-1)
    counts = valid.sum(-1).to(score.dtype).expand_as(sums)
    return sums, counts  # (batch, head) each
