"""Composition scores from the weights: how much each head's output can feed a later head's query, key or value
(Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"), with the same score of random matrices
of the same shapes as the null.

For a sender head s in an earlier layer and a receiver head r in a later one, with ``OV_s = W_V^s W_O^s`` and
``QK_r = W_Q^r W_K^r^T`` (d_model x d_model, TransformerLens' layout: rows read the residual stream):

- Q-composition ``||OV_s QK_r||_F / (||OV_s||_F ||QK_r||_F)``: what s writes moves r's queries;
- K-composition ``||OV_s QK_r^T||_F / (...)``: what s writes moves r's keys (a previous-token head feeding an
  induction head, Olsson et al. 2022);
- V-composition ``||OV_s OV_r||_F / (||OV_s||_F ||OV_r||_F)``: what s writes is what r moves.

Each is in [0, 1]. No d_model x d_model matrix is built: with ``W_V^s = Q R_V`` (QR, d_head x d_head ``R_V``) and
likewise for the receiver's outer factor, the Frobenius norm of ``W_V^s (W_O^s W^r) W'^r^T`` is that of
``R_V (W_O^s W^r) R'^T`` (orthonormal factors keep it), a d_head x d_head product per pair.

The null is the score of Gaussian matrices of the same shapes (the score does not depend on their scale), drawn
`NULL_DRAWS` times with a fixed seed per shape: its mean (``chance``), and ``null_high`` its 99th percentile. Pre-attention
norm gains are folded into W_Q, W_K and W_V as `headscan.models.weights` folds them; rotary position embeddings
are left out (the score reads the weights as TransformerLens' ``all_composition_scores`` does).

This module reads weights; it runs no forward pass and reads no corpus.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..tables import head_label
from .hooks import backbone
from .weights import _family, _linear_in, _pre_attention_norms, head_weights

__all__ = ["MODES", "NULL_DRAWS", "head_qk", "composition_scores", "composition_null", "composition_arrays",
           "composition_rows", "composition_frame"]

MODES = ("Q", "K", "V")
NULL_DRAWS = 200
NULL_QUANTILE = 0.99


def head_qk(model, *, fold_norms: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(W_Q, W_K), each (layer, head, d_model, d_head) per query head (grouped key heads repeated), read from the
    Hugging Face modules of a BERT-, GPT-2- or Llama-style model; the pre-attention norm gain folded in."""
    hf_model = model.hf_model
    family = _family(hf_model)
    body = backbone(hf_model)
    n_heads, n_kv, d_model = model.n_heads, model.n_kv_heads, model.d_model
    W_Q, W_K = [], []
    with torch.no_grad():
        if family == "bert":
            for layer in body.encoder.layer:
                W_Q.append(_linear_in(layer.attention.self.query, n_heads)[0])
                W_K.append(_linear_in(layer.attention.self.key, n_heads)[0])
        elif family == "gpt2":
            for block in body.h:
                weight = block.attn.c_attn.weight  # Conv1D: x @ W, columns [q | k | v]
                W_Q.append(weight[:, :d_model].reshape(d_model, n_heads, -1).transpose(0, 1))
                W_K.append(weight[:, d_model:2 * d_model].reshape(d_model, n_heads, -1).transpose(0, 1))
        elif family == "llama":
            for layer in body.layers:
                W_Q.append(_linear_in(layer.self_attn.q_proj, n_heads)[0])
                key = _linear_in(layer.self_attn.k_proj, n_kv)[0]
                W_K.append(key.repeat_interleave(n_heads // n_kv, dim=0))
        else:
            head_weights(model)  # its ModelLoadError says which layouts are read
        W_Q, W_K = torch.stack(W_Q), torch.stack(W_K)
        norms = _pre_attention_norms(hf_model, family) if fold_norms else None
        if norms is not None:
            gain = norms[0][:, None, :, None]  # (layer, 1, d_model, 1)
            W_Q, W_K = gain * W_Q, gain * W_K
    return W_Q, W_K


def _r(matrix: torch.Tensor) -> torch.Tensor:
    """The d_head x d_head triangular factor R of a (..., d_model, d_head) matrix: ``||A X||_F = ||R X||_F`` for
    ``A = Q R``, and ``||X A^T||_F = ||X R^T||_F``."""
    return torch.linalg.qr(matrix, mode="r")[1]


def composition_scores(W_Q, W_K, W_V, W_O) -> dict[str, torch.Tensor]:
    """Per mode, (source layer, source head, layer, head) scores in float64, NaN where the source is not in an
    earlier layer. Arguments as `head_qk` and `headscan.models.weights.HeadWeights` give them: W_Q, W_K, W_V
    (layer, head, d_model, d_head), W_O (layer, head, d_head, d_model)."""
    W_Q, W_K, W_V, W_O = (w.detach().double() for w in (W_Q, W_K, W_V, W_O))
    n_layers, n_heads = W_Q.shape[:2]
    R_Q, R_K, R_V = _r(W_Q), _r(W_K), _r(W_V)  # (layer, head, d_head, d_head)
    R_O = _r(W_O.transpose(-1, -2))  # W_O = R_O^T Q^T: ||X W_O|| = ||X R_O^T||
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


def composition_null(d_model: int, d_head: int, *, draws: int = NULL_DRAWS, seed: int = 0) -> dict[str, np.ndarray]:
    """Per mode, `draws` scores of a sender and a receiver whose W_Q, W_K, W_V, W_O are standard Gaussian
    matrices of these shapes (a fixed seed per shape, so every run gives the same null). Each draw is one
    matched pair, all drawn at once: (draw, ...) batches of the products `composition_scores` takes."""
    generator = torch.Generator().manual_seed(seed + 1_000_003 * d_model + d_head)

    def gaussian(*shape):
        return torch.randn(draws, *shape, generator=generator, dtype=torch.float64)

    V_s, O_s = gaussian(d_model, d_head), gaussian(d_head, d_model)  # the sender's
    Q_r, K_r, V_r, O_r = gaussian(d_model, d_head), gaussian(d_model, d_head), gaussian(d_model, d_head), \
        gaussian(d_head, d_model)  # the receiver's
    R_V, R_Q, R_K, R_O = _r(V_s), _r(Q_r), _r(K_r), _r(O_r.transpose(-1, -2))
    norm_ov_s = torch.linalg.matrix_norm(R_V @ _r(O_s.transpose(-1, -2)).transpose(-1, -2))  # (draw,)
    norm_qk = torch.linalg.matrix_norm(R_Q @ R_K.transpose(-1, -2))
    norm_ov_r = torch.linalg.matrix_norm(_r(V_r) @ R_O.transpose(-1, -2))
    receivers = {"Q": (Q_r, R_K, norm_qk), "K": (K_r, R_Q, norm_qk), "V": (V_r, R_O, norm_ov_r)}
    out = {}
    for mode, (inner, outer, norm_r) in receivers.items():
        product = R_V @ (O_s @ inner) @ outer.transpose(-1, -2)  # (draw, d_head, d_head)
        out[mode] = (torch.linalg.matrix_norm(product) / (norm_ov_s * norm_r)).numpy()
    return out


def composition_arrays(model, weights=None, *, draws: int = NULL_DRAWS) -> tuple[np.ndarray, np.ndarray]:
    """`model`'s scores as one array (mode, source layer, source head, layer, head), modes in `MODES` order, NaN
    where the source is not earlier, and the null's draws (mode, draw), both float64. `weights`: the model's
    `HeadWeights` where already read (a sweep reads them once per model), else read here."""
    W_Q, W_K = head_qk(model)
    weights = head_weights(model) if weights is None else weights
    scores = composition_scores(W_Q, W_K, weights.W_V, weights.W_O)
    null = composition_null(model.d_model, W_Q.shape[-1], draws=draws)
    return np.stack([scores[m].numpy() for m in MODES]), np.stack([null[m] for m in MODES])


def composition_rows(scores: np.ndarray, null: np.ndarray) -> pd.DataFrame:
    """The rows of `composition_arrays`' output: ``layer, head`` (the receiver), ``mode, source_layer,
    source_head, source_label, value, chance`` (the null's mean), ``null_high`` (its 99th percentile) and
    ``beyond``; largest first within each mode."""
    parts = []
    for i, mode in enumerate(MODES):
        source_layer, source_head, layer, head = np.nonzero(~np.isnan(scores[i]))
        value = scores[i][source_layer, source_head, layer, head]
        order = np.argsort(-value, kind="stable")
        high = float(np.quantile(null[i], NULL_QUANTILE))
        parts.append(pd.DataFrame({
            "layer": layer[order], "head": head[order], "mode": mode, "source_layer": source_layer[order],
            "source_head": source_head[order],
            "source_label": [head_label(a, b) for a, b in zip(source_layer[order], source_head[order])],
            "value": value[order], "chance": float(null[i].mean()), "null_high": high,
            "beyond": value[order] > high}))
    return pd.concat(parts, ignore_index=True)


def composition_frame(model, *, draws: int = NULL_DRAWS) -> pd.DataFrame:
    """One row per (mode, sender, receiver in a later layer) of `model`: ``model, layer, head, label`` (the
    receiver) and `composition_rows`' columns, largest first within each mode."""
    rows = composition_rows(*composition_arrays(model, draws=draws))
    labels = [head_label(a, b) for a, b in zip(rows["layer"], rows["head"])]
    return rows.assign(model=model.name, label=labels)[
        ["model", "layer", "head", "label", "mode", "source_layer", "source_head", "source_label", "value", "chance",
         "null_high", "beyond"]]
