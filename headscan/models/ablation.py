"""Cutting one head out of a model: where each head's output enters the output projection, and whole forward
passes with a head's output replaced.

A head's output z_h (the attention-weighted values, before W_O) is cut where it enters the attention output
projection (where it is, per architecture, is `headscan.models.sites`): that module's input
is every query head's output side by side, ``(batch, seq, head * d_head)``, head h in columns
``h * d_head .. (h + 1) * d_head - 1`` (grouped-query models too: one slice per *query* head). A forward
pre-hook on that module replaces the head's slice; the output bias belongs to no head and stays. On the
``transformer_lens`` path the module is the one the bridge's ``blocks.{L}.attn.o`` wraps (its ``hook_z``),
on the ``hf_hooks`` path the one beside the attention module the sweep reads.

`Surgery` runs the whole model, to the output its importance target reads (`target_of`): the logits of a
causal or masked language model, or the final hidden states of an encoder without a trained head. Its clean
pass keeps every layer's head outputs (in the autograd graph, for attribution patching) and each block's
output; an ablated pass can then run from the ablated layer on, the blocks before it handing back the clean
pass's residual stream instead of recomputing it (`HeadCut.blocks`; `Surgery.check` verifies on a probe that
this gives the full pass's output).

Everything specific to an architecture here is *where* the cut is; the targets themselves are
`headscan.metrics.importance`. This module does not read corpora or keep sums.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ModelLoadError
from .hooked import PROBE
from .hooks import unobserved_norms
from .sites import OUTPUTS_SOUGHT, backbone, in_features

if TYPE_CHECKING:
    from .hooked import HookedModel

__all__ = ["TARGETS", "HeadCut", "SurgeryRun", "Surgery", "head_cut", "head_columns", "cut_heads", "target_of",
           "zeroed_heads"]

# What a head's removal is measured on, per kind of model (headscan.metrics.importance defines each).
TARGETS = ("next_token_loss", "masked_loss", "hidden_change")


@dataclass(frozen=True)
class HeadCut:
    """Where every layer's heads are cut, and which modules are its blocks."""

    modules: tuple  # per layer, the module whose input is the heads' outputs side by side (may repeat: ALBERT)
    name: str  # layer 0's module, as the Hugging Face model names it (provenance)
    d_head: int
    blocks: tuple | None  # per layer, the block whose output is the residual stream after it; None: not known
    blocks_note: str  # why blocks is None, or where they were found

    @property
    def where(self) -> str:
        """The first layer's cut, for provenance."""
        return f"input of {self.name} (a forward pre-hook; head h = columns h*{self.d_head}..(h+1)*{self.d_head}-1)"


def _name_of(hf_model, target) -> str:
    """`target`'s name in the Hugging Face model. A TransformerLens bridge lists its modules under several names
    and keeps the model's own as ``..._original_component...``: that path, without those parts, is the model's."""
    names = [name for name, module in hf_model.named_modules(remove_duplicate=False) if module is target]
    if not names:
        return type(target).__name__
    name = max(names, key=lambda n: (n.count("_original_component"), -len(n)))  # through every wrapped module
    return name.replace("._original_component", "")


def _blocks(model: HookedModel, cuts: list) -> tuple[tuple | None, str]:
    """Each layer's block: on the bridge its ``blocks``; else the model's one list of n_layers modules whose
    L-th holds layer L's cut."""
    if model.bridge is not None:
        return tuple(model.bridge.blocks), "the bridge's blocks"
    if len({id(m) for m in cuts}) < len(cuts):
        return None, "one attention module serves every layer, so no block can be skipped"
    for name, module in backbone(model.hf_model).named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == model.n_layers and all(
                any(sub is cut for sub in block.modules()) for block, cut in zip(module, cuts)):
            return tuple(module), f"the modules of {name}"
    return None, "no list of blocks holding one layer each was found"


def head_cut(model: HookedModel) -> HeadCut:
    """Where `model`'s heads are cut; a model whose output projection headscan cannot find is refused in one line
    naming its architecture."""
    architecture = type(model.hf_model).__name__
    cuts = list(model.layer_sites.outputs)
    width = [in_features(c) if c is not None else None for c in cuts]
    if len(cuts) != model.n_layers or any(w is None or w % model.n_heads for w in width) or len(set(width)) != 1:
        raise ModelLoadError(
            f"model {model.name!r} ({architecture}): headscan cannot find where each head's output enters the "
            f"attention output projection (looked for {OUTPUTS_SOUGHT}), so it cannot ablate its heads; sweep it "
            f"with --importance off")
    blocks, note = _blocks(model, cuts)
    return HeadCut(tuple(cuts), _name_of(model.hf_model, cuts[0]), width[0] // model.n_heads, blocks, note)


def head_columns(width: int, d_head: int, heads, *, device=None) -> torch.Tensor:
    """(width,) bool: the columns of `heads` (query head indices; None: every head) in an output projection's
    input, ``(..., head * d_head)``, head h in columns ``h * d_head .. (h + 1) * d_head - 1``.

    >>> head_columns(6, 2, [0, 2]).tolist()
    [True, True, False, False, True, True]
    """
    columns = torch.zeros(width, dtype=torch.bool, device=device)
    for head in [slice(None)] if heads is None else [slice(h * d_head, (h + 1) * d_head) for h in heads]:
        columns[head] = True
    return columns


def cut_heads(x: torch.Tensor, columns: torch.Tensor, value: torch.Tensor | None = None,
              positions: torch.Tensor | None = None) -> torch.Tensor:
    """`x` (batch, seq, head * d_head) with its `columns` ((head * d_head,) bool, `head_columns`) replaced: by
    `value` ((columns,) at every position, or (batch, seq, columns) one per position), or by 0 where it is None;
    `positions` ((batch, seq) bool) limits it to those positions. The one head cut: a new tensor, `x` is never
    written into.

    >>> cut_heads(torch.ones(1, 2, 4), head_columns(4, 2, [1]), positions=torch.tensor([[False, True]]))
    tensor([[[1., 1., 1., 1.],
             [1., 1., 0., 0.]]])
    """
    per_position = value is not None and value.dim() > 1
    filler = torch.zeros(x.shape if per_position else x.shape[-1:], dtype=x.dtype, device=x.device)
    if value is not None:
        filler[..., columns] = value.to(x.device, x.dtype)
    where = columns if positions is None else positions.to(x.device)[..., None] & columns
    return torch.where(where, filler, x)


def target_of(model: HookedModel) -> tuple[str, str]:
    """What removing a head is measured on for `model`, and why: ``next_token_loss`` for a causal language model,
    ``masked_loss`` for an encoder whose checkpoint holds a trained masked-LM head (its config names a
    ``...ForMaskedLM`` class), ``hidden_change`` for any other encoder (a sentence encoder such as minilm,
    whose checkpoint has no head: the one a loader puts on top is random)."""
    hf_model = model.hf_model
    head = hf_model.get_output_embeddings() if hasattr(hf_model, "get_output_embeddings") else None
    saved = list(getattr(hf_model.config, "architectures", None) or [])
    if model.causal:
        if head is None:
            raise ModelLoadError(f"model {model.name!r} ({type(hf_model).__name__}) was loaded without its language-"
                                 f"model head, so its next-token loss cannot be computed; sweep it with --importance off")
        return "next_token_loss", "causal language model: its next-token loss"
    masks = getattr(model.tokenizer, "mask_token_id", None) is not None
    if head is not None and masks and any(name.endswith("ForMaskedLM") for name in saved):
        return "masked_loss", f"its checkpoint is a {saved[0]}: the masked-token loss of its trained head"
    why = f"its checkpoint is a {saved[0]}" if saved else "its checkpoint names no class"
    return "hidden_change", f"{why}, with no trained masked-LM head: the change of its final hidden states"


@contextlib.contextmanager
def zeroed_heads(model: HookedModel, cut: HeadCut, heads, *, within=None):
    """While the block runs, every (layer, head) of `heads` has its output z set to 0 at every position, where
    it enters the output projection of `within` (a model holding the same layers, such as the language model
    `headscan.models.decode` runs; default `model`'s own): a forward pre-hook per masked layer hands the
    projection a new tensor with those heads' columns zeroed. Yields the set of layers whose hook ran, so a
    caller can check that the mask reached the pass it meant.

    A model whose layers share one attention module (ALBERT) is refused: a hook could not tell its layers apart.
    """
    modules = _modules_in(model, cut, within)
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        if not (0 <= layer < model.n_layers and 0 <= head < model.n_heads):
            raise ValueError(f"head L{layer}H{head} is not one of {model.name}'s {model.n_layers}x{model.n_heads}")
        by_layer.setdefault(int(layer), []).append(int(head))
    if by_layer and len({id(m) for m in modules}) < len(modules):
        raise ModelLoadError(f"model {model.name!r}: its layers share one attention module, so a head of one layer "
                             f"cannot be masked alone")
    fired: set[int] = set()

    def hook_of(layer: int, columns: torch.Tensor):
        def hook(module, args):
            x = args[0]  # (batch, seq, head * d_head)
            fired.add(layer)
            return (cut_heads(x, columns.to(x.device)), *args[1:])
        return hook

    handles = []
    try:
        for layer, chosen in by_layer.items():
            columns = head_columns(model.n_heads * cut.d_head, cut.d_head, chosen)
            handles.append(modules[layer].register_forward_pre_hook(hook_of(layer, columns)))
        yield fired
    finally:
        for handle in handles:
            handle.remove()


def _modules_in(model: HookedModel, cut: HeadCut, within) -> tuple:
    """`cut.modules` as they sit in `within`: the same modules where `within` holds them, else its modules of the
    same names (a language model loaded beside the ``hf_hooks`` body names them with a prefix, ``model.``)."""
    if within is None:
        return cut.modules
    held = {id(m) for m in within.modules()}
    if all(id(m) in held for m in cut.modules):
        return cut.modules
    names = dict(within.named_modules())
    found = []
    for module in cut.modules:
        name = _name_of(model.hf_model, module)
        match = [names[n] for n in names if n == name or n.endswith("." + name)]
        if len(match) != 1:
            raise ModelLoadError(f"model {model.name!r}: the output projection {name} was not found once in the "
                                 f"language model that decodes, so its heads cannot be masked there")
        found.append(match[0])
    return tuple(found)


@functools.cache
def _takes(cls, name: str) -> bool:
    return name in inspect.signature(cls.forward).parameters


@dataclass
class SurgeryRun:
    """What one forward pass of `Surgery.run` gives: the output its target reads, and (a clean pass) what an ablation reuses."""

    output: torch.Tensor  # (batch, seq, vocab) logits, or (batch, seq, d_model) final hidden states
    heads: list = field(default_factory=list)  # per layer, (batch, seq, head * d_head): the cut modules' inputs
    residuals: list = field(default_factory=list)  # per layer, what its block returned (detached)


@dataclass
class _Plan:
    """What the hooks do during the pass in progress."""

    capture: bool = False  # keep the heads' outputs and the blocks' outputs
    # each (layer, head, value): value (d_head,), (batch, seq, d_head) per position, or None: 0; head None puts
    # value (batch, seq, head * d_head) in place of every head of the layer (a layer frozen to another pass's)
    replace: tuple = ()
    positions: torch.Tensor | None = None  # (batch, seq) bool: where `replace` applies; None: every position
    calls: dict = field(default_factory=dict)  # id(module) -> calls so far in this pass (shared modules)
    heads: list = field(default_factory=list)
    residuals: list = field(default_factory=list)


class Surgery:
    """Forward passes of a whole model with its heads' outputs read or replaced (use as a context manager: the
    hooks are attached on entry and removed on exit, and do nothing outside `run`)."""

    def __init__(self, model: HookedModel, cut: HeadCut, target: str):
        self.model, self.cut, self.target = model, cut, target
        self.plan: _Plan | None = None
        # layers served by each distinct module, in call order (ALBERT: one module, every layer)
        self._layers: dict[int, list[int]] = {}
        for layer, module in enumerate(cut.modules):
            self._layers.setdefault(id(module), []).append(layer)
        self._handles: list = []
        self._norms = contextlib.ExitStack()
        self.reuse = cut.blocks is not None  # run ablations from the ablated layer on; `check` may turn it off
        self.reuse_note = cut.blocks_note

    def __enter__(self) -> Surgery:
        seen = set()
        for module in self.cut.modules:
            if id(module) not in seen:
                seen.add(id(module))
                self._handles.append(module.register_forward_pre_hook(self._pre))
        for layer, block in enumerate(self.cut.blocks or ()):
            self._handles.append(block.register_forward_hook(functools.partial(self._after_block, layer)))
        # the Hugging Face model holds the bridge's norms: run them as the Hugging Face norm, as the sweep does
        self._norms.enter_context(unobserved_norms(self.model.bridge))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._norms.close()

    # --- hooks -----------------------------------------------------------------------------------------

    def _pre(self, module, args):
        plan = self.plan
        if plan is None:
            return None
        n = plan.calls.get(id(module), 0)
        plan.calls[id(module)] = n + 1
        layer = self._layers[id(module)][n]
        x = args[0]  # (batch, seq, head * d_head)
        if plan.capture:
            plan.heads.append(x)
        here = [(head, value) for at, head, value in plan.replace if at == layer]
        if not here:
            return None
        for head, value in here:
            columns = head_columns(x.shape[-1], self.cut.d_head, None if head is None else [head], device=x.device)
            x = cut_heads(x, columns, value, plan.positions)
        return (x, *args[1:])


    def _after_block(self, layer: int, module, args, output):
        if self.plan is not None and self.plan.capture:
            self.plan.residuals.append(_detached(output))
        return None

    # --- passes ----------------------------------------------------------------------------------------

    def _output(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hf_model = self.model.hf_model
        if self.target == "hidden_change":
            body = backbone(hf_model)
            return body(input_ids=input_ids, attention_mask=attention_mask)[0]  # (batch, seq, d_model)
        kwargs = {"use_cache": False} if _takes(type(hf_model), "use_cache") else {}
        return hf_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs).logits  # (batch, seq, vocab)

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, capture: bool = False, grad: bool = False,
            replace: tuple | list | None = None, positions: torch.Tensor | None = None,
            residuals: list | None = None, start: int | None = None) -> SurgeryRun:
        """One whole forward pass.

        `capture`: keep every layer's head outputs and block outputs (a clean pass); with `grad` the head outputs
        stay in the autograd graph, for `torch.autograd.grad`. `replace`: ``(layer, head, value)`` puts `value`
        ((d_head,) at every position, (batch, seq, d_head) one per position, or None for zeros) in place of that
        head's output, or a list of such triples (head None: `value` (batch, seq, head * d_head) replaces the
        whole layer's); `positions` ((batch, seq) bool) limits it to those positions. `residuals`: a clean pass's
        block outputs; with `replace` the blocks before the first replaced layer (or before `start`, when hooks
        of the caller's change that layer) hand them back unrun.
        """
        replace = () if replace is None else (replace,) if isinstance(replace[0], int) else tuple(replace)
        self.plan = _Plan(capture=capture, replace=replace, positions=positions)
        first = [at for at, _, _ in replace] + ([start] if start is not None else [])
        start = min(first) if (first and residuals and self.reuse) else 0
        try:
            with torch.set_grad_enabled(grad), self._skipping(start, residuals):
                output = self._output(input_ids, attention_mask)
            return SurgeryRun(output, self.plan.heads, self.plan.residuals)
        finally:
            self.plan = None

    @contextlib.contextmanager
    def _skipping(self, start: int, residuals: list | None):
        """Blocks 0 .. start-1 return the clean pass's residual after block start-1 without running: exact, since
        block `start` then reads what it read in the clean pass."""
        if start == 0:
            yield
            return
        blocks = self.cut.blocks[:start]
        kept = residuals[start - 1]
        try:
            for block in blocks:
                # in the instance's own dict: TransformerLens' components pass attribute writes on to the module
                # they wrap, and nn.Module's __call__ finds an instance's `forward` before its class's
                vars(block)["forward"] = lambda *args, **kwargs: kept
            yield
        finally:
            for block in blocks:
                vars(block).pop("forward", None)

    def check(self) -> None:
        """Verify, on the probe sentence, that running from a layer on reproduces the full ablated pass (else
        ablations run whole passes, and `reuse_note` says why), and that each cut module ran once per layer."""
        model = self.model
        ids = torch.tensor([model.token_ids([PROBE])[0]], dtype=torch.long, device=model.device)
        mask = torch.ones_like(ids)
        with torch.no_grad():
            clean = self.run(ids, mask, capture=True)
            if len(clean.heads) != model.n_layers:
                raise ModelLoadError(f"model {model.name!r}: its output projections ran {len(clean.heads)} times in a "
                                     f"forward pass, expected {model.n_layers}; headscan cannot ablate its heads")
            if not self.reuse:
                return
            layer = model.n_layers // 2
            value = clean.heads[layer][0, 0, :self.cut.d_head]
            full = self.run(ids, mask, replace=(layer, 0, value))
            reused = self.run(ids, mask, replace=(layer, 0, value), residuals=clean.residuals)
        scale = float(full.output.abs().max()) or 1.0
        gap = float((full.output - reused.output).abs().max())
        if not gap <= 1e-5 * scale:
            self.reuse = False
            self.reuse_note = (f"running from the ablated layer on differs from the whole pass by {gap:.1e} on a "
                               f"probe, so each ablation runs the whole model")
        else:
            self.reuse_note = f"each ablation runs from its layer on ({self.cut.blocks_note} before it are not rerun)"


def _detached(output: Any):
    if isinstance(output, torch.Tensor):
        return output.detach()
    if isinstance(output, tuple):
        return tuple(_detached(item) for item in output)
    return output
