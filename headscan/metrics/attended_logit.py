"""Movers and suppressors: how a head's output moves the logits of the tokens it attends to.

`dla` scores what a head writes towards the token that comes next. Whether a head raises or lowers the logit of
the tokens it reads from is another question, and it separates two kinds of head that dla cannot: a *mover*
(name movers, copying heads: it attends to a token and raises that token's logit) from a *copy suppressor*
(McDougall et al. 2024, "Copy suppression: comprehensively understanding an attention head", GPT-2 small's
L10H7: it attends to a token the model is about to predict and lowers its logit).

For head h at query q, with attention ``A[q, k]``, output ``z_q^h`` before W_O and ``d`` the logit directions of
dla (`headscan.models.weights.logit_directions`: the unembedding with the final norm's gain folded in, centred
over d_model for LayerNorm, and centred over the vocabulary, so that a logit counts relative to the mean logit),
the effect is ``sum_k A[q, k] z_q^h W_O^h . d[:, t_k] / s_q``, ``s_q`` the final norm's scale at q frozen from the
forward pass: dla's convention, with the attended tokens ``t_k`` in place of the next token. It is computed in
two halves, both vectorised over heads: at the layer's pattern, ``u_q^h = sum_k A[q, k] W_O^h d[:, t_k]``
(`attended_directions`, d_head wide), and at its output, ``z_q^h . u_q^h`` (`attended_contributions`).
This module registers ``attended_logit``; it does not run models or read weights.
"""

from __future__ import annotations

import torch

from .batch import AttentionBatch, mean_over_queries
from .registry import register

__all__ = ["attended_directions", "attended_contributions", "attended_logit"]


def attended_directions(pattern: torch.Tensor, key_mask: torch.Tensor, tokens: torch.Tensor, W_O: torch.Tensor,
                        directions: torch.Tensor) -> torch.Tensor:
    """(batch, q, head, d_head) ``u_q^h = sum_k A[q, k] W_O^h d[:, t_k]`` over the keys k that count.

    `pattern` (batch, head, q, k) the attention as the model computed it (rows ``query_start ..`` of it in
    chunked mode); `key_mask` (batch, k) the keys that count (padding, and specials when they are left out, do
    not: their weight is dropped, not renormalised away); `tokens` (batch, k); `W_O` (head, d_head, d_model);
    `directions` (d_model, vocab) the logit directions. Each key token's direction is brought back into every
    head's d_head space once, then weighted by attention: d_model is reached once per key, never per query.
    float32 at least.
    """
    dtype = torch.promote_types(pattern.dtype if pattern.dtype == torch.float64 else torch.float32, directions.dtype)
    keys = directions.T[tokens].to(dtype)  # (batch, k, d_model): gathered rows, a new tensor
    back = torch.einsum("hed,bkd->bkhe", W_O.to(device=pattern.device, dtype=dtype), keys)  # (batch, k, head, d_head)
    weights = pattern.to(dtype) * key_mask[:, None, None, :].to(dtype)  # (batch, head, q, k), a new tensor
    return torch.einsum("bhqk,bkhe->bqhe", weights, back)


def attended_contributions(z: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """(batch, head, q) ``z_q^h . u_q^h``: the attended-token logit effect before the final scale.

    `z` (batch, q, head, d_head) each head's output before W_O; `directions` (batch, q, head, d_head) from
    `attended_directions` of the same layer.

    >>> z = torch.ones(1, 2, 1, 3); u = torch.tensor([1.0, -2.0]).view(1, 2, 1, 1).expand(1, 2, 1, 3)
    >>> attended_contributions(z, u)
    tensor([[[ 3., -6.]]])
    """
    dtype = torch.promote_types(z.dtype if z.dtype == torch.float64 else torch.float32, directions.dtype)
    return (z.to(dtype) * directions.to(dtype)).sum(-1).transpose(-1, -2)  # (batch, head, q)


def _zero_chance(batch: AttentionBatch):
    """0: a head that moves nothing, or whose output is unrelated to the tokens it reads, leaves their logits where
    they were on average. Not uniform attention's value (the mean value vector, through the head's own OV
    circuit, still moves them): random-init controls are the null."""
    return torch.zeros(batch.query_mask.shape[0], 1, dtype=batch.attended_contributions.dtype,
                       device=batch.attended_contributions.device)  # (batch, 1): the same for every head


_NO_LOGIT = "an encoder has no next-token logit; NaN for every head"


@register("attended_logit", unit="logit", bounded=False, signed=True, structural={"bidirectional": _NO_LOGIT},
          needs=("attended_contributions", "final_scale"), chance=_zero_chance, null="controls",
          null_why="a head's own OV circuit moves the logits of what it reads whether or not it learned to (a random "
                   "W_V W_O has a diagonal of either sign), so only random-init controls' heads at the same layer "
                   "are a null; its chance is 0")
def attended_logit(batch: AttentionBatch):
    """Attended-token logit effect: the mean over real queries q of sum_k A[q, k] (z_q W_O^h . d[:, t_k]) / s_q,
    over the keys k that count (their weights as the model computed them, not renormalised), where z_q W_O^h is
    the head's output at q through its rows of W_O (output bias left out), t_k the token at key k, d[:, t] its
    logit direction as dla takes it (the final norm's gain folded in, centred over the vocabulary: a logit
    relative to the mean logit) and s_q the final norm's scale at q, frozen from the forward pass.

    Positive: the head raises the logits of the tokens it attends to (a mover, a copying head); negative: it
    lowers them (copy suppression, McDougall et al. 2024, GPT-2 small's L10H7). Ranked high-first: suppressors
    are its lowest rows. Causal models only.
    """
    scale = batch.final_scale.to(batch.attended_contributions.dtype)[:, None, :]  # (batch, 1, q)
    return mean_over_queries(batch.attended_contributions / scale, batch.query_mask)
