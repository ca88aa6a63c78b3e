"""Each head's weights, read from a loaded model, and the scores that need no corpus: the OV copying score.

`head_weights` reads, for every layer and query head, the value and output weights in TransformerLens'
convention (``x W_V + b_V``, ``z W_O``), with the embedding and unembedding. It takes them from the
TransformerBridge when the model has one (``W_V``, ``W_O``, ``b_V``, ``W_E``, ``W_U`` of
``bridge.blocks[L].attn`` and the bridge), else from the Hugging Face modules of a BERT-, GPT-2- or
Llama-style model (Mistral, Qwen2, ... share Llama's module names). Grouped key/value heads are repeated so
that query head h holds the key/value head it reads (``h // (n_heads // n_kv_heads)``, as in Llama).

Norm gains are folded in, as TransformerLens' ``fold_ln`` does: the gain (and, for LayerNorm, the bias) of
the norm before attention goes into W_V and b_V (GPT-2, Llama: pre-norm); the final norm's gain goes into
W_U. BERT is post-norm: its attention reads the residual stream directly, so nothing is folded, and its
W_U is the masked-LM decoder's matrix (tied to W_E), without the prediction head's dense layer and norm.
What the norms' scales (one positive number per token) do is not represented: a weight-only score reads
the weights, not a forward pass.

This module does not run models or read corpora; `headscan.metrics.values` computes what heads move on a
corpus, and `headscan.scan.finish.weights_frame` puts the copying scores into the weights table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ModelLoadError
from .checkpoint import untrained_head
from .hooks import backbone

__all__ = ["HeadWeights", "head_weights", "copying_scores", "logit_directions", "FAMILIES"]

FAMILIES = ("bert", "gpt2", "llama")  # module layouts read from Hugging Face models (see `_family`)


@dataclass(frozen=True)
class HeadWeights:
    """Every head's value and output weights with the model's embedding and unembedding (TransformerLens layout).

    Tensors are the model's own where nothing is folded (read them, never write into them).
    """

    W_V: torch.Tensor  # (layer, head, d_model, d_head) per query head; pre-attention norm gain folded in
    b_V: torch.Tensor  # (layer, head, d_head) value bias (zeros where the model has none); norm bias folded in
    W_O: torch.Tensor  # (layer, head, d_head, d_model) each head's rows of the output projection
    b_O: torch.Tensor  # (layer, d_model) attention output bias (zeros where none): belongs to no head
    W_E: torch.Tensor  # (vocab, d_model) token embedding
    W_U: torch.Tensor  # (d_model, vocab) unembedding, the final norm's gain folded in
    tied: bool  # W_U is W_E transposed in the model (one shared matrix), before any folding
    family: str  # "bert", "gpt2" or "llama": how the norms were read
    final_norm: str | None  # "layer", "rms", or None (BERT: no final norm before the decoder is represented)
    final_eps: float  # the final norm's epsilon
    folded: str  # which norms were folded, in words (provenance)
    untrained: str | None = None  # why the checkpoint holds no trained LM head (`headscan.models.checkpoint`); None: it does

    @property
    def embedding(self) -> str:
        """How embedding and unembedding were taken: "tied" or "untied" (the weights table's column)."""
        return "tied" if self.tied else "untied"


def _family(hf_model) -> str | None:
    """Which known module layout `hf_model` has, by its modules rather than its name."""
    body = backbone(hf_model)
    if hasattr(body, "encoder") and hasattr(getattr(body.encoder, "layer", [None])[0], "attention"):
        attention = body.encoder.layer[0].attention
        if hasattr(getattr(attention, "self", None), "value") and hasattr(getattr(attention, "output", None), "dense"):
            return "bert"
    if hasattr(body, "h") and hasattr(body.h[0], "attn") and hasattr(body.h[0].attn, "c_attn") and hasattr(body, "ln_f"):
        return "gpt2"
    layers = getattr(body, "layers", None)
    if layers is not None and len(layers) and hasattr(getattr(layers[0], "self_attn", None), "v_proj") \
            and hasattr(layers[0].self_attn, "o_proj") and hasattr(layers[0], "input_layernorm") and hasattr(body, "norm"):
        return "llama"
    return None


def _zeros_if_none(tensor, *shape, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros(*shape, dtype=like.dtype, device=like.device) if tensor is None else tensor


def _from_bridge(bridge, n_heads: int, d_model: int):
    """(W_V, b_V, W_O, b_O) from the bridge's TransformerLens-layout properties, kv heads not yet repeated."""
    W_V, W_O = [], []
    b_V, b_O = [], []
    for block in bridge.blocks:
        attn = block.attn
        W_V.append(attn.W_V)  # (kv_head, d_model, d_head)
        W_O.append(attn.W_O)  # (head, d_head, d_model)
        try:
            bias = attn.b_V
        except AttributeError:
            bias = None
        b_V.append(_zeros_if_none(bias, attn.W_V.shape[0], attn.W_V.shape[-1], like=attn.W_V))
        try:
            bias = attn.b_O
        except AttributeError:
            bias = None
        b_O.append(_zeros_if_none(bias, d_model, like=attn.W_O))
    return torch.stack(W_V), torch.stack(b_V), torch.stack(W_O), torch.stack(b_O)


def _linear_in(linear, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """An nn.Linear producing n heads' vectors, as (head, d_model, d_head) weight and (head, d_head) bias."""
    weight = linear.weight.T  # (d_model, n * d_head)
    d_model = weight.shape[0]
    bias = None if linear.bias is None else linear.bias.reshape(n, -1)
    return weight.reshape(d_model, n, -1).transpose(0, 1), bias


def _from_modules(hf_model, family: str, n_heads: int, n_kv_heads: int, d_model: int):
    """(W_V, b_V, W_O, b_O) read from the Hugging Face modules, kv heads not yet repeated."""
    body = backbone(hf_model)
    W_V, b_V, W_O, b_O = [], [], [], []
    if family == "bert":
        for layer in body.encoder.layer:
            weight, bias = _linear_in(layer.attention.self.value, n_heads)
            dense = layer.attention.output.dense
            W_V.append(weight)
            b_V.append(bias)
            W_O.append(dense.weight.T.reshape(n_heads, -1, d_model))
            b_O.append(dense.bias)
    elif family == "gpt2":
        for block in body.h:
            # Conv1D computes x @ W + b; c_attn stacks [q | k | v] along its columns.
            weight, bias = block.attn.c_attn.weight[:, 2 * d_model:], block.attn.c_attn.bias[2 * d_model:]
            W_V.append(weight.reshape(d_model, n_heads, -1).transpose(0, 1))
            b_V.append(bias.reshape(n_heads, -1))
            W_O.append(block.attn.c_proj.weight.reshape(n_heads, -1, d_model))
            b_O.append(block.attn.c_proj.bias)
    else:
        for layer in body.layers:
            weight, bias = _linear_in(layer.self_attn.v_proj, n_kv_heads)
            o_proj = layer.self_attn.o_proj
            W_V.append(weight)
            b_V.append(_zeros_if_none(bias, n_kv_heads, weight.shape[-1], like=weight))
            W_O.append(o_proj.weight.T.reshape(n_heads, -1, d_model))
            b_O.append(_zeros_if_none(o_proj.bias, d_model, like=weight))
    return torch.stack(W_V), torch.stack(b_V), torch.stack(W_O), torch.stack(b_O)


def _pre_attention_norms(hf_model, family: str):
    """(layer, d_model) gains and biases (None where absent) of the norm before each attention; None if post-norm."""
    body = backbone(hf_model)
    if family == "gpt2":
        return (torch.stack([block.ln_1.weight for block in body.h]),
                torch.stack([block.ln_1.bias for block in body.h]))
    if family == "llama":
        norms = [layer.input_layernorm for layer in body.layers]
        bias = [getattr(n, "bias", None) for n in norms]
        return torch.stack([n.weight for n in norms]), None if any(b is None for b in bias) else torch.stack(bias)
    return None


def _final_norm(hf_model, family: str):
    """(kind, gain, eps) of the norm before the unembedding; (None, None, 0.0) for BERT."""
    body = backbone(hf_model)
    if family == "gpt2":
        return "layer", body.ln_f.weight, float(body.ln_f.eps)
    if family == "llama":
        norm = body.norm
        eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None) or 1e-6
        kind = "layer" if isinstance(norm, torch.nn.LayerNorm) else "rms"
        return kind, norm.weight, float(eps)
    return None, None, 0.0


def head_weights(model, *, fold_norms: bool = True) -> HeadWeights:
    """Every head's value and output weights, the embedding and the unembedding of a `HookedModel`.

    From the TransformerBridge where the model has one, else from its Hugging Face modules (BERT-, GPT-2-
    and Llama-style layouts, `FAMILIES`); other models get a `ModelLoadError`. With `fold_norms` the norm
    gains are folded in (see the module docstring); without it W_V, b_V and W_U are the model's own.

    >>> import tempfile
    >>> from headscan.models import load_model
    >>> from headscan.testing import build_tiny_checkpoint
    >>> weights = head_weights(load_model(str(build_tiny_checkpoint(tempfile.mkdtemp(), "gpt2"))))
    >>> tuple(weights.W_V.shape), tuple(weights.W_O.shape), weights.embedding
    ((2, 4, 32, 8), (2, 4, 8, 32), 'tied')
    """
    hf_model = model.hf_model
    family = _family(hf_model)
    if family is None:
        raise ModelLoadError(
            f"model {model.name!r} ({type(hf_model).__name__}): headscan reads per-head weights of "
            f"{', '.join(FAMILIES)}-style models only; leave the weight scores out for this model")
    n_heads, n_kv, d_model = model.n_heads, model.n_kv_heads, model.d_model
    with torch.no_grad():
        bridged = model.bridge is not None and hasattr(model.bridge.blocks[0].attn, "W_V")
        if bridged:
            W_V, b_V, W_O, b_O = _from_bridge(model.bridge, n_heads, d_model)
            W_E, W_U = model.bridge.W_E, model.bridge.W_U
        else:
            W_V, b_V, W_O, b_O = _from_modules(hf_model, family, n_heads, n_kv, d_model)
            W_E = hf_model.get_input_embeddings().weight
            output = hf_model.get_output_embeddings() if hasattr(hf_model, "get_output_embeddings") else None
            if output is None:
                raise ModelLoadError(f"model {model.name!r} ({type(hf_model).__name__}) was loaded without its "
                                     f"output head, so it has no unembedding to read; load it with its LM head")
            W_U = output.weight.T
        if W_V.shape[1] != n_heads:  # grouped-query attention: one copy per query head that reads it
            W_V = W_V.repeat_interleave(n_heads // W_V.shape[1], dim=1)
            b_V = b_V.repeat_interleave(n_heads // b_V.shape[1], dim=1)
        output = hf_model.get_output_embeddings() if hasattr(hf_model, "get_output_embeddings") else None
        tied = output is not None and output.weight.data_ptr() == hf_model.get_input_embeddings().weight.data_ptr()
        kind, gain, eps = _final_norm(hf_model, family)
        folded = []
        norms = _pre_attention_norms(hf_model, family) if fold_norms else None
        if norms is not None:
            weight, bias = norms  # (layer, d_model)
            if bias is not None:  # (w x + b) W_V + b_V = x (w W_V) + (b W_V + b_V)
                b_V = b_V + torch.einsum("ld,lhde->lhe", bias, W_V)
            W_V = weight[:, None, :, None] * W_V
            folded.append("pre-attention norm into W_V, b_V")
        if fold_norms and gain is not None:
            W_U = gain[:, None] * W_U
            folded.append("final norm gain into W_U")
    return HeadWeights(W_V=W_V, b_V=b_V, W_O=W_O, b_O=b_O, W_E=W_E, W_U=W_U, tied=tied, family=family,
                       final_norm=kind, final_eps=eps, folded="; ".join(folded) or "nothing",
                       untrained=untrained_head(model))


def copying_scores(weights: HeadWeights) -> torch.Tensor:
    """(layer, head) each head's OV copying score (Elhage et al. 2021; Olsson et al. 2022), float64.

    For the full OV circuit ``M = W_E W_V^h W_O^h W_U`` (vocab x vocab), with eigenvalues l_i:
    ``sum_i Re(l_i) / sum_i |l_i|``, in [-1, 1]. Near 1, the head raises the logit of the tokens it attends
    to (it copies); near -1 it lowers them; a head with all-zero eigenvalues gets NaN.

    M is never built. It is ``A B`` with ``A = W_E W_V^h`` (vocab x d_head) and ``B = W_O^h W_U`` (d_head x
    vocab), and ``A B`` and ``B A`` have the same nonzero eigenvalues with the same multiplicities (Sylvester's
    determinant identity); the zero ones add nothing to either sum. So the score is read off the d_head x d_head
    matrix ``B A = W_O^h (W_U W_E) W_V^h``, where ``W_U W_E`` (d_model x d_model) is computed once per model.
    Scores use `head_weights` as given: norm gains folded when they were; the value and output biases, which
    do not depend on the token, are not part of M.
    """
    W_E, W_U = weights.W_E.detach().double(), weights.W_U.detach().double()
    middle = W_U @ W_E  # (d_model, d_model)
    W_O, W_V = weights.W_O.detach().double(), weights.W_V.detach().double()
    middle = middle.to(W_O.device)
    small = torch.einsum("lhed,df,lhfk->lhek", W_O, middle, W_V)  # (layer, head, d_head, d_head) = B A
    eigenvalues = torch.linalg.eigvals(small)  # (layer, head, d_head) complex
    return eigenvalues.real.sum(-1) / eigenvalues.abs().sum(-1)


def logit_directions(weights: HeadWeights) -> torch.Tensor:
    """(d_model, vocab) the direction in the final residual stream that each token's centred logit reads, float32.

    ``W_U`` with the final norm's gain folded in (as `head_weights` gives it); for a LayerNorm, centred over
    d_model (the norm subtracts the residual's mean, so ``(x - mean x) . u = x . (u - mean u)``); then centred
    over the vocabulary: ``logit_t - mean_v logit_v = x / s . d[:, t]`` for final residual x and final scale s.
    A new tensor of the unembedding's size.
    """
    if weights.final_norm is None:
        raise ModelLoadError(f"{weights.family} models have no final norm before their unembedding that "
                             f"headscan represents; direct logit attribution is for causal models")
    directions = weights.W_U.detach().float().clone()  # (d_model, vocab)
    if weights.final_norm == "layer":
        directions -= directions.mean(0, keepdim=True)
    directions -= directions.mean(1, keepdim=True)
    return directions
