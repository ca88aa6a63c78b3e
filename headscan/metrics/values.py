"""What a head moves, not only where it looks: value-weighted attention and direct logit attribution.

Pure, vectorised functions of one layer's captured activations, called per layer by the sweep. Notation, for
one segment and one head ``h`` (query head; under grouped-query attention it reads key/value head ``g(h)``):

- ``A[q, k]`` its attention weight; ``v_k`` the value vector of key ``k`` as the model computes it,
  ``x_k W_V + b_V`` (value bias included; ``x_k`` the normalised input of the attention layer);
- ``f(x_k) = v_k W_O^h``, the vector the head moves from key ``k`` into the residual stream (``W_O^h`` is the
  head's ``d_head`` rows of the output projection; its bias ``b_O`` belongs to no head and is left out);
- ``z_q = sum_k A[q, k] v_k``, the head's output before ``W_O`` (TransformerLens' ``hook_z``).

Value weighting (Kobayashi et al. 2020) replaces ``A[q, k]`` by ``||A[q, k] f(x_k)|| = A[q, k] ||f(x_k)||``.
`value_weighted` divides each query's row by its sum, so the matrix reads like an attention pattern (rows
sum to 1) and every share metric of `headscan.metrics` applies to it unchanged.

Direct logit attribution (Elhage et al. 2021) of head ``h`` at query ``q``: its output ``z_q W_O^h`` dotted with
the logit direction of the token at ``q + 1``, divided by the final norm's scale at ``q`` (frozen from the
forward pass), the logit direction being the unembedding column with the final norm's gain folded in and
centred over the vocabulary (`headscan.models.weights.logit_directions`).

Every function builds new tensors and never writes into those it is given; none loops over heads. The metrics
built on them, ``moved`` (value.parquet), ``dla`` and ``dla_positive`` (heads.parquet), are registered here.
This module does not run models, hook them or read weights (see `headscan.models.weights`).
"""

from __future__ import annotations

import torch

from ..errors import MetricError
from .batch import AttentionBatch, mean_over_queries
from .chance import span_sums
from .registry import METRICS, register

__all__ = ["output_norm_factor", "value_norms", "value_weighted", "final_norm_scale", "next_token_targets",
           "logit_contributions", "uniform_values", "dla_sums", "direct_logit_attribution", "moved", "dla", "dla_positive"]


def _float(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` as float32 at least (half precision is upcast; float64 stays)."""
    return tensor if tensor.dtype == torch.float64 else tensor.float()


def output_norm_factor(W_O: torch.Tensor) -> torch.Tensor:
    """(head, d_head, d_head) F with ||x W_O[h]|| = ||x F[h]|| for every x: a small stand-in for W_O.

    Any F with ``F F.T = G = W_O[h] W_O[h].T`` (the d_head x d_head Gram matrix) will do, since
    ``||x F||^2 = x G x.T = ||x W_O[h]||^2``: the Cholesky factor of G, or, for a head whose G is singular (zeroed
    or rank-deficient output weights), ``U sqrt(max(l, 0))`` from G's eigendecomposition. Computed in float64
    and returned as float32 (float64 if given). Cholesky of a d_head x d_head matrix is far cheaper than a QR of
    W_O, which matters on a busy CPU. Computing it once per layer lets `value_norms` work in d_head rather than
    d_model dimensions.

    >>> W_O = torch.randn(2, 4, 16)  # (head, d_head, d_model)
    >>> x = torch.randn(4)
    >>> F = output_norm_factor(W_O)
    >>> torch.allclose((x @ W_O[1]).norm(), (x @ F[1]).norm(), rtol=1e-5)
    True
    >>> float(output_norm_factor(torch.zeros(1, 4, 16)).abs().max())  # a head that moves nothing
    0.0
    """
    W = W_O.detach().double()
    gram = W @ W.transpose(-1, -2)  # (head, d_head, d_head)
    factor, info = torch.linalg.cholesky_ex(gram)  # lower triangular where G is positive definite
    singular = info != 0  # (head,)
    if bool(singular.any()):
        eigenvalues, vectors = torch.linalg.eigh(gram[singular])
        factor = factor.clone()
        factor[singular] = vectors * eigenvalues.clamp_min(0).sqrt()[..., None, :]  # a new tensor of our own
    return factor.to(torch.float64 if W_O.dtype == torch.float64 else torch.float32)


def value_norms(v: torch.Tensor, W_O: torch.Tensor | None = None, *, factor: torch.Tensor | None = None) -> torch.Tensor:
    """(batch, head, k) the norm ||f(x_k)|| = ||v_k W_O^h|| of the vector each query head moves from each key.

    Parameters
    ----------
    v
        (batch, k, kv_head, d_head) the value vectors as the model computes them, bias included:
        TransformerLens' ``blocks.{L}.attn.hook_v``, or the value projection's output reshaped. Under
        grouped-query attention ``kv_head < head`` and query head h reads key/value head
        ``h // (head // kv_head)`` (Llama's grouping); v is not copied per query head.
    W_O
        (head, d_head, d_model) the output projection split by head (its bias is not used).
    factor
        `output_norm_factor(W_O)`, to reuse across batches; then W_O may be None.

    Returns float32 (float64 for float64 inputs), 0 for padded keys only if their v is 0: mask them downstream.

    >>> v = torch.zeros(1, 3, 1, 2); v[0, :, 0, 0] = torch.tensor([1.0, 2.0, 3.0])  # (batch, k, kv_head, d_head)
    >>> W_O = torch.tensor([[[3.0, 4.0], [0.0, 0.0]], [[0.0, 0.0], [1.0, 0.0]]])  # (head, d_head, d_model)
    >>> value_norms(v, W_O)  # head 0 scales v_k[0] by ||(3, 4)|| = 5; head 1 ignores it
    tensor([[[ 5., 10., 15.],
             [ 0.,  0.,  0.]]])
    """
    if factor is None:
        factor = output_norm_factor(W_O)
    n_heads, d_head = factor.shape[0], factor.shape[-1]
    batch, n_keys, n_kv, _ = v.shape
    factor = factor.to(device=v.device, dtype=torch.promote_types(_float(v).dtype, factor.dtype))
    grouped = factor.reshape(n_kv, n_heads // n_kv, d_head, d_head)  # (kv_head, group, d_head, d_head)
    moved = torch.einsum("bkge,gref->bgrkf", v.to(grouped.dtype), grouped)  # (batch, kv_head, group, k, d_head)
    return torch.linalg.vector_norm(moved, dim=-1).reshape(batch, n_heads, n_keys)


def value_weighted(pattern: torch.Tensor, norms: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """(batch, head, q, k) value-weighted attention, each query's row normalised to sum to 1.

    ``W[q, k] = A[q, k] ||f(x_k)|| / sum_k' A[q, k'] ||f(x_k')||`` over the keys k' that count: the share
    of the norm mass ``sum_k ||A[q, k] f(x_k)||`` that comes from key k. A row whose mass is 0 (the head
    moves nothing: zero value or output weights) is all 0, so share metrics score it 0, not NaN.
    Normalising makes this a statement about *where* the moved norm comes from; how much a head moves at
    all is the row's mass, which a caller wanting it computes as ``(pattern * norms[:, :, None]).sum(-1)``.

    Parameters
    ----------
    pattern
        (batch, head, q, k) attention weights.
    norms
        (batch, head, k) `value_norms`, non-negative.
    key_mask
        (batch, k) bool, keys that count (None: all); other keys get 0 and do not enter the row sums.

    The result has the promoted dtype of pattern and norms (float32 for a half pattern with float32 norms).

    >>> pattern = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])  # (batch=1, head=1, q=2, k=2)
    >>> value_weighted(pattern, torch.tensor([[[1.0, 3.0]]]))
    tensor([[[[1.0000, 0.0000],
              [0.2500, 0.7500]]]])
    """
    weights = norms[:, :, None, :]  # (batch, head, 1, k)
    if key_mask is not None:
        weights = weights * key_mask[:, None, None, :]
    weighted = pattern * weights  # a new tensor: written in place below, never the inputs
    total = weighted.sum(-1, keepdim=True)  # (batch, head, q, 1)
    one = torch.ones((), dtype=total.dtype, device=total.device)
    return weighted.div_(torch.where(total > 0, total, one))


# --- direct logit attribution ------------------------------------------------------------------------------


def final_norm_scale(resid: torch.Tensor, *, kind: str, eps: float) -> torch.Tensor:
    """(batch, q) the final norm's divisor at each position, from the residual stream it normalises.

    ``kind="rms"`` (RMSNorm): sqrt(mean_d x_d^2 + eps); ``kind="layer"`` (LayerNorm): sqrt(var_d x + eps),
    the population variance. `resid` (batch, q, d_model) is the residual stream after the last layer
    (TransformerLens' ``blocks.{n_layers - 1}.hook_out``); the result equals ``ln_final.hook_scale[..., 0]``.
    Frozen, it makes every component's contribution to the logits linear.

    >>> final_norm_scale(torch.tensor([[[3.0, 4.0]]]), kind="rms", eps=0.0)  # sqrt((9 + 16) / 2)
    tensor([[3.5355]])
    """
    x = _float(resid)
    if kind == "rms":
        return torch.sqrt(x.pow(2).mean(-1) + eps)
    if kind == "layer":
        return torch.sqrt(x.var(-1, unbiased=False) + eps)
    raise ValueError(f"kind must be 'rms' or 'layer', got {kind!r}")


def next_token_targets(tokens: torch.Tensor, query_mask: torch.Tensor,
                       key_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The token each query predicts and whether it counts: ((batch, q) ids, (batch, q) bool).

    Query q predicts the token at q + 1; it counts when q counts (`query_mask`) and position q + 1 holds a
    real token (`key_mask`: not padding). The last position has no next token: its target is 0 and it
    does not count.

    >>> ids = torch.tensor([[5, 6, 7, 0]]); real = torch.tensor([[True, True, True, False]])
    >>> next_token_targets(ids, real, real)
    (tensor([[6, 7, 0, 0]]), tensor([[ True,  True, False, False]]))
    """
    targets = torch.zeros_like(tokens)
    targets[:, :-1] = tokens[:, 1:]  # a fresh tensor
    valid = torch.zeros_like(query_mask)
    valid[:, :-1] = query_mask[:, :-1] & key_mask[:, 1:]
    return targets, valid


def logit_contributions(z: torch.Tensor, W_O: torch.Tensor, directions: torch.Tensor,
                        next_tokens: torch.Tensor) -> torch.Tensor:
    """(batch, head, q) each head's output dotted with the next token's logit direction, before the final scale.

    ``z_q^h W_O^h . d[:, t_{q+1}]``: `z` (batch, q, head, d_head) is TransformerLens' ``blocks.{L}.attn.hook_z``
    (per query head also under grouped-query attention); `W_O` (head, d_head, d_model); `directions`
    (d_model, vocab) is `headscan.models.weights.logit_directions` (final norm gain folded in, centred); `next_tokens`
    (batch, q) from `next_token_targets`. Divide by `final_norm_scale` to get the attribution; a sweep can
    keep these (small) per layer and divide once the last layer's residual is known. `z` may have leading
    dimensions before (batch, q, head, d_head) (the head's output and the null head's, stacked): the result
    keeps them, (..., batch, head, q), and the projection back from the vocabulary is computed once.
    """
    dtype = torch.promote_types(_float(z).dtype, directions.dtype)
    wanted = directions.T[next_tokens].to(dtype)  # (batch, q, d_model): gathered rows, a new tensor
    back = torch.einsum("hed,bqd->bqhe", W_O.to(device=z.device, dtype=dtype), wanted)  # (batch, q, head, d_head)
    return (z.to(dtype) * back).sum(-1).transpose(-1, -2)  # (..., batch, head, q)


def uniform_values(v: torch.Tensor, key_mask: torch.Tensor, *, causal: bool, n_heads: int,
                   window: int | None = None) -> torch.Tensor:
    """(batch, q, head, d_head) the null head's output before W_O: the mean of the value vectors of the keys that
    count and that each query sees (at or before it when `causal`; within `window`, the largest |q - k| a query
    sees, where the layer has a sliding window), for every query head.

    `v` (batch, k, kv_head, d_head) as `value_norms` takes it (query head h reads key/value head
    h // (head // kv_head)); `key_mask` (batch, k). A query that sees no key that counts gets 0.

    >>> v = torch.tensor([1.0, 3.0, 5.0]).view(1, 3, 1, 1)
    >>> uniform_values(v, torch.tensor([[True, True, True]]), causal=True, n_heads=2)[0, :, :, 0]
    tensor([[1., 1.],
            [2., 2.],
            [3., 3.]])
    """
    dtype = torch.promote_types(_float(v).dtype, torch.float32)
    mask = key_mask.to(dtype)[:, :, None, None]  # (batch, k, 1, 1)
    kept = v.to(dtype) * mask  # a new tensor
    if window is not None:  # sums over each query's window, from differences of cumulative sums
        positions = torch.arange(v.shape[1], device=v.device)
        first = (positions - window).clamp_min(0)
        last = positions if causal else (positions + window).clamp_max(v.shape[1] - 1)
        total, n = span_sums(kept.cumsum(1), first, last, dim=1), span_sums(mask.cumsum(1), first, last, dim=1)
    elif causal:
        total, n = kept.cumsum(1), mask.cumsum(1)  # (batch, q = k, kv_head, d_head), (batch, q, 1, 1)
    else:
        total, n = kept.sum(1, keepdim=True).expand_as(kept), mask.sum(1, keepdim=True).expand_as(mask)
    mean = total / n.clamp_min(1)
    return mean.repeat_interleave(n_heads // v.shape[2], dim=2)  # (batch, q, head, d_head)


def dla_sums(contributions: torch.Tensor, final_scale: torch.Tensor, query_mask: torch.Tensor):
    """Per-segment sums and counts of the direct logit attribution and of its positive share.

    `contributions` (batch, head, q) from `logit_contributions`, `final_scale` (batch, q) from
    `final_norm_scale`, `query_mask` (batch, q) the queries that count (`next_token_targets`' validity).
    Returns ``((dla_sums, counts), (positive_sums, counts))``, each (batch, head): the mean attribution of a
    head is ``dla_sums / counts`` over the corpus, the share of queries where it is positive
    ``positive_sums / counts`` (the `headscan.metrics` convention).

    >>> c = torch.tensor([[[2.0, -4.0, 9.0]]]); scale = torch.tensor([[2.0, 2.0, 1.0]])
    >>> dla_sums(c, scale, torch.tensor([[True, True, False]]))
    ((tensor([[-1.]]), tensor([[2.]])), (tensor([[1.]]), tensor([[2.]])))
    """
    dla = contributions / final_scale.to(contributions.dtype)[:, None, :]  # (batch, head, q)
    valid = query_mask[:, None, :]  # (batch, 1, q)
    zero = torch.zeros((), dtype=dla.dtype, device=dla.device)
    sums = torch.where(valid, dla, zero).sum(-1)  # (batch, head)
    positive = (valid & (dla > 0)).to(dla.dtype).sum(-1)
    counts = valid.sum(-1).to(dla.dtype).expand_as(sums)
    return (sums, counts), (positive, counts)


def direct_logit_attribution(z: torch.Tensor, W_O: torch.Tensor, final_scale: torch.Tensor, W_U: torch.Tensor,
                             next_tokens: torch.Tensor, query_mask: torch.Tensor):
    """Direct logit attribution of every head of one layer: ``((dla_sums, counts), (positive_sums, counts))``.

    DLA of head h at query q = ``z_q^h W_O^h . d[:, t_{q+1}] / s_q``, where ``s_q`` is the final norm's scale
    frozen from the forward pass and ``d = logit_directions`` (the unembedding with the final norm's gain
    folded in and, for LayerNorm, centred over d_model; then centred over the vocabulary, so that a logit
    counts relative to the mean logit). Summed over every head, the embeddings, every MLP and the attention
    output biases it gives the centred logit of the next token (the final norm's bias adds a constant).

    z (batch, q, head, d_head), W_O (head, d_head, d_model), final_scale (batch, q), W_U the (d_model, vocab)
    directions, next_tokens and query_mask (batch, q) from `next_token_targets`. Counts only queries in
    `query_mask`. See `logit_contributions` and `dla_sums` for the two halves.
    """
    return dla_sums(logit_contributions(z, W_O, W_U, next_tokens), final_scale, query_mask)


# --- the registered metrics: moved (value.parquet), dla and dla_positive (heads.parquet) --------------------


def _moved_chance(batch: AttentionBatch):
    """The mean of ||f(x_k)|| over the keys the query sees, over its mean over the segment's keys that count:
    exactly 1 for a bidirectional model whose queries see every key (no sliding window)."""
    norms = batch.value_norms.to(torch.float64)  # (batch, head, k)
    keys = batch.key_mask.to(norms.dtype)  # (batch, k)
    mean = (norms * keys[:, None, :]).sum(-1) / keys.sum(-1).clamp_min(1)[:, None]  # (batch, head)
    seen = batch.null.expect(norms)  # (batch, head, q): uniform attention's sum_k A'[q, k] ||f(x_k)||
    ratio = torch.where(mean[..., None] > 0, seen / mean.clamp_min(torch.finfo(norms.dtype).tiny)[..., None],
                        torch.zeros((), dtype=norms.dtype))
    return mean_over_queries(ratio, batch.query_mask & (batch.n_visible() >= 2))[0]


@register("moved", table="value", unit="times the mean value norm", bounded=False, needs=("value_norms",), null="controls",
          chance=_moved_chance)
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
    return mean_over_queries(ratio, batch.query_mask & (batch.n_visible() >= 2))


_NO_LOGIT = "an encoder has no next-token logit; NaN for every head"


def _require(batch: AttentionBatch, function) -> None:
    """Refuse a batch without the captured tensors the metric registered as `function` needs."""
    metric = next(m for m in METRICS.values() if m.function is function)
    missing = [name for name in metric.needs if getattr(batch, name) is None]
    if missing:
        raise MetricError(f"metric {metric.name!r} needs {missing[0]}, which this AttentionBatch does not carry "
                          f"(the sweep captures it with values=True on the transformer_lens path)")


def _dla(batch: AttentionBatch, function, contributions: torch.Tensor | None = None):
    _require(batch, function)
    queries = torch.zeros_like(batch.key_mask)  # (batch, k): this batch's query rows at their absolute positions
    queries[:, batch.query_start: batch.query_start + batch.pattern.shape[-2]] = batch.query_mask  # a fresh tensor
    _, valid = next_token_targets(batch.tokens, queries, batch.key_mask)  # (batch, k)
    rows = slice(batch.query_start, batch.query_start + batch.pattern.shape[-2])
    given = batch.logit_contributions if contributions is None else contributions
    return dla_sums(given, batch.final_scale[:, rows], valid[:, rows])


def _dla_chance(batch: AttentionBatch):
    """The null head's dla: its output z_q replaced by the mean of the value vectors of the keys that count and
    that the query sees (what uniform attention would move), through the same W_O, direction and frozen scale.
    NaN where the sweep did not capture it."""
    if batch.null_logit_contributions is None:
        return None
    return _dla(batch, dla, batch.null_logit_contributions)[0][0]


def _dla_positive_chance(batch: AttentionBatch):
    """The share of those queries where the null head's dla (see dla's chance) is positive."""
    if batch.null_logit_contributions is None:
        return None
    return _dla(batch, dla_positive, batch.null_logit_contributions)[1][0]


@register("dla", unit="logit", bounded=False, signed=True, structural={"bidirectional": _NO_LOGIT}, null="controls",
          null_why="the same values under uniform attention still write to the logits (they put the strongest "
                   "direct-effect head of smollm2 below its chance), so only random-init controls' heads are a null",
          needs=("logit_contributions", "final_scale"), chance=_dla_chance)
def dla(batch: AttentionBatch):
    """Direct logit attribution: the mean over real queries q whose next token t is real of the head's output
    z_q W_O^h (its slice of the attention output through W_O, output bias left out) dotted with t's unembedding
    direction, divided by the final norm's scale at q (frozen from the forward pass), the direction having the
    final norm's gain folded in and being centred over the vocabulary (a logit relative to the mean logit).

    Positive: the head raises the logit of the token that actually comes next. Causal models only.
    """
    return _dla(batch, dla)[0]


@register("dla_positive", unit="share of queries", structural={"bidirectional": _NO_LOGIT}, null="controls",
          needs=("logit_contributions", "final_scale"), chance=_dla_positive_chance)
def dla_positive(batch: AttentionBatch):
    """Share of the queries that count for dla where the head's direct logit attribution is positive."""
    return _dla(batch, dla_positive)[1]
