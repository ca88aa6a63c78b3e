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
from .sites import LAYOUTS, LayerSites

__all__ = ["HeadWeights", "head_weights", "heads_of", "kv_width", "pre_attention_norms", "copying_scores",
           "logit_directions", "FAMILIES"]

FAMILIES = tuple(layout.name for layout in LAYOUTS)  # module layouts read from Hugging Face models


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


def heads_of(sites: LayerSites, layer: int, kind: str, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One layer's "q", "k" or "v" weights under `sites`' layout, split into `n` heads: (head, d_model, d_head)
    weight and (head, d_head) bias (None where the projection has none); views of the model's own tensors."""
    module, start, width = sites.weight_site(layer, kind)
    weight = module.weight if sites.layout.in_out else module.weight.T  # (d_model, n * d_head)
    bias = module.bias
    if width is not None:  # its third of a fused projection, [q | k | v] along the columns
        weight, bias = weight[:, start:start + width], None if bias is None else bias[start:start + width]
    d_model = weight.shape[0]
    return weight.reshape(d_model, n, -1).transpose(0, 1), None if bias is None else bias.reshape(n, -1)


def kv_width(model) -> int:
    """How many heads the layout's keys and values are read in: key/value heads where it groups them, else query
    heads."""
    return model.n_kv_heads if model.layer_sites.layout.grouped else model.n_heads


def _from_modules(model, n_heads: int, d_model: int):
    """(W_V, b_V, W_O, b_O) read from the Hugging Face modules, kv heads not yet repeated."""
    sites = model.layer_sites
    n_kv = kv_width(model)
    W_V, b_V, W_O, b_O = [], [], [], []
    for layer in range(len(sites.layers)):
        weight, bias = heads_of(sites, layer, "v", n_kv)
        output = sites.output(layer)
        W_V.append(weight)
        b_V.append(_zeros_if_none(bias, n_kv, weight.shape[-1], like=weight))
        W_O.append((output.weight if sites.layout.in_out else output.weight.T).reshape(n_heads, -1, d_model))
        b_O.append(_zeros_if_none(output.bias, d_model, like=weight))
    return torch.stack(W_V), torch.stack(b_V), torch.stack(W_O), torch.stack(b_O)


def pre_attention_norms(sites: LayerSites):
    """(layer, d_model) gains and biases (None where absent) of the norm before each attention; None if post-norm."""
    if sites.layout.norm is None:
        return None
    norms = [sites.norm(layer) for layer in range(len(sites.layers))]
    bias = [getattr(n, "bias", None) for n in norms]
    return torch.stack([n.weight for n in norms]), None if any(b is None for b in bias) else torch.stack(bias)


def _final_norm(sites: LayerSites):
    """(kind, gain, eps) of the norm before the unembedding; (None, None, 0.0) where the layout has none (BERT)."""
    norm = sites.final_norm
    if norm is None:
        return None, None, 0.0
    if sites.layout.norm_kind is not None:  # the layout says what its norms are (GPT-2: LayerNorms)
        return sites.layout.norm_kind, norm.weight, float(norm.eps)
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", None) or 1e-6
    kind = "layer" if isinstance(norm, torch.nn.LayerNorm) else "rms"
    return kind, norm.weight, float(eps)


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
    sites = model.layer_sites
    if sites.layout is None:
        raise ModelLoadError(
            f"model {model.name!r} ({type(hf_model).__name__}): headscan reads per-head weights of "
            f"{', '.join(FAMILIES)}-style models only; leave the weight scores out for this model")
    family = sites.layout.name
    n_heads, d_model = model.n_heads, model.d_model
    with torch.no_grad():
        bridged = model.bridge is not None and hasattr(model.bridge.blocks[0].attn, "W_V")
        if bridged:
            W_V, b_V, W_O, b_O = _from_bridge(model.bridge, n_heads, d_model)
            W_E, W_U = model.bridge.W_E, model.bridge.W_U
        else:
            W_V, b_V, W_O, b_O = _from_modules(model, n_heads, d_model)
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
        kind, gain, eps = _final_norm(sites)
        folded = []
        norms = pre_attention_norms(sites) if fold_norms else None
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
