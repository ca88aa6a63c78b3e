"""Composition scores from the weights: how much each head's output can feed a later head's query, key or value
(Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"), computed as TransformerLens'
``all_composition_scores`` computes them, with a null that keeps each matrix's spectrum.

For a sender head s in an earlier layer and a receiver head r in a later one, with ``OV_s = W_V^s W_O^s`` and
``QK_r = W_Q^r W_K^r^T`` (d_model x d_model, TransformerLens' layout: rows read the residual stream):

- Q-composition ``||OV_s QK_r||_F / (||OV_s||_F ||QK_r||_F)``: what s writes moves r's queries;
- K-composition ``||OV_s QK_r^T||_F / (...)``: what s writes moves r's keys (a previous-token head feeding an
  induction head, Olsson et al. 2022);
- V-composition ``||OV_s OV_r||_F / (||OV_s||_F ||OV_r||_F)``: what s writes is what r moves.

Each is in [0, 1]. The weights are those of TransformerLens' default processing (``fold_ln`` and
``center_writing_weights``, `composition_weights`): the gain of the norm before each attention is folded into
W_Q, W_K and W_V; where that norm is a LayerNorm, which removes the residual's mean, the reading weights are
centred over d_model (a head reads nothing along the all-ones direction) and so are the writing weights W_O (what a
head writes along it is removed before anyone reads it). An RMSNorm keeps the mean: its gain is folded and
nothing is centred. A post-LayerNorm model (BERT) normalises the residual stream itself after every attention, so
what a head writes reaches the next layer through a LayerNorm of the whole sum, and a score of the weights alone
is not defined there: it is refused (`ModelLoadError`). Rotary position embeddings are left out, as TransformerLens
leaves them: K-composition on a RoPE model reads W_Q W_K^T as if queries and keys were not rotated, so it ignores
how the rotation between a query's and a key's positions turns the key's reading directions.

No d_model x d_model matrix is built: with ``W_V^s = Q R_V`` (QR, d_head x d_head ``R_V``) and likewise for the
receiver's outer factor, the Frobenius norm of ``W_V^s (W_O^s W^r) W'^r^T`` is that of ``R_V (W_O^s W^r) R'^T``
(orthonormal factors keep it), a d_head x d_head product per pair.

The null (`composition_null`) is the same score with the residual basis between sender and receiver turned by a
Haar-random rotation: each matrix keeps its singular values, and only how the sender's writing directions meet
the receiver's reading directions is random. For singular values ``sigma`` of OV_s and ``tau`` of the receiver's
matrix, the rotated score is ``sqrt(sum_ij sigma_i^2 tau_j^2 C_ij^2 / (sum sigma^2 sum tau^2))`` with C the
d_head x d_head corner of a Haar-random orthogonal matrix of the residual space (d_model, or d_model - 1 where
centring leaves the weights in the space orthogonal to the all-ones direction). The corners depend on the shapes
alone: they are drawn once per shape and kept for the process (`haar_corners`); each null draw pairs one corner
with a sender and a later receiver drawn from the model's own pairs, so the null is that of the model's own
spectra. Draws are added until the bootstrap standard error of the null's 99th percentile (`quantile_se`) is at
most `NULL_SE_TARGET` (5e-4) and a 25th of the null's standard deviation, so that the share of random pairs beyond
the cut is 1% to about 0.1 points. On random weights, whose directions are uniformly random, about 1 pair in 100 is beyond
that percentile.

This module reads weights; it runs no forward pass and reads no corpus.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pandas as pd
import torch

from ..errors import ModelLoadError
from ..tables import head_label
from .weights import head_weights, heads_of, kv_width, pre_attention_norms

__all__ = ["MODES", "NULL_QUANTILE", "NULL_SE_TARGET", "head_qk", "composition_refusal", "composition_weights", "composition_scores",
           "haar_corners", "composition_null", "quantile_se", "composition_arrays", "composition_rows",
           "composition_frame"]

MODES = ("Q", "K", "V")
NULL_QUANTILE = 0.99
NULL_SE_TARGET = 5e-4  # the largest bootstrap standard error of the null's 99th percentile a run accepts
# ... and at most this share of the null's own spread: on a wide model (GPT-2 small: SD 0.0004) an error of 5e-4 would
# move the cut by a whole SD; at SD / 25 the share of random pairs beyond it is 1% to about +-0.1 points
NULL_SE_SHARE = 1 / 25
NULL_MIN_DRAWS = 2048  # at least 21 draws beyond the 99th percentile, so its bootstrap is not read off a handful
NULL_MAX_DRAWS = 1 << 16  # a random tiny GPT-2 (d_head 8) needs about 20,000; GPT-2 small 2,048
_CHUNK = 2048  # corners are drawn and kept in chunks, so the first n draws never depend on how many were asked
NULL_SEED = 0

LAYER_NORM_RULE = ("TransformerLens' default processing (fold_ln, center_writing_weights): the pre-attention "
                   "LayerNorm's gain folded into W_Q, W_K, W_V, which are then centred over d_model (LayerNorm removes "
                   "the residual's mean), and W_O centred over d_model; rotary embeddings ignored")
RMS_NORM_RULE = ("TransformerLens' default processing for RMSNorm (fold_ln without centring): the pre-attention "
                 "RMSNorm's gain folded into W_Q, W_K, W_V; nothing centred (RMSNorm keeps the residual's mean); "
                 "rotary embeddings ignored")
POST_NORM_REFUSAL = ("is post-LayerNorm: a LayerNorm of the whole residual stream follows every attention, so what a "
                     "head writes reaches the next layer's heads only through it, and composition scores of the "
                     "weights (Elhage et al., TransformerLens' all_composition_scores) are not defined; headscan scores "
                     "pre-norm models (GPT-2, Llama-style) only")


def head_qk(model, *, fold_norms: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_Q, W_K), each (layer, head, d_model, d_head) per query head (grouped key heads repeated), read from the
    Hugging Face modules of a BERT-, GPT-2- or Llama-style model; the pre-attention norm gain folded in (nothing
    centred: `composition_weights` does that)."""
    sites = model.layer_sites
    if sites.layout is None:
        head_weights(model)  # its ModelLoadError says which layouts are read
    n_heads = model.n_heads
    n_kv = kv_width(model)
    W_Q, W_K = [], []
    with torch.no_grad():
        for layer in range(len(sites.layers)):
            W_Q.append(heads_of(sites, layer, "q", n_heads)[0])
            key = heads_of(sites, layer, "k", n_kv)[0]
            W_K.append(key.repeat_interleave(n_heads // n_kv, dim=0) if sites.layout.grouped else key)
        W_Q, W_K = torch.stack(W_Q), torch.stack(W_K)
        norms = pre_attention_norms(sites) if fold_norms else None
        if norms is not None:
            gain = norms[0][:, None, :, None]  # (layer, 1, d_model, 1)
            W_Q, W_K = gain * W_Q, gain * W_K
    return W_Q, W_K


def _reading_writing(model) -> tuple[torch.Tensor, ...]:
    """(W_Q, W_K, W_V, W_O) as the model holds them, float64, with the pre-attention norm's gain folded into the
    first three in float64 (so that folding adds no float32 rounding)."""
    W_Q, W_K = head_qk(model, fold_norms=False)
    weights = head_weights(model, fold_norms=False)
    W_Q, W_K, W_V, W_O = (w.detach().double() for w in (W_Q, W_K, weights.W_V, weights.W_O))
    gain = pre_attention_norms(model.layer_sites)[0].detach().double()[:, None, :, None]
    return gain * W_Q, gain * W_K, gain * W_V, W_O


def _norm_kind(model) -> str:
    """"layer" or "rms": the norm before each attention of a pre-norm model; a post-norm one is refused."""
    sites = model.layer_sites
    if sites.layout is None:
        head_weights(model)  # its ModelLoadError says which layouts are read
        raise ModelLoadError(f"model {model.name!r}: no pre-attention norm found")  # not reached: head_weights refuses
    kind = sites.norm_kind()
    if kind is None:
        raise ModelLoadError(f"model {model.name!r} ({type(model.hf_model).__name__}) {POST_NORM_REFUSAL}")
    return kind


def composition_refusal(model) -> str | None:
    """Why `model`'s composition is not scored (a post-LayerNorm model, or a layout headscan does not read), in
    one line; None where it is."""
    try:
        _norm_kind(model)
    except ModelLoadError as error:
        return str(error)
    return None


def composition_weights(model) -> tuple[tuple[torch.Tensor, ...], str, int]:
    """((W_Q, W_K, W_V, W_O), rule, d_residual): `model`'s weights as TransformerLens' default processing leaves
    them (see the module docstring), float64; the rule in words (provenance); and the dimension of the space they
    read and write (d_model, or d_model - 1 where centred). A post-LayerNorm model gets a `ModelLoadError`."""
    kind = _norm_kind(model)
    W_Q, W_K, W_V, W_O = _reading_writing(model)
    if kind == "rms":
        return (W_Q, W_K, W_V, W_O), RMS_NORM_RULE, model.d_model
    # new tensors: the model's own are never written
    W_Q, W_K, W_V = (w - w.mean(-2, keepdim=True) for w in (W_Q, W_K, W_V))  # (layer, head, d_model, d_head)
    W_O = W_O - W_O.mean(-1, keepdim=True)  # (layer, head, d_head, d_model)
    return (W_Q, W_K, W_V, W_O), LAYER_NORM_RULE, model.d_model - 1


def _r(matrix: torch.Tensor) -> torch.Tensor:
    """The d_head x d_head triangular factor R of a (..., d_model, d_head) matrix: ``||A X||_F = ||R X||_F`` for
    ``A = Q R``, and ``||X A^T||_F = ||X R^T||_F``."""
    return torch.linalg.qr(matrix, mode="r")[1]


def _factors(W_Q, W_K, W_V, W_O):
    """The triangular factors (R_Q, R_K, R_V, R_O), each (layer, head, d_head, d_head), with ``W_O = R_O^T Q^T``."""
    return _r(W_Q), _r(W_K), _r(W_V), _r(W_O.transpose(-1, -2))


def composition_scores(W_Q, W_K, W_V, W_O) -> dict[str, torch.Tensor]:
    """Per mode, (source layer, source head, layer, head) scores in float64, NaN where the source is not in an
    earlier layer. Arguments as `composition_weights` gives them: W_Q, W_K, W_V (layer, head, d_model, d_head),
    W_O (layer, head, d_head, d_model)."""
    W_Q, W_K, W_V, W_O = (w.detach().double() for w in (W_Q, W_K, W_V, W_O))
    n_layers, n_heads = W_Q.shape[:2]
    R_Q, R_K, R_V, R_O = _factors(W_Q, W_K, W_V, W_O)  # (layer, head, d_head, d_head)
    norm_ov = torch.linalg.matrix_norm(R_V @ R_O.transpose(-1, -2))  # (layer, head) ||W_V W_O||_F
    norm_qk = torch.linalg.matrix_norm(R_Q @ R_K.transpose(-1, -2))  # (layer, head) ||W_Q W_K^T||_F
    # receiver's (inner factor, outer R) per mode: Q: W_V^s (W_O^s W_Q^r) W_K^r^T; K: (W_O^s W_K^r), W_Q^r^T;
    # V: (W_O^s W_V^r), W_O^r
    receivers = {"Q": (W_Q, R_K, norm_qk), "K": (W_K, R_Q, norm_qk), "V": (W_V, R_O, norm_ov)}
    out = {}
    for mode, (inner, outer, norm_r) in receivers.items():
        scores = torch.full((n_layers, n_heads, n_layers, n_heads), float("nan"), dtype=torch.float64)
        for source in range(n_layers - 1):  # a loop over sender layers: each is one batched product
            middle = torch.einsum("hed,lgdf->hlgef", W_O[source], inner[source + 1:])  # (h, l, g, d_head, d_head)
            product = R_V[source][:, None, None] @ middle @ outer[source + 1:][None].transpose(-1, -2)
            norms = torch.linalg.matrix_norm(product)  # (h, l, g)
            scores[source, :, source + 1:] = norms / (norm_ov[source][:, None, None] * norm_r[source + 1:][None])
        out[mode] = scores
    return out


# --- the null ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=128)
def _corner_chunk(d_residual: int, d_head: int, index: int) -> torch.Tensor:
    """(`_CHUNK`, d_head, d_head) squared entries of the top-left d_head x d_head corner of Haar-random orthogonal
    d_residual x d_residual matrices, float32, seeded by (shape, index): the same chunk in every process.

    The corner is the first d_head rows of Q in ``G = Q R`` for a Gaussian d_residual x d_head G: ``G_1 R^{-1}``
    with G_1 its first d_head rows and ``R^T R = G_1^T G_1 + G_2^T G_2``, the second term a Wishart matrix drawn by
    Bartlett's decomposition (Gaussian below the diagonal, square roots of chi-square draws on it), so no
    d_residual-sized matrix is drawn."""
    seed = ((NULL_SEED * 1_000_003 + d_residual) * 1_000_003 + d_head) * 1_000_003 + index
    generator = torch.Generator().manual_seed(seed % (1 << 63))
    rest = d_residual - d_head
    G1 = torch.randn(_CHUNK, d_head, d_head, generator=generator)  # float32: a null needs no more
    if rest >= d_head:  # Bartlett: L L^T ~ Wishart(rest, I) with L_ii^2 ~ chi2(rest - i)
        chi2 = np.random.default_rng([NULL_SEED, d_residual, d_head, index]).chisquare(rest - np.arange(d_head),
                                                                                        (_CHUNK, d_head))
        L = torch.randn(_CHUNK, d_head, d_head, generator=generator).tril(-1) + \
            torch.diag_embed(torch.from_numpy(np.sqrt(chi2)).float())
        gram = G1.transpose(-1, -2) @ G1 + L @ L.transpose(-1, -2)
    else:  # too few other dimensions for Bartlett's form: draw them (a head as wide as half the residual stream)
        G2 = torch.randn(_CHUNK, rest, d_head, generator=generator)
        gram = G1.transpose(-1, -2) @ G1 + G2.transpose(-1, -2) @ G2
    R = torch.linalg.cholesky(gram, upper=True)  # (chunk, d_head, d_head)
    return torch.linalg.solve_triangular(R, G1, upper=True, left=False) ** 2  # (G_1 R^{-1})^2


def haar_corners(d_residual: int, d_head: int, draws: int) -> torch.Tensor:
    """(draws, d_head, d_head) squared entries of the d_head x d_head corners of `draws` Haar-random rotations of a
    d_residual-dimensional space, float32; the first n are the same whatever `draws` is, and each chunk is drawn
    once per process (an in-process cache keyed by the shape).

    >>> c = haar_corners(16, 4, 2048)
    >>> tuple(c.shape), round(float(c.mean()) * 16, 1)  # each squared entry has mean 1/16
    ((2048, 4, 4), 1.0)
    """
    if d_residual < d_head:
        raise ValueError(f"d_residual {d_residual} < d_head {d_head}: a head cannot be wider than the residual stream")
    chunks = [_corner_chunk(d_residual, d_head, i) for i in range(math.ceil(draws / _CHUNK))]
    return torch.cat(chunks)[:draws]


def quantile_se(values: np.ndarray, q: float = NULL_QUANTILE, *, replicates: int = 400, seed: int = 0) -> float:
    """The bootstrap standard error of the `q` quantile (the ceil(q n)-th smallest of n values) of `values`: its
    standard deviation over `replicates` resamples of the n values with replacement.

    A resample's quantile is drawn without drawing the resample: with the values sorted from the largest, it is
    the m-th largest resampled value (m = n - ceil(q n) + 1), whose index is the smallest of m uniform indices of
    n, ``floor(n U_(m))`` with U_(m) the m-th smallest of n uniforms, a Beta(m, n - m + 1) draw.
    """
    values = np.asarray(values, dtype=np.float64)
    n = len(values)
    beyond = n - math.ceil(q * n) + 1  # the quantile is the beyond-th largest
    ordered = -np.sort(-values)
    u = np.random.default_rng(seed).beta(beyond, n - beyond + 1, size=replicates)  # U_(m) of each resample
    return float(ordered[np.minimum((u * n).astype(np.int64), n - 1)].std(ddof=1))


def _spectra(R_left, R_right) -> torch.Tensor:
    """(layer * head, d_head) squared singular values of ``A B^T`` for factors R_left, R_right, each head's summing
    to 1 (NaN where a head's matrix is 0)."""
    s2 = torch.linalg.svdvals(R_left @ R_right.transpose(-1, -2)).flatten(0, 1) ** 2
    return s2 / s2.sum(-1, keepdim=True)


def composition_null(W_Q, W_K, W_V, W_O, d_residual: int, *, draws: int | None = None) -> dict[str, np.ndarray]:
    """Per mode, the scores of the model's own (sender, later receiver) pairs with the residual basis between them
    turned by a Haar-random rotation (see the module docstring): a seeded pair and a cached corner per draw.
    `draws`: how many (None: from `NULL_MIN_DRAWS` on, more until the bootstrap standard error of every mode's
    99th percentile is at most `NULL_SE_TARGET` and `NULL_SE_SHARE` of the null's standard deviation, at most
    `NULL_MAX_DRAWS`)."""
    W_Q, W_K, W_V, W_O = (w.detach().double() for w in (W_Q, W_K, W_V, W_O))
    n_layers, n_heads, _, d_head = W_Q.shape
    R_Q, R_K, R_V, R_O = _factors(W_Q, W_K, W_V, W_O)
    sender = _spectra(R_V, R_O)  # (layer * head, d_head): OV's
    receivers = {"Q": _spectra(R_Q, R_K), "V": sender}  # K's matrix is Q's transposed: the same singular values
    receivers["K"] = receivers["Q"]
    layer = torch.arange(n_layers).repeat_interleave(n_heads)
    usable = ~sender.isnan().any(-1)
    pairs = {}  # per mode: (sender, receiver) of each possible draw, seeded
    for mode in MODES:
        ok = (layer[:, None] < layer[None, :]) & usable[:, None] & ~receivers[mode].isnan().any(-1)[None, :]
        s, r = ok.nonzero(as_tuple=True)  # the model's own pairs
        pick = torch.from_numpy(np.random.default_rng([NULL_SEED, len(s)]).integers(0, len(s), NULL_MAX_DRAWS))
        pairs[mode] = (sender[s[pick]].float(), receivers[mode][r[pick]].float())  # (draw, d_head) each
    out = {mode: np.zeros(0) for mode in MODES}
    n = draws or NULL_MIN_DRAWS
    while True:
        for mode in MODES:
            done = len(out[mode])
            parts = [out[mode]]
            for start in range(done, n, _CHUNK):  # a chunk of cached corners at a time: no (draw, ...) copy of them
                stop = min(n, start + _CHUNK)
                corners = _corner_chunk(d_residual, d_head, start // _CHUNK)[:stop - start]  # (draw, d_head, d_head)
                a, b = (side[start:stop] for side in pairs[mode])
                parts.append(torch.einsum("ti,tij,tj->t", a, corners, b).clamp(min=0).sqrt().double().numpy())
            out[mode] = np.concatenate(parts)
        if draws is not None or n >= NULL_MAX_DRAWS:
            return out
        # how far above its target each mode's standard error is (<= 1: on target)
        worst = max(quantile_se(out[mode]) / min(NULL_SE_TARGET, NULL_SE_SHARE * float(out[mode].std()))
                    for mode in MODES)
        if worst <= 1:
            return out
        n = min(NULL_MAX_DRAWS, _CHUNK * math.ceil(n * 1.3 * worst ** 2 / _CHUNK))


# --- tables -----------------------------------------------------------------------------------------------


def composition_arrays(model, *, draws: int | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """`model`'s scores as one array (mode, source layer, source head, layer, head), modes in `MODES` order, NaN
    where the source is not earlier; the null's draws (mode, draw), both float64; and how the weights were taken
    and the null drawn, in words (provenance). A post-LayerNorm model gets a `ModelLoadError`."""
    matrices, rule, d_residual = composition_weights(model)
    scores = composition_scores(*matrices)
    null = composition_null(*matrices, d_residual, draws=draws)
    about = (f"{rule}; null: {len(null['Q']):,} draws of the model's own pairs with the {d_residual}-dimensional "
             f"residual basis between them turned by a Haar-random rotation (spectra kept)")
    return np.stack([scores[m].numpy() for m in MODES]), np.stack([null[m] for m in MODES]), about


def composition_rows(scores: np.ndarray, null: np.ndarray) -> pd.DataFrame:
    """The rows of `composition_arrays`' output: ``layer, head`` (the receiver), ``mode, source_layer,
    source_head, source_label, value, chance`` (the null's mean), ``null_high`` (its 99th percentile, the
    ceil(0.99 n)-th smallest draw), ``null_se`` (that percentile's bootstrap standard error) and ``beyond``;
    largest first within each mode."""
    parts = []
    for i, mode in enumerate(MODES):
        source_layer, source_head, layer, head = np.nonzero(~np.isnan(scores[i]))
        value = scores[i][source_layer, source_head, layer, head]
        order = np.argsort(-value, kind="stable")
        high = float(np.quantile(null[i], NULL_QUANTILE, method="inverted_cdf"))
        parts.append(pd.DataFrame({
            "layer": layer[order], "head": head[order], "mode": mode, "source_layer": source_layer[order],
            "source_head": source_head[order],
            "source_label": [head_label(a, b) for a, b in zip(source_layer[order], source_head[order])],
            "value": value[order], "chance": float(null[i].mean()), "null_high": high,
            "null_se": quantile_se(null[i]), "beyond": value[order] > high}))
    return pd.concat(parts, ignore_index=True)


def composition_frame(model, *, draws: int | None = None) -> pd.DataFrame:
    """One row per (mode, sender, receiver in a later layer) of `model`: ``model, layer, head, label`` (the
    receiver) and `composition_rows`' columns, largest first within each mode."""
    scores, null, _ = composition_arrays(model, draws=draws)
    rows = composition_rows(scores, null)
    labels = [head_label(a, b) for a, b in zip(rows["layer"], rows["head"])]
    return rows.assign(model=model.name, label=labels)[
        ["model", "layer", "head", "label", "mode", "source_layer", "source_head", "source_label", "value", "chance",
         "null_high", "null_se", "beyond"]]
