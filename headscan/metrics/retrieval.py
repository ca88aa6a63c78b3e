"""Retrieval heads (Wu et al. 2024): heads whose most-attended key is the needle token the model copies out.

In a needle-in-a-haystack trial the model reads a long haystack with a needle sentence planted in it, then
answers a question about the needle by greedy decoding. At each decoding step, a head *copies* when the top-1
key of the query row that produced the step's token lies among the answer's tokens inside the needle and holds
the very token just generated (``retrieval_head_detection.py``, ``retrieval_calculate``: ``topk(1)`` of the
last query row, ``needle_start <= i < needle_end`` and ``prompt_ids[i] == generated``). A trial's score is the
number of copying steps over the answer's token count; Wu et al. call a head a retrieval head when its mean
over the trials that pass their answer gate exceeds 0.1.

The metric functions score one decoding step (`AttentionBatch.needle` and ``generated`` filled); the
trials, the gate and the mean over trials are `headscan.scan.trials`'s, which decodes with chunked
attention (`headscan.models.decode`). Sweeps never score these metrics (`headscan.metrics.registry.DECODED`).

This module does not run models.
"""

from __future__ import annotations

import torch

from .batch import AttentionBatch
from .registry import register

__all__ = ["retrieval", "retrieval_ungated", "copying_steps", "chance_steps"]

_NEEDS = ("needle", "generated")
_ENCODERS = "an encoder generates no answer, so no decoding step is scored"


def copying_steps(batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, head) 1.0 where the head copies at this step, and (batch, head) ones: one step each.

    The last query row of the pattern is the one that produced ``batch.generated``; its top-1 key among the
    keys that count (ties to the earliest key, as ``torch.argmax``) copies when it is a needle key holding
    the generated token.
    """
    row = batch.masked[..., -1, :]  # (batch, head, k): the query whose forward pass chose the token
    top = row.argmax(-1)  # (batch, head): the first key of largest weight
    in_needle = batch.needle.gather(1, top)  # (batch, head)
    copied = batch.tokens.gather(1, top) == batch.generated[:, None]  # (batch, head)
    hits = (in_needle & copied).to(row.dtype)
    return hits, torch.ones_like(hits)


def chance_steps(batch: AttentionBatch) -> torch.Tensor:
    """(batch,) the probability that a key drawn uniformly from those the last query sees (and that count) is
    a needle key holding the generated token: what a head attending uniformly would score at this step."""
    keys = batch.key_positions
    # (batch, k): a decoding step's query sees every key before it, within a sliding window where there is one
    visible = batch.key_mask & batch.sees(batch.query_positions[-1] - keys)[None, :]
    targets = batch.needle & visible & (batch.tokens == batch.generated[:, None])  # (batch, k)
    return targets.sum(-1).to(batch.pattern.dtype) / visible.sum(-1).clamp_min(1).to(batch.pattern.dtype)


def _uniform_copying(batch: AttentionBatch) -> torch.Tensor:
    """The probability that a key drawn uniformly from those the step's query sees is a needle key holding the
    token just generated, averaged over the trial's steps like the score (`chance_steps`)."""
    return chance_steps(batch)[:, None]  # (batch, 1): the same for every head


@register("retrieval", table="retrieval", unit="share of answer tokens", needs=_NEEDS,
          structural={"bidirectional": _ENCODERS}, chance=_uniform_copying)
def retrieval(batch: AttentionBatch):
    """Wu et al.'s (2024) retrieval score: at each greedy decoding step of a needle-in-a-haystack trial, a head
    copies when the top-1 key of the query row that produced the step's token (ties to the earliest key) lies
    among the answer's tokens inside the needle and holds the token just generated. A trial scores the number
    of copying steps over the answer's token count (not capped at 1, as in their code); the value is the mean
    over the trials whose answer passes the gate (ROUGE-1 recall of the answer by the decoded response above
    0.5, Porter-stemmed), with a bootstrap interval over trials.

    Decoding is greedy, at most 50 steps, and stops after a step that generates a newline or the end of the
    turn. Wu et al. call a head with a score above 0.1 a retrieval head.
    """
    return copying_steps(batch)


@register("retrieval_ungated", table="retrieval", unit="share of answer tokens", needs=_NEEDS,
          structural={"bidirectional": _ENCODERS}, chance=_uniform_copying)
def retrieval_ungated(batch: AttentionBatch):
    """The retrieval score without the answer gate: the mean over every trial whose answer span was found in the
    prompt, whether or not the decoded answer passes the gate. Not Wu et al.'s number: reported beside it for
    models that pass the gate too rarely for a table.
    """
    return copying_steps(batch)
