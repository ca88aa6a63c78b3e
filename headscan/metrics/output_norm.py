"""Inactive heads by what they write: each head's output norm relative to the other heads of its layer.

A head can attend sharply and still write almost nothing: the active-dormant heads of Guo et al. (2024, "Active-
dormant attention heads: mechanistically demystifying extreme-token phenomena in LLMs") park their attention on
the first token, whose value vector is near zero, and so fall silent on most inputs; Gu et al. (ICLR 2025, "When
attention sink emerges in language models") show that attention sinks act as such no-ops. A head's share of
attention on the first token (``first_token``, ``sink_ratio``) finds those that look there; the norm of what a
head writes finds the quiet ones whatever they look at, and it is the number an ablation would confirm.

For head h of a layer at query q, ``o_q^h = z_q^h W_O^h`` is the vector it adds to the residual stream (``z_q^h``
its output before the output projection, TransformerLens' ``hook_z``; ``W_O^h`` its d_head rows of W_O; the
output bias b_O belongs to no head and is left out), and its norm is computed in d_head dimensions through
`headscan.metrics.values.output_norm_factor`. This module registers ``output_norm``; it does not run models or
hook them (the sweep captures the norms, `headscan.scan.layers`).
"""

from __future__ import annotations

import torch

from .batch import AttentionBatch, mean_over_queries
from .registry import register

__all__ = ["head_output_norms", "relative_to_layer", "output_norm"]


def head_output_norms(z: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """(batch, head, q) ``||z_q^h W_O^h||``, the norm of what each head writes at each query.

    `z` (batch, q, head, d_head) each head's output before W_O (per query head, also under grouped-query
    attention); `factor` (head, d_head, d_head) `headscan.metrics.values.output_norm_factor` of the layer's W_O,
    so that ``||z F_h|| = ||z W_O^h||`` and d_model is never reached. float32 at least.

    >>> W_O = torch.tensor([[[3.0, 4.0]], [[0.0, 0.0]]])  # (head=2, d_head=1, d_model=2)
    >>> from headscan.metrics.values import output_norm_factor
    >>> head_output_norms(torch.tensor([[[[1.0], [1.0]], [[2.0], [5.0]]]]), output_norm_factor(W_O))
    tensor([[[ 5., 10.],
             [ 0.,  0.]]])
    """
    dtype = torch.promote_types(z.dtype if z.dtype == torch.float64 else torch.float32, factor.dtype)
    moved = torch.einsum("bqhe,hef->bhqf", z.to(dtype), factor.to(device=z.device, dtype=dtype))  # (batch, head, q, d_head)
    return torch.linalg.vector_norm(moved, dim=-1)


def relative_to_layer(norms: torch.Tensor) -> torch.Tensor:
    """(batch, head, q) each head's norm over the mean of its layer's heads' norms at the same query; 0 where
    every head of the layer writes nothing there (no head is then quieter than another).

    >>> relative_to_layer(torch.tensor([[[1.0], [3.0]]]))  # two heads at one query: mean 2
    tensor([[[0.5000],
             [1.5000]]])
    """
    mean = norms.mean(1, keepdim=True)  # (batch, 1, q)
    zero = torch.zeros((), dtype=norms.dtype, device=norms.device)
    return torch.where(mean > 0, norms / mean.clamp_min(torch.finfo(norms.dtype).tiny), zero)


def _output_norm_chance(batch: AttentionBatch):
    """1: at every query the heads' ratios average exactly 1, so a head that writes as much as its layer's mean
    head scores 1 (uniform attention is no reference for a norm: its output is the mean value vector's)."""
    return mean_over_queries(torch.ones_like(batch.output_norms[:, :1]), batch.query_mask)[0]  # (batch, 1)


@register("output_norm", unit="times its layer's mean head", bounded=False, striking="low",
          needs=("output_norms",), chance=_output_norm_chance, null="controls",
          null_why="a ratio to the layer's mean head, 1 on average by construction, whose spread among heads "
                   "that learned nothing is set by their random weights: only the range of random-init controls' "
                   "heads at the same layer says how quiet an untrained head can be")
def output_norm(batch: AttentionBatch):
    """How much a head writes, relative to its layer: the mean over real queries q of ||o_q^h|| divided by the
    mean over the layer's heads h' of ||o_q^h'|| at the same query, where o_q^h = z_q^h W_O^h is the vector head
    h adds to the residual stream at q (its output through its rows of W_O; the output bias, which belongs to no
    head, left out). A query where every head writes 0 scores 0.

    1 is the layer's average head; near 0 is an inactive (dormant) head, one that writes almost nothing however
    it attends (Guo et al. 2024, "Active-dormant attention heads"; Gu et al., ICLR 2025, "When attention sink
    emerges in language models"). Ablation is the check: see importance.parquet where the sweep ran it.
    """
    return mean_over_queries(relative_to_layer(batch.output_norms), batch.query_mask)
