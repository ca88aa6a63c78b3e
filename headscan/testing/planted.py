"""Checkpoints with planted heads: attention patterns known exactly, whatever the text.

`build_planted_checkpoint` writes a small GPT-2 or BERT whose layer-0 heads are set by hand to attend to the
previous token, the next token (BERT only), the first token, or two tokens back; every other head keeps its
random weights. A metric that scores the planted heads near 1 and the random ones low passes a check with a
known answer. Nothing here scores heads: that is headscan's job.

How the heads are planted (all in layer 0, so the attention input is just token + position embeddings):

- The residual stream is split into a position block and a token block. Position embeddings fill only the
  position block, with 8 sinusoids ``(cos wp, sin wp)``, each stored with its negation so the block sums to 0,
  and a 4-dim flag saying "position 0" or "not position 0". Token embeddings fill only the token block, with
  zero mean and a fixed norm. Every embedding then has mean 0 and the same norm, so the LayerNorm before
  attention is an exact, constant scaling and the planted heads see positions only.
- An offset-``d`` head's W_Q rotates each sinusoid of the query by ``w d`` and W_K copies the key's, so the
  score of query ``q`` for key ``k`` is ``beta * sum_w cos(w (q + d - k))``: largest at ``k = q + d`` by a
  margin that ``beta`` turns into a sharp softmax (the other keys share less than 1e-5 of the attention).
- The first-token head matches a constant query to the "position 0" flag of the key.
"""

from __future__ import annotations

import pathlib

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

from headscan.testing.checkpoints import ARCHS, build_tiny_checkpoint

# Planted heads of layer 0, by metric name; head 3 of GPT-2's layer 0 stays random.
PLANTED_HEADS = {
    "gpt2": {"prev_token": 0, "first_token": 1, "offset_-2": 2},
    "bert": {"prev_token": 0, "next_token": 1, "first_token": 2, "offset_-2": 3},
}
_OFFSETS = {"prev_token": -1, "next_token": 1, "offset_-2": -2}

_D_MODEL, _N_HEADS = 64, 4
_D_HEAD = _D_MODEL // _N_HEADS
_N_FREQ = _D_HEAD // 2  # one (cos, sin) pair of query/key dimensions per frequency
_SIN = slice(0, 4 * _N_FREQ)  # +cos of each frequency, then +sin, -cos, -sin
_FLAG = 4 * _N_FREQ  # +first, -first, +rest, -rest
N_POS_DIMS = 4 * _N_FREQ + 4
MARGIN = 16.0  # logit gap between the planted key and its closest rival: they get < e^-16 each


def build_planted_checkpoint(
    path,
    arch: str = "gpt2",
    *,
    n_layers: int = 2,
    max_positions: int = 256,
    seed: int = 0,
) -> tuple[pathlib.Path, dict[str, tuple[int, int]]]:
    """Write a small GPT-2 or BERT checkpoint (64 wide, 4 heads a layer) with planted heads in layer 0.

    Planted heads put more than 0.999 of each query's attention on their key, on any text:

    - ``"prev_token"``: key ``q - 1``, for ``q >= 1``;
    - ``"next_token"`` (BERT only): key ``q + 1``, where that key is not padding;
    - ``"first_token"``: key 0;
    - ``"offset_-2"``: key ``q - 2``, for ``q >= 2``.

    Positions count from the start of the row, so pad batches on the right (BERT's and GPT-2's default
    ``padding_side``) for "first token" to be the first real token. The other heads keep random weights.

    Parameters
    ----------
    path : str or os.PathLike
        Folder to write the checkpoint and tokenizer into; created if missing.
    arch : {"gpt2", "bert"}
        Causal ``GPT2LMHeadModel`` or bidirectional ``BertForMaskedLM``.
    n_layers : int
        Number of layers, at least 1. Default 2.
    max_positions : int
        Number of learned positions, the longest input. Default 256.
    seed : int
        Seed for the random weights of the other heads and of the token embeddings.

    Returns
    -------
    path : pathlib.Path
        The folder written.
    heads : dict of str to (int, int)
        Metric name to ``(layer, head)``, 0-indexed.

    Examples
    --------
    >>> import tempfile
    >>> folder, heads = build_planted_checkpoint(tempfile.mkdtemp(), "bert", n_layers=1)
    >>> heads
    {'prev_token': (0, 0), 'next_token': (0, 1), 'first_token': (0, 2), 'offset_-2': (0, 3)}
    """
    if arch not in ARCHS:
        raise ValueError(f"arch={arch!r} is not one of {ARCHS}")
    if n_layers < 1:
        raise ValueError(f"n_layers={n_layers} must be at least 1")
    path = build_tiny_checkpoint(
        path, arch, n_layers=n_layers, n_heads=_N_HEADS, d_model=_D_MODEL, max_positions=max_positions, seed=seed
    )
    model_class = AutoModelForCausalLM if arch == "gpt2" else AutoModelForMaskedLM
    model = model_class.from_pretrained(path)
    with torch.no_grad():
        _plant(model, arch, max_positions, seed)
    model.save_pretrained(path)
    return path, {name: (0, head) for name, head in PLANTED_HEADS[arch].items()}


def _plant(model, arch: str, n_pos: int, seed: int) -> None:
    """Overwrite embeddings, the layer-0 LayerNorm and the planted heads' W_Q, W_K (in place)."""
    if arch == "gpt2":
        body = model.transformer
        word, position, ln = body.wte.weight, body.wpe.weight, body.h[0].ln_1
    else:
        body = model.bert.embeddings
        word, position, ln = body.word_embeddings.weight, body.position_embeddings.weight, body.LayerNorm
        body.token_type_embeddings.weight.zero_()  # would break the fixed norm of every embedding
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randn(word.shape[0], _D_MODEL - N_POS_DIMS, generator=generator)
    tokens -= tokens.mean(1, keepdim=True)
    tokens *= (_D_MODEL - N_POS_DIMS) ** 0.5 / tokens.norm(dim=1, keepdim=True)  # per-dim variance 1
    word.zero_()
    word[:, N_POS_DIMS:] = tokens
    omega = np.geomspace(np.pi / n_pos, 2.9, _N_FREQ)  # periods from 2 positions to 2 * n_pos
    position.copy_(position_codes(n_pos, omega))
    ln.weight.fill_(1.0)
    ln.bias.zero_()

    # The LayerNorm divides every embedding by the same std: fold it into W_Q and W_K.
    norm2 = 2 * _N_FREQ + 2 + (_D_MODEL - N_POS_DIMS)
    scale2 = 1.0 / (norm2 / _D_MODEL + ln.eps)
    beta = MARGIN / sinusoid_gap(omega, n_pos)
    for name, head in PLANTED_HEADS[arch].items():
        if name == "first_token":
            w_q, w_k = _first_token_qk(alpha=((MARGIN + np.log(n_pos)) * _D_HEAD**0.5 / scale2) ** 0.5)
        else:
            w_q, w_k = offset_qk(omega, _OFFSETS[name], alpha=(beta * _D_HEAD**0.5 / scale2) ** 0.5)
        _set_qk(model, arch, head, w_q, w_k)


def position_codes(n_pos: int, omega: np.ndarray, d_model: int = _D_MODEL) -> torch.Tensor:
    """Position embeddings: sinusoids and the first-position flag in the position block, zeros elsewhere."""
    pos = np.arange(n_pos)[:, None]
    codes = np.zeros((n_pos, d_model))  # (pos, d_model)
    waves = np.concatenate([np.cos(omega * pos), np.sin(omega * pos)], axis=1)  # (pos, 2 * n_freq)
    codes[:, _SIN] = np.concatenate([waves, -waves], axis=1)
    first = (pos[:, 0] == 0).astype(float)
    codes[:, _FLAG : _FLAG + 4] = np.stack([first, -first, 1 - first, first - 1], axis=1)
    return torch.tensor(codes, dtype=torch.float32)


def sinusoid_gap(omega: np.ndarray, n_pos: int) -> float:
    """How far ``sum_w cos(w * delta)`` stays below its peak (at delta 0) for every other reachable delta."""
    delta = np.arange(1, n_pos + 1)[:, None]
    return float(len(omega) - np.cos(omega * delta).sum(1).max())


def offset_qk(omega: np.ndarray, offset: int, alpha: float, d_model: int = _D_MODEL,
               d_head: int = _D_HEAD) -> tuple[torch.Tensor, torch.Tensor]:
    """W_Q, W_K (d_model, d_head) whose scores peak at key ``q + offset``: W_Q rotates by ``omega * offset``."""
    w_q, w_k = torch.zeros(d_model, d_head), torch.zeros(d_model, d_head)
    for f, w in enumerate(omega):
        cos, sin = f, _N_FREQ + f  # residual dims of +cos(w p) and +sin(w p)
        c, s = np.cos(w * offset), np.sin(w * offset)
        # cos(w (q + d)) = cos(wq) c - sin(wq) s and sin(w (q + d)) = sin(wq) c + cos(wq) s
        w_q[cos, 2 * f], w_q[sin, 2 * f] = alpha * c, -alpha * s
        w_q[sin, 2 * f + 1], w_q[cos, 2 * f + 1] = alpha * c, alpha * s
        w_k[cos, 2 * f], w_k[sin, 2 * f + 1] = alpha, alpha
    return w_q, w_k


def _first_token_qk(alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """W_Q, W_K (d_model, d_head): a query that is the same at every position meets key 0's flag."""
    w_q, w_k = torch.zeros(_D_MODEL, _D_HEAD), torch.zeros(_D_MODEL, _D_HEAD)
    w_q[_FLAG, 0] = w_q[_FLAG + 2, 0] = alpha  # "first" + "rest" = 1 at every position
    w_k[_FLAG, 0] = alpha
    return w_q, w_k


def _set_qk(model, arch: str, head: int, w_q: torch.Tensor, w_k: torch.Tensor) -> None:
    """Write one head's W_Q, W_K (d_model, d_head) into the model's layer 0, with zero q and k biases."""
    cols = slice(head * _D_HEAD, (head + 1) * _D_HEAD)
    if arch == "gpt2":
        # Conv1D computes x @ W + b; c_attn stacks [q | k | v] along its (d_model, 3 * d_model) columns.
        attn = model.transformer.h[0].attn.c_attn
        for third, w in ((0, w_q), (1, w_k)):
            part = slice(third * _D_MODEL + cols.start, third * _D_MODEL + cols.stop)
            attn.weight[:, part] = w
            attn.bias[part] = 0.0
    else:
        # nn.Linear computes x @ W.T + b, so its weight is (out, in).
        attn = model.bert.encoder.layer[0].attention.self
        for linear, w in ((attn.query, w_q), (attn.key, w_k)):
            linear.weight[cols, :] = w.T
            linear.bias[cols] = 0.0


# --- heads with a known OV circuit ----------------------------------------------------------------------------

# Planted OV heads of layer 0 of `build_ov_checkpoint`, by the copying score they must get.
OV_HEADS = {"copying": 0, "anti_copying": 1}


def build_ov_checkpoint(path, *, tied: bool = True, n_layers: int = 1, seed: int = 0):
    """Write a tiny GPT-2 (32 wide, 4 heads of 8) whose layer-0 heads 0 and 1 have a known OV circuit.

    Head 0's ``W_V W_O`` is ``P = U U.T``, the orthogonal projection onto a random 8-dim subspace (W_V = U,
    W_O = U.T, U with orthonormal columns); head 1's is ``-P'`` for another such projection. The gains of the
    norms around them (layer 0's ``ln_1`` and the final ``ln_f``) are set to 1 and their biases to 0, so
    folding them changes nothing. With tied embeddings the full OV circuit of head 0 is ``W_E P W_E.T``,
    positive semi-definite: every eigenvalue is real and >= 0, so its copying score is exactly 1; head 1's is
    ``-W_E P' W_E.T``, exactly -1. The other heads keep random weights (scores strictly inside (-1, 1)).

    Parameters
    ----------
    path : str or os.PathLike
        Folder to write into; created if missing.
    tied : bool
        Tie the unembedding to the embedding (GPT-2's default). With False the checkpoint gets an
        ``lm_head`` of its own (random), and the scores above no longer hold.
    n_layers : int
        Number of layers, at least 1. Default 1.
    seed : int
        Seed for the random weights and subspaces.

    Returns
    -------
    path : pathlib.Path
        The folder written.
    heads : dict of str to (int, int)
        ``{"copying": (0, 0), "anti_copying": (0, 1)}``.
    """
    path = build_tiny_checkpoint(path, "gpt2", n_layers=n_layers, n_heads=4, d_model=32, seed=seed)
    model = AutoModelForCausalLM.from_pretrained(path, tie_word_embeddings=tied)
    generator = torch.Generator().manual_seed(seed + 1)
    body, d_model, n_heads = model.transformer, 32, 4
    d_head = d_model // n_heads
    with torch.no_grad():
        if not tied:
            model.lm_head.weight = torch.nn.Parameter(torch.randn(model.lm_head.weight.shape, generator=generator))
        for norm in (body.h[0].ln_1, body.ln_f):
            norm.weight.fill_(1.0)
            norm.bias.zero_()
        attn = body.h[0].attn
        for head, sign in ((OV_HEADS["copying"], 1.0), (OV_HEADS["anti_copying"], -1.0)):
            basis, _ = torch.linalg.qr(torch.randn(d_model, d_head, generator=generator))  # (d_model, d_head)
            cols = slice(head * d_head, (head + 1) * d_head)
            # Conv1D computes x @ W + b: c_attn's value third is (d_model, d_model), c_proj is (d_model, d_model).
            attn.c_attn.weight[:, 2 * d_model + cols.start : 2 * d_model + cols.stop] = basis
            attn.c_attn.bias[2 * d_model + cols.start : 2 * d_model + cols.stop] = 0.0
            attn.c_proj.weight[cols, :] = sign * basis.T
    model.config.tie_word_embeddings = tied
    model.save_pretrained(path)
    return path, {name: (0, head) for name, head in OV_HEADS.items()}


# --- a head that copies from the needle -----------------------------------------------------------------------

RETRIEVAL_HEAD = (0, 0)  # the copying head of `build_retrieval_checkpoint`


def build_retrieval_checkpoint(path, chain, *, max_positions: int = 512, seed: int = 0, through_head: bool = False):
    """Write a one-layer GPT-2 (64 wide, 4 heads of 16) that decodes along `chain` and whose head 0 copies it.

    `chain` is a list of distinct token ids (at most 16 links). Greedy decoding after a prompt that ends with
    ``chain[0]`` generates ``chain[1]``, then ``chain[2]``, ... up to ``chain[-1]``: the LM head reads each
    chain token's embedding as a logit for the next one, and nothing else reaches the logits (every head's
    output projection and the MLP's are 0). Head 0 of layer 0 attends from each chain token to the keys
    holding the next one, by content alone (no position embeddings): on a prompt that holds ``chain[1:-1]``
    once, in a needle, its most-attended key at each step is the needle token just generated, so its
    retrieval score is 1 (the step that generates ``chain[-1]``, a newline say, finds it outside the needle).
    The other heads keep random queries and keys.

    With `through_head`, the answer reaches the logits only through head 0's output: its values and output
    projection carry the attended chain token's direction (twice the current token's), and the LM head reads each
    chain token's direction as a logit for that same token. Decoding then follows the chain only while head 0
    copies it; with head 0's output removed, the model repeats ``chain[0]``. The other heads' outputs stay 0.

    Chain tokens get orthonormal embedding directions, and every other token's embedding is made orthogonal
    to them, with mean 0 and the norm of the rest, so the LayerNorms are an exact constant scaling.

    Returns
    -------
    path : pathlib.Path
    head : (int, int)
        ``RETRIEVAL_HEAD``, the copying head.
    """
    chain = [int(token) for token in chain]
    if len(set(chain)) != len(chain) or not 2 <= len(chain) <= _D_HEAD + 1:
        raise ValueError(f"chain must hold 2 to {_D_HEAD + 1} distinct token ids, got {chain}")
    path = build_tiny_checkpoint(path, "gpt2", n_layers=1, n_heads=_N_HEADS, d_model=_D_MODEL,
                                 max_positions=max_positions, seed=seed)
    model = AutoModelForCausalLM.from_pretrained(path, tie_word_embeddings=False)
    generator = torch.Generator().manual_seed(seed + 2)
    body = model.transformer
    with torch.no_grad():
        # orthonormal directions for the chain tokens, orthogonal to the all-ones vector (LayerNorm's mean)
        basis, _ = torch.linalg.qr(torch.cat([torch.ones(_D_MODEL, 1), torch.randn(_D_MODEL, len(chain),
                                                                                     generator=generator)], 1))
        directions = basis[:, 1:].T  # (chain, d_model)
        norm = _D_MODEL ** 0.5
        others = torch.randn(body.wte.weight.shape, generator=generator)
        others -= others.mean(1, keepdim=True)
        others -= (others @ directions.T) @ directions  # nothing of the chain's directions
        others *= norm / others.norm(dim=1, keepdim=True)
        others[chain] = directions * norm
        body.wte.weight.copy_(others)
        body.wpe.weight.zero_()
        for norm_layer in (body.h[0].ln_1, body.ln_f):
            norm_layer.weight.fill_(1.0)
            norm_layer.bias.zero_()
        attn = body.h[0].attn
        attn.c_attn.weight[:, 2 * _D_MODEL:] = 0.0  # values: nothing moves through attention
        attn.c_attn.bias.zero_()
        attn.c_proj.weight.zero_()
        attn.c_proj.bias.zero_()
        body.h[0].mlp.c_proj.weight.zero_()
        body.h[0].mlp.c_proj.bias.zero_()
        # head 0: the query of chain[i] meets the key of chain[i + 1], with a margin of 32 logits
        w_q, w_k = torch.zeros(_D_MODEL, _D_HEAD), torch.zeros(_D_MODEL, _D_HEAD)
        for i in range(len(chain) - 1):
            w_q[:, i], w_k[:, i] = directions[i], directions[i + 1]
        # LayerNorm leaves a chain token's row as its direction times sqrt(d_model): scores come out at 32
        scale = (32.0 * _D_HEAD ** 0.5 / _D_MODEL) ** 0.5
        cols = slice(RETRIEVAL_HEAD[1] * _D_HEAD, (RETRIEVAL_HEAD[1] + 1) * _D_HEAD)
        attn.c_attn.weight[:, cols] = w_q * scale
        attn.c_attn.weight[:, _D_MODEL + cols.start: _D_MODEL + cols.stop] = w_k * scale
        model.lm_head.weight.zero_()
        if through_head:
            _copy_through(attn, model.lm_head, chain, directions, cols)
        else:
            # the LM head: chain[i]'s direction is a logit of 32 for chain[i + 1]; every other logit is 0
            for i in range(len(chain) - 1):
                model.lm_head.weight[chain[i + 1]] = directions[i] * 32.0 / _D_MODEL ** 0.5
    model.config.tie_word_embeddings = False
    model.save_pretrained(path)
    return path, RETRIEVAL_HEAD


def _copy_through(attn, lm_head, chain, directions: torch.Tensor, cols: slice) -> None:
    """Head 0's value j holds chain[j + 1]'s direction, and its output writes it back at twice the current token's
    size; the LM head reads each chain direction as a logit for its own token (a chain token's LayerNormed row is
    its direction times sqrt(d_model), so value j is 1 on the key chain[j + 1] and 0 on every other token)."""
    norm = _D_MODEL ** 0.5
    for j in range(len(chain) - 1):
        attn.c_attn.weight[:, 2 * _D_MODEL + cols.start + j] = directions[j + 1] / norm
        attn.c_proj.weight[cols.start + j] = directions[j + 1] * 2.0 * norm  # Conv1D: weight (in, out)
    for i, token in enumerate(chain):
        lm_head.weight[token] = directions[i] * 32.0 / norm
