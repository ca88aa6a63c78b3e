"""Does the head matter? The targets a head's removal is measured on, attribution patching, and BERT's masking.

A head's importance is the change of a target when its output is replaced, ablated minus clean: positive when
the target (a loss) rises without it. Every target is a mean over tokens, kept as per-segment sums and counts
like every other score, so that its change has a bootstrap interval, ``units`` and ``top_unit_share``:

- ``next_token_loss`` (causal language models): the cross-entropy of the next token, summed over the real
  positions whose next position is real, and that count;
- ``masked_loss`` (encoders whose checkpoint holds a trained masked-LM head): the cross-entropy of the masked
  tokens, under a seeded masking of each segment (`mask_tokens`: a share of its real non-special tokens, of
  which 80% become [MASK], 10% a random token and 10% stay, as BERT was trained);
- ``hidden_change`` (other encoders, such as the sentence encoder minilm): 1 - cosine between the final hidden
  state of each real token with the head removed and without, summed over real tokens; 0 on the clean pass.

Methods (the ``method`` column): ``mean_ablation`` replaces the head's output at every real position but each
segment's first (BOS, [CLS]; with ``ablate_first`` that one too) by its mean over the same positions of a seeded
sample of the corpus; ``zero_ablation`` by 0; ``resample_ablation`` by the same head's output at the same position
of another segment of the sample (a seeded derangement); all exactly, one head at a time. ``atp_mean`` and
``atp_zero`` estimate the first two to first order (attribution patching, Nanda 2023; Kramár et al.
2024), for every head from one backward pass (`headscan.models.atp_star.attribution`). The first-order term of ``hidden_change`` is 0
(the clean pass is its minimum), so it has no AtP rows with a value.

Pure functions that never write into their inputs; none loops over heads. The models are run, and the heads
cut, by `headscan.models.ablation`; the sums kept by `headscan.scan.importance`.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..config import IMPORTANCE_METHODS, IMPORTANCE_TARGETS
from .registry import Axis, register

__all__ = ["methods", "importance_keys", "next_token_loss", "masked_loss", "hidden_change", "target_sums",
           "mask_tokens", "MASK_SPLIT", "importance"]

MASK_SPLIT = (0.8, 0.1, 0.1)  # of the tokens chosen for masking: [MASK], a random token, kept (BERT's rule)


def methods(config) -> list[str]:
    """The methods a sweep with `config` fills: none when off, the AtP estimates for ``atp``, all for ``ablate``.

    >>> from headscan.config import SweepConfig
    >>> methods(SweepConfig(importance="atp"))
    ['atp_mean', 'atp_zero']
    """
    importance = getattr(config, "importance", "off")
    if importance == "off":
        return []
    return [m for m in IMPORTANCE_METHODS if importance == "ablate" or m.startswith("atp")]


def importance_keys(config) -> list[tuple[str, str]]:
    """(method, target) for every method the sweep fills and every target; a model fills one target's rows and
    the others are dropped when its table is finished."""
    return [(method, target) for method in methods(config) for target in IMPORTANCE_TARGETS]


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """`x` in float32 when it is narrower (float16, bfloat16), else as it is: a float64 model is scored in float64."""
    return x.float() if x.dtype.itemsize < 4 else x


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch,) sums of the next-token cross-entropy and (batch,) counts, over the positions q whose token and
    next token are real; logits (batch, seq, vocab), tokens and real (batch, seq).

    >>> logits = torch.zeros(1, 3, 4)  # uniform over 4 tokens: log 4 per position
    >>> sums, counts = next_token_loss(logits, torch.tensor([[0, 1, 2]]), torch.tensor([[True, True, False]]))
    >>> round(float(sums[0]), 4), int(counts[0])
    (1.3863, 1)
    """
    counted = real[:, :-1] & real[:, 1:]  # (batch, seq - 1)
    losses = F.cross_entropy(_at_least_float32(logits[:, :-1]).transpose(1, 2), tokens[:, 1:], reduction="none")  # (batch, seq - 1)
    # summed in float64: a change is the difference of two such sums, and float32 would round it to ~1e-5
    return torch.where(counted, losses.double(), 0).sum(-1), counted.sum(-1).double()


def masked_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch,) sums of the cross-entropy at the masked positions (labels >= 0) and (batch,) their counts; logits
    (batch, seq, vocab), labels (batch, seq) holding the original token where masked and -100 elsewhere."""
    counted = labels >= 0
    losses = F.cross_entropy(_at_least_float32(logits).transpose(1, 2), labels.clamp_min(0), reduction="none")  # (batch, seq)
    return torch.where(counted, losses.double(), 0).sum(-1), counted.sum(-1).double()


def hidden_change(hidden: torch.Tensor, clean: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch,) sums of 1 - cos(hidden[q], clean[q]) over real tokens q, and (batch,) their counts; hidden and
    clean (batch, seq, d_model).

    >>> h = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    >>> hidden_change(h, torch.tensor([[[1.0, 0.0], [1.0, 0.0]]]), torch.tensor([[True, True]]))
    (tensor([1.], dtype=torch.float64), tensor([2.], dtype=torch.float64))
    """
    change = 1 - F.cosine_similarity(_at_least_float32(hidden), _at_least_float32(clean), dim=-1)  # (batch, seq)
    return torch.where(real, change.double(), 0).sum(-1), real.sum(-1).double()


def target_sums(target: str, output: torch.Tensor, *, tokens: torch.Tensor, real: torch.Tensor,
                labels: torch.Tensor | None = None, clean: torch.Tensor | None = None):
    """The per-segment sums and counts of `target` (one of ``IMPORTANCE_TARGETS``) on a pass's `output`."""
    if target == "next_token_loss":
        return next_token_loss(output, tokens, real)
    if target == "masked_loss":
        return masked_loss(output, labels)
    return hidden_change(output, output if clean is None else clean, real)


def mask_tokens(ids: list[int], maskable: list[bool], *, key: tuple[int, ...], rate: float, mask_id: int,
                vocab_size: int) -> tuple[list[int], list[int]]:
    """BERT's masking of one sequence, drawn from a generator seeded by `key` alone (so batching and sharding do
    not change it): each maskable token is chosen with probability `rate`; a chosen token becomes `mask_id`
    (80%), a token drawn uniformly from the vocabulary (10%) or stays (10%). Returns the input ids and the labels
    (the original token where chosen, -100 elsewhere).

    >>> inputs, labels = mask_tokens([5, 6, 7, 8], [False, True, True, False], key=(0, 3), rate=0.99, mask_id=1,
    ...                              vocab_size=10)
    >>> [label for label in labels]
    [-100, 6, 7, -100]
    """
    rng = np.random.default_rng(list(key))
    n = len(ids)
    chosen = (rng.random(n) < rate) & np.asarray(maskable, dtype=bool)
    how = rng.random(n)
    random_ids = rng.integers(0, vocab_size, n)
    inputs = np.asarray(ids).copy()
    inputs = np.where(chosen & (how < MASK_SPLIT[0]), mask_id, inputs)
    inputs = np.where(chosen & (how >= MASK_SPLIT[0]) & (how < MASK_SPLIT[0] + MASK_SPLIT[1]), random_ids, inputs)
    labels = np.where(chosen, np.asarray(ids), -100)
    return inputs.tolist(), labels.tolist()


def _no_change(batch) -> None:
    """0: the change made by a head that changes nothing. No attention pattern enters importance, so there is no
    null head to run; a head matters where its interval lies beyond 0 (`headscan.scan.importance` fills these
    columns apart from the pattern pass, and their chance sums stay 0)."""
    return None


@register("importance", table="importance", unit="change of the target", bounded=False, signed=True,
          axis=Axis(("method", "target"), importance_keys), chance=_no_change)
def importance(ablated: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """Does the head matter: the change of a target when the head's output is removed, ablated minus clean (a
    mean over tokens: per-segment sums of the change over the target's token count). Positive: the loss rises
    without the head. Targets: ``next_token_loss`` (causal models), ``masked_loss`` (encoders with a trained
    masked-LM head; BERT's seeded 15% masking, 80/10/10), ``hidden_change`` (1 - cosine of each real token's final
    hidden state, other encoders). Methods: ``mean_ablation`` (the head's output replaced at every real position
    but each segment's first, BOS or [CLS], by its mean over the same positions of a seeded sample of the corpus;
    ``--ablate-first`` replaces the first position too and takes the mean over it), ``zero_ablation`` (by 0),
    ``resample_ablation`` (by the same head's output at the same position of another segment of the sample, a
    seeded derangement; the head's mean where that segment is shorter), all exact and one head at a time;
    ``atp_mean`` and ``atp_zero``, first-order estimates of the first two from one backward pass, sum over the
    replaced positions of (replacement - z) . dT/dz (attribution patching); NaN for ``hidden_change``, whose
    first-order change is 0. The head's output z is cut where it enters the attention output projection (its
    bias belongs to no head); grouped-query models ablate query heads. A head that changes nothing scores 0."""
    return ablated - clean
