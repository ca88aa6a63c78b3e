"""AtP* for head outputs: attribution patching with GradDrop (Kramár, Lieberum, Shah and Nanda 2024, "AtP*: An
efficient and scalable method for localizing LLM behaviour to components", arXiv 2403.00745), every head at once.

Attribution patching (AtP, Nanda 2023) estimates the change of a scalar target T when a node n takes the value
n' instead of its clean value n: I_AtP(n) = (n' - n) . dT/dn. Here the nodes are the heads' outputs z (each
head's attention-weighted values, cut where they enter the output projection, `headscan.models.ablation`),
summed over the positions where z is replaced.

GradDrop (the paper's section 3.1.2, eq. 11) guards against cancellation: a node whose direct and indirect
effects cancel in the gradient looks unimportant to AtP although patching it is not a small change. For each
layer l, I_AtP+GD_l(n) is AtP with the gradient through layer l's contribution to the residual stream set to 0
(the skip path keeps it); the node's score is

    c_AtP+GD(n) = E over prompts of  1/(L - 1) * sum over l of |I_AtP+GD_l(n)|

For a node in layer k, dropping a later layer's gradient leaves its gradient as it was (k > l gives plain AtP),
dropping its own layer gives 0, so L - 1 terms remain and a node without cancellation scores |I_AtP(n)|. Here
layer l is the whole block whose output is the residual stream after it (`HeadCut.blocks`: attention and MLP
together, as in the paper's parallel-attention Pythia), and its contribution is block output minus block input.
In a pre-norm model (GPT-2, Llama and kin) that difference is exactly what the block adds to the residual stream;
in a post-norm encoder (BERT) it is a split of the block's output, not a residual branch of its own.

The paper's other fix, for attention saturation ("QK fix", section 3.1.1), is *not* applied here, and is no
part of AtP* for these nodes: it concerns nodes that are a head's *queries or keys*, whose effect passes through
that head's own softmax, which the fix recomputes exactly from the (exactly bilinear) change of the attention
logits. A head's output z is taken after its own softmax, so its own pattern never changes when z is patched.
z reaches later heads' softmaxes through their queries and keys; the paper linearises such upstream effects too
(AtP* keeps the gradient through downstream softmaxes), and so does this module. Recomputing every downstream
softmax for every patched head would cost one pass per head and be specific to each attention implementation
(rotary embeddings, grouped queries, norms), which is what exact ablation already does.

Cost: one forward pass and L + 1 backward passes (plain AtP and one per dropped layer) per batch; the forward
graph is kept and each backward reads it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .ablation import Surgery

__all__ = ["AtPStar", "atp_star", "attribution", "head_attributions"]


@dataclass(frozen=True)
class AtPStar:
    """What `atp_star` gives, per batch row (one prompt or segment): signed estimates in the target's units."""

    atp: torch.Tensor  # (batch, layer, head): plain AtP, sum over the replaced positions of (r - z) . dT/dz
    dropped: torch.Tensor  # (dropped layer, batch, layer, head): AtP with block l's gradient dropped

    @property
    def star(self) -> torch.Tensor:
        """(batch, layer, head) the paper's per-prompt AtP* score, 1/(L - 1) * sum over l of |dropped[l]|: a
        size, never negative. Its mean over prompts is c_AtP+GD (eq. 11).

        >>> r = AtPStar(torch.zeros(1, 2, 1), torch.tensor([[[[0.0], [3.0]]], [[[-2.0], [0.0]]]]))
        >>> r.star  # layer 0's head: |-2| (its own layer dropped: 0); layer 1's: |3|
        tensor([[[2.],
                 [3.]]])
        """
        return self.dropped.abs().sum(0) / (self.dropped.shape[0] - 1)


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype.itemsize < 4 else x


def attribution(heads: torch.Tensor, grads: torch.Tensor, replacement: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(..., batch, head) first-order change of the target when each head's output z is replaced by `replacement`:
    sum over real positions q of (r - z[q]) . dT/dz[q] (attribution patching), every head at once. The one AtP
    contraction: the sweep's importance calls it per layer, `head_attributions` on every layer stacked.

    heads and grads (..., batch, seq, head * d_head): the output projection's input and the target's gradient
    there (any leading dimensions: layers); replacement (..., head, d_head), each head's mean output or zeros
    for zero ablation, or (..., batch, seq, head, d_head), one per position (another prompt's outputs); real
    (batch, seq) bool, where the replacement applies. Nothing handed in is written into.

    >>> z = torch.tensor([[[1.0, 2.0]]])  # one segment, one position, one head of 2 dimensions
    >>> g = torch.tensor([[[0.5, -1.0]]])
    >>> attribution(z, g, torch.tensor([[3.0, 0.0]]), torch.tensor([[True]]))  # (2, -2) . (0.5, -1)
    tensor([[3.]])
    """
    n_heads, d_head = replacement.shape[-2:]
    z = _at_least_float32(heads)
    z = z.view(*z.shape[:-1], n_heads, d_head)  # (..., batch, seq, head, d_head)
    if replacement.dim() == z.dim() - 2:  # one value per head: the same at every position
        replacement = replacement[..., None, None, :, :]
    g = grads.to(z.dtype).view_as(z)
    per_position = ((replacement.to(z.device, z.dtype) - z) * g).sum(-1)  # (..., batch, seq, head)
    return torch.where(real.to(z.device)[..., None], per_position, 0).sum(-2)


def head_attributions(heads: Sequence[torch.Tensor], grads: Sequence[torch.Tensor | None],
                      replacement: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(batch, layer, head) `attribution` of every layer at once.

    heads and grads: per layer, (batch, seq, head * d_head): the heads' outputs side by side and the target's
    gradient there (None: the target does not depend on that layer, 0); replacement: (layer, head, d_head), one
    value per head, or (layer, batch, seq, head, d_head), one per position (another prompt's outputs);
    positions: (batch, seq) bool, where the replacement applies. Nothing handed in is written into.
    """
    z = torch.stack([h.detach() for h in heads])  # (layer, batch, seq, head * d_head)
    g = torch.stack([torch.zeros_like(h) if gr is None else gr.detach() for h, gr in zip(heads, grads)])
    return attribution(z, g, replacement, positions).transpose(0, 1)


class _Dropped:
    """Which block's gradient the backward pass in progress drops (None: none)."""

    layer: int | None = None


def _drop_hook(layer: int, dropped: _Dropped):
    """A forward hook giving block `layer`'s output y as y + 0, where the 0 is (x - x) + (d - d) with x the
    block's input and d = y - x, each second term detached: the value is y bit for bit, the gradient reaches x
    along the skip path and, unless this layer is dropped, through d (the block's own computation)."""

    def hook(module, args, kwargs, output):
        y = output if isinstance(output, torch.Tensor) else output[0]
        x = args[0] if args else kwargs.get("hidden_states")
        if not isinstance(x, torch.Tensor) or x.shape != y.shape:
            raise ValueError(f"GradDrop: block {layer} was not called with its input residual stream first "
                             f"(hidden_states), so its contribution cannot be told from its skip path")
        through = (y - x) - (y - x).detach()
        through.register_hook(lambda grad: torch.zeros_like(grad) if dropped.layer == layer else None)
        new = y.detach() + (x - x.detach()) + through
        return new if isinstance(output, torch.Tensor) else (new, *output[1:])

    return hook


@contextlib.contextmanager
def _graddrop_hooks(blocks, dropped: _Dropped):
    handles = [block.register_forward_hook(_drop_hook(layer, dropped), with_kwargs=True)
               for layer, block in enumerate(blocks)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def atp_star(surgery: Surgery, input_ids: torch.Tensor, attention_mask: torch.Tensor, replacement: torch.Tensor,
             target_fn: Callable[[torch.Tensor], torch.Tensor], *, positions: torch.Tensor | None = None) -> AtPStar:
    """AtP and GradDrop's L estimates for every head, from one forward and L + 1 backward passes.

    `surgery`: an entered `headscan.models.ablation.Surgery` whose cut knows each layer's block; input_ids and
    attention_mask (batch, seq); replacement: (layer, head, d_head) (a mean, zeros) or (layer, batch, seq, head,
    d_head) (another prompt's head outputs, for contrastive patching); target_fn: the model's output (logits, or
    final hidden states) to a (batch,) tensor, the scalar per prompt whose change is estimated (a loss summed
    over tokens, a logit difference); positions: (batch, seq) bool, where the replacement applies (default:
    every real token). Returns `AtPStar`: ``.atp`` (batch, layer, head), ``.dropped`` (layer, batch, layer,
    head), and ``.star``, the paper's score per prompt. Raises ValueError for a model of one layer (GradDrop has
    no other layer to drop) or one whose blocks are not known (an attention module shared by every layer).
    """
    blocks = surgery.cut.blocks
    if blocks is None:
        raise ValueError(f"GradDrop needs each layer's block, and this model's are not known: {surgery.cut.blocks_note}")
    n_layers = len(blocks)
    if n_layers < 2:
        raise ValueError("GradDrop needs at least 2 layers: with one, no other layer's gradient can be dropped")
    positions = attention_mask.bool() if positions is None else positions.bool()
    dropped = _Dropped()
    with _graddrop_hooks(blocks, dropped):
        run = surgery.run(input_ids, attention_mask, capture=True, grad=True)
    total = target_fn(run.output).sum()
    outputs = list(run.heads)
    plain = torch.autograd.grad(total, outputs, retain_graph=True, allow_unused=True)
    atp = head_attributions(outputs, plain, replacement, positions)  # (batch, layer, head)
    estimates = []
    for layer in range(n_layers):
        # a node after the dropped block keeps its gradient, one in it gets none: only earlier layers are taken
        dropped.layer = layer
        earlier = torch.autograd.grad(total, outputs[:layer], retain_graph=layer < n_layers - 1,
                                      allow_unused=True) if layer else ()
        estimate = atp.clone()
        estimate[:, layer] = 0
        if layer:
            estimate[:, :layer] = head_attributions(outputs[:layer], earlier, replacement[:layer], positions)
        estimates.append(estimate)
    dropped.layer = None
    return AtPStar(atp, torch.stack(estimates))
