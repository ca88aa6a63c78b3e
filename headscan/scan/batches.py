"""The metrics' view of one batch: the masks every layer of it shares, and the `AttentionBatch` of one layer's
pattern (plain or value-weighted) or of its heads' outputs.

`headscan.scan.layers.LayerHooks` builds them as the forward pass hands each layer over. Nothing here hooks a
model or keeps running totals.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..config import SweepConfig
from ..metrics import AttentionBatch, values
from ..metrics.custom import vocabulary_of
from ..models import HookedModel

__all__ = ["BatchMasks", "batch_masks", "special_mask", "attention_batch", "value_batch", "output_batch"]


@dataclass(frozen=True)
class BatchMasks:
    """What every layer of one batch shares, (batch, seq) each, on the model's device."""

    ids: torch.Tensor  # token ids
    counts: torch.Tensor  # bool: the tokens that count (real, and not special when specials="exclude")
    sep: torch.Tensor  # bool: [SEP] tokens
    words: object  # the batch's `headscan.corpus.words.WordAlignment` (CoNLL-U), else None
    next_tokens: torch.Tensor  # the token each query predicts (for direct logit attribution)

    def repeated(self, times: int) -> BatchMasks:
        """The same masks for `times` layers stacked along the batch axis: (times * batch, seq) each."""
        if times == 1:
            return self
        words = None if self.words is None else self.words.map(lambda tensor: tensor.repeat(times, 1))
        return BatchMasks(self.ids.repeat(times, 1), self.counts.repeat(times, 1), self.sep.repeat(times, 1), words,
                          self.next_tokens.repeat(times, 1))


def special_mask(tokens: torch.Tensor, model: HookedModel) -> torch.Tensor:
    ids = [i for i in model.special_token_ids.values() if i is not None]
    ids += list(getattr(model.tokenizer, "all_special_ids", []) or [])
    return torch.isin(tokens, torch.tensor(sorted(set(ids)), dtype=tokens.dtype, device=tokens.device))


def batch_masks(input_ids: torch.Tensor, real: torch.Tensor, model: HookedModel, config: SweepConfig,
                words=None) -> BatchMasks:
    """What every layer of one batch shares: the tokens that count and the [SEP] tokens, (batch, seq) each,
    and the batch's words (CoNLL-U) on the model's device."""
    counts = real & ~special_mask(input_ids, model) if config.specials == "exclude" else real
    sep = model.special_token_ids["sep"]
    sep_mask = input_ids == sep if sep is not None else torch.zeros_like(real)
    words = words.to(input_ids.device) if words is not None else None
    next_tokens, _ = values.next_token_targets(input_ids, counts, real)  # (batch, seq): the token each query predicts
    return BatchMasks(input_ids, counts, sep_mask, words, next_tokens)


def attention_batch(pattern: torch.Tensor, masks: BatchMasks, model: HookedModel, config: SweepConfig,
                     query_start: int = 0, norms: torch.Tensor | None = None,
                     window: int | None = None) -> AttentionBatch:
    """The metrics' view of one layer's pattern, or of the rows ``query_start ..`` of it in chunked mode."""
    pattern = raw = pattern.float()  # (batch, head, q, k); a new tensor for half precision, the same one otherwise
    counts = masks.counts  # (batch, k): the keys that count; the block's rows of it are its queries
    if config.specials == "exclude":
        # Renormalise each query's attention over the keys that count: a new tensor, never written in place.
        kept = pattern * counts[:, None, None, :].to(pattern.dtype)
        pattern = kept / kept.sum(-1, keepdim=True).clamp_min(torch.finfo(pattern.dtype).tiny)
    queries = counts[:, query_start: query_start + pattern.shape[-2]]  # (batch, q)
    return AttentionBatch(pattern, queries, counts, masks.ids, masks.sep, model.causal, config.max_offset,
                          words=masks.words, raw_pattern=raw if raw is not pattern else None,
                          query_start=query_start, max_len=config.max_len, value_norms=norms,
                          sink=config.sink, recent=config.recent, window=window,
                          vocabulary=vocabulary_of(model))


def value_batch(batch: AttentionBatch) -> AttentionBatch:
    """The same rows with value-weighted attention as the pattern: A[q, k] ||f(x_k)|| renormalised per query over
    the keys that count (`headscan.metrics.values.value_weighted`), for the value table's columns."""
    weighted = values.value_weighted(batch.pattern, batch.value_norms, batch.key_mask)  # (batch, head, q, k), new
    # its null head is value-weighted too: A'[q, k] proportional to ||f(x_k)|| over the keys q sees
    return dataclasses.replace(batch, pattern=weighted, raw_pattern=None, key_weights=batch.value_norms)


def output_batch(norms: torch.Tensor, contributions: torch.Tensor | None, attended: torch.Tensor | None,
                  scale: torch.Tensor | None, masks: BatchMasks, model: HookedModel, config: SweepConfig) -> AttentionBatch:
    """One layer's per-query head outputs, for the columns of "outputs" once the forward pass is over: the output
    norms (batch, head, q), and where dla was captured the logit contributions (2, batch, head, q), the head's and
    its null head's, the attended-token contributions (batch, head, q) and the final scale (batch, q). No pattern
    is kept: its place holds a zero-stride view of one 0, for the shapes."""
    b, h, n = norms.shape
    placeholder = norms.new_zeros(()).expand(b, h, n, n)  # (batch, head, q, k), no memory
    counts = masks.counts
    return AttentionBatch(placeholder, counts, counts, masks.ids, masks.sep, model.causal, config.max_offset,
                          logit_contributions=None if contributions is None else contributions[0], final_scale=scale,
                          null_logit_contributions=None if contributions is None else contributions[1],
                          output_norms=norms, attended_contributions=attended)
