"""A checkpoint with a planted induction circuit: a previous-token head that K-composes with an induction head.

`build_circuit_checkpoint` writes a two-layer GPT-2 (128 wide, 4 heads of 32, MLPs off) where:

- **L0H0** attends from each token to the one before it and copies that token's identity into a "previous
  token" block of the residual stream;
- **L1H0** is an induction head: its query reads the current token, its key reads the previous-token block, so
  on ``... a b ... a`` the second ``a`` attends to ``b``; its output writes ``b``'s identity where the (tied)
  unembedding reads it, so the model predicts ``b``;
- the other six heads are distractors: random queries, keys and values, whose outputs land in a block nothing
  reads (only the LayerNorms' scale sees them).

So on a pair such as clean ``w1 w2 w3 w4 w5 w2`` (answer ``w3``) against corrupted ``w1 w6 w3 w4 w5 w2`` (no
earlier ``w2``), the known answers are: patching L0H0 or L1H0 restores the logit difference and no other head
does; the only path that carries it is L0H0 -> L1H0 through L1H0's keys; and L0H0 -> L1H0 is the pair with the
largest K-composition. Nothing here patches or scores heads: that is headscan's job.

Residual stream blocks (the embeddings have mean 0 and fixed norms, so each LayerNorm is close to a scaling):
positions [0, 36) as in `headscan.testing.planted` (sinusoids and a first-position flag), token identity
[36, 68), previous token [68, 100), the distractors' block [100, 128).
"""

from __future__ import annotations

import pathlib

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from headscan.testing.checkpoints import build_tiny_checkpoint
from headscan.testing.planted import MARGIN, N_POS_DIMS, offset_qk, position_codes, sinusoid_gap

# The planted heads, (layer, head), 0-indexed.
PREVIOUS_TOKEN_HEAD, INDUCTION_HEAD = (0, 0), (1, 0)

_D_MODEL, _N_HEADS, _D_HEAD = 128, 4, 32
_TOKEN = slice(N_POS_DIMS, N_POS_DIMS + 32)
_PREVIOUS = slice(_TOKEN.stop, _TOKEN.stop + 32)
_DISTRACTOR = slice(_PREVIOUS.stop, _D_MODEL)
_N_FREQ = 8  # as `headscan.testing.planted` lays out the position block
_INDUCTION_SCALE2 = 4.0  # alpha^2 of the induction head's W_Q, W_K: a match leads any other key by > 12 logits


def build_circuit_checkpoint(path, *, max_positions: int = 64, seed: int = 0,
                             distractor_scale: float = 0.05) -> tuple[pathlib.Path, dict[str, tuple[int, int]]]:
    """Write the planted-circuit GPT-2 into `path` (created if missing).

    Parameters
    ----------
    path : str or os.PathLike
    max_positions : int
        Context length; the previous-token head is exact up to it.
    seed : int
        Seed of the token identities and of the distractors' weights.
    distractor_scale : float
        Standard deviation of the distractors' weights.

    Returns
    -------
    path : pathlib.Path
    heads : dict
        ``{"previous_token": (0, 0), "induction": (1, 0)}``.
    """
    path = build_tiny_checkpoint(path, "gpt2", n_layers=2, n_heads=_N_HEADS, d_model=_D_MODEL,
                                 max_positions=max_positions, seed=seed)
    model = AutoModelForCausalLM.from_pretrained(path, tie_word_embeddings=True)
    generator = torch.Generator().manual_seed(seed + 3)
    with torch.no_grad():
        _zero_all(model)
        scale0 = _embed(model, max_positions, generator)
        omega = np.geomspace(np.pi / max_positions, 2.9, _N_FREQ)
        _previous_token_head(model, omega, max_positions, scale0)
        _induction_head(model)
        _distractors(model, generator, distractor_scale)
    model.config.tie_word_embeddings = True
    model.save_pretrained(path)
    return path, {"previous_token": PREVIOUS_TOKEN_HEAD, "induction": INDUCTION_HEAD}


def _zero_all(model) -> None:
    """Every weight 0 but the LayerNorms (gain 1, bias 0): MLPs and unset heads then add nothing."""
    for name, parameter in model.named_parameters():
        if ".ln_" in name or name.startswith("transformer.ln_f"):
            parameter.copy_(torch.ones_like(parameter) if name.endswith("weight") else torch.zeros_like(parameter))
        else:
            parameter.zero_()


def _embed(model, n_pos: int, generator) -> float:
    """Token identities (mean 0, norm sqrt(32)) and position codes; returns layer 0's LayerNorm gain."""
    body = model.transformer
    tokens = torch.randn(body.wte.weight.shape[0], _TOKEN.stop - _TOKEN.start, generator=generator)
    tokens -= tokens.mean(1, keepdim=True)
    tokens *= (_TOKEN.stop - _TOKEN.start) ** 0.5 / tokens.norm(dim=1, keepdim=True)
    body.wte.weight[:, _TOKEN] = tokens  # tied: the unembedding reads the same block
    body.wpe.weight.copy_(position_codes(n_pos, np.geomspace(np.pi / n_pos, 2.9, _N_FREQ), _D_MODEL))
    norm2 = 2 * _N_FREQ + 2 + (_TOKEN.stop - _TOKEN.start)  # every embedding's squared norm
    return (norm2 / _D_MODEL + body.h[0].ln_1.eps) ** -0.5


def _attention(model, layer: int, head: int, w_q=None, w_k=None, w_v=None, w_o=None) -> None:
    """Set one head's W_Q, W_K, W_V (d_model, d_head) and W_O (d_head, d_model); Conv1D computes x @ W + b."""
    attn = model.transformer.h[layer].attn
    cols = slice(head * _D_HEAD, (head + 1) * _D_HEAD)
    for third, w in enumerate((w_q, w_k, w_v)):
        if w is not None:
            attn.c_attn.weight[:, third * _D_MODEL + cols.start: third * _D_MODEL + cols.stop] = w
    if w_o is not None:
        attn.c_proj.weight[cols, :] = w_o


def _previous_token_head(model, omega, n_pos: int, scale0: float) -> None:
    """L0H0: keys one position back (the planted offset head), values the token block, output the previous block."""
    beta = MARGIN / sinusoid_gap(omega, n_pos)
    w_q, w_k = offset_qk(omega, -1, alpha=(beta * _D_HEAD**0.5 / scale0**2) ** 0.5, d_model=_D_MODEL,
                          d_head=_D_HEAD)
    width = _TOKEN.stop - _TOKEN.start
    w_v = torch.zeros(_D_MODEL, _D_HEAD)
    w_v[_TOKEN, :width] = torch.eye(width)
    w_o = torch.zeros(_D_HEAD, _D_MODEL)
    w_o[:width, _PREVIOUS] = torch.eye(width) / scale0  # undo the LayerNorm's gain: the block holds the identity
    _attention(model, 0, 0, w_q, w_k, w_v, w_o)


def _induction_head(model) -> None:
    """L1H0: query = current token, key = previous-token block (K-composition with L0H0); output copies the
    attended token's identity into the token block, where the tied unembedding reads it."""
    width = _TOKEN.stop - _TOKEN.start
    alpha = _INDUCTION_SCALE2**0.5
    w_q, w_k, w_v = (torch.zeros(_D_MODEL, _D_HEAD) for _ in range(3))
    w_q[_TOKEN, :width] = alpha * torch.eye(width)
    w_k[_PREVIOUS, :width] = alpha * torch.eye(width)
    w_v[_TOKEN, :width] = torch.eye(width)
    w_o = torch.zeros(_D_HEAD, _D_MODEL)
    w_o[:width, _TOKEN] = 4.0 * torch.eye(width)  # a strong vote for the copied token
    _attention(model, 1, 0, w_q, w_k, w_v, w_o)


def _distractors(model, generator, scale: float) -> None:
    """Heads 1-3 of both layers: random queries, keys and values; outputs only into the distractors' block."""
    width = _DISTRACTOR.stop - _DISTRACTOR.start
    for layer in range(2):
        for head in range(1, _N_HEADS):
            w_q, w_k, w_v = (scale * torch.randn(_D_MODEL, _D_HEAD, generator=generator) for _ in range(3))
            w_o = torch.zeros(_D_HEAD, _D_MODEL)
            w_o[:, _DISTRACTOR] = scale * torch.randn(_D_HEAD, width, generator=generator)
            _attention(model, layer, head, w_q, w_k, w_v, w_o)
