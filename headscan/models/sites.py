"""Where each layer's attention parts are, per architecture: the one file that names a model's attention modules.

A model's `LayerSites` is resolved once, as it loads (`headscan.models.load`), and kept as
``HookedModel.layer_sites``. Per layer it holds:

- ``attention``: on the ``hf_hooks`` path, the attention modules whose output holds the pattern (`Site`, found by
  `attention_sites` from transformers' own records, and ordered and checked by `headscan.models.hooks.discover`);
- ``outputs``: the attention output projection, whose input is every query head's output z side by side: where
  `headscan.models.ablation` cuts heads, and where patching, path patching and AtP* read and replace them. On the
  ``transformer_lens`` path it is the module the bridge's ``blocks.{L}.attn.o`` wraps; on ``hf_hooks`` the one in
  or beside the attention module the sweep reads (`OUTPUT_NAMES`, `OUTPUT_SIBLINGS`);
- ``projections``: the query, key and value projections that may be the layer's (`QKV_NAMES`, `FUSED_QKV_NAMES`),
  nearest first, each as (module, column where it starts); `headscan.models.patching.projection_sites` keeps the
  ones a forward pass runs (a bridge holds both the model's own fused projection and the split ones it calls);
- ``layout``: for the module layouts whose weights headscan reads (`LAYOUTS`: BERT, GPT-2, Llama and kin), the
  value, query, key and output modules, the norm before attention and the final norm (`headscan.models.weights`,
  `headscan.models.composition`).

Nothing is refused here: a part not found is None (or empty), and the code that needs it refuses the model in
one line naming what was looked for (`OUTPUTS_SOUGHT`, `PROJECTIONS_SOUGHT`). This module runs no forward pass.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Site", "Layout", "LAYOUTS", "LayerSites", "layer_sites", "attention_sites", "backbone", "submodule",
           "in_features", "out_features", "is_conv1d", "OUTPUTS_SOUGHT", "PROJECTIONS_SOUGHT", "KINDS"]

KINDS = ("q", "k", "v")  # a projection's kinds, in the order a fused one holds them

# Names of the output projection inside a self-attention module (Llama and kin, OPT and GPT-Neo, GPT-2,
# DistilBERT, MPNet, ModernBERT, ALBERT / Phi / BLOOM / Falcon / GPT-NeoX); BERT-style models keep it in a
# sibling, ``attention.output.dense``.
OUTPUT_NAMES = ("o_proj", "out_proj", "c_proj", "out_lin", "o", "Wo", "dense")
OUTPUT_SIBLINGS = ("output.dense",)
# Separate query, key and value projections, by architecture's names (Llama and kin, BERT, DistilBERT; a
# TransformerLens bridge splits even a fused one into q, k and v).
QKV_NAMES = (("q_proj", "k_proj", "v_proj"), ("query", "key", "value"), ("q_lin", "k_lin", "v_lin"), ("q", "k", "v"))
# One projection whose output is [queries | keys | values] side by side (GPT-2, ModernBERT).
FUSED_QKV_NAMES = ("c_attn", "Wqkv")
# A BERT-style attention module keeps its projections in this child (``attention.self``).
_INNER = "self"

OUTPUTS_SOUGHT = f"{', '.join(OUTPUT_NAMES)} in the attention module and {', '.join(OUTPUT_SIBLINGS)} beside it"
PROJECTIONS_SOUGHT = f"{', '.join('/'.join(n) for n in QKV_NAMES)} and the fused {', '.join(FUSED_QKV_NAMES)}"


@dataclass(frozen=True)
class Site:
    """An attention module whose output holds its layer's pattern, (batch, head, q, k)."""

    name: str  # its name in the Hugging Face model
    module: Any  # torch.nn.Module
    index: int  # position of the pattern in the module's output tuple
    flag: str | None = None  # keyword argument that must be True for the module to return the pattern at all


@dataclass(frozen=True)
class Layout:
    """Where one family of architectures keeps each layer's attention weights: attribute paths from the backbone
    (``layers``, ``final``) and from each of its layers (the rest)."""

    name: str  # "bert", "gpt2" or "llama" (the weights table's ``family``)
    layers: str  # the backbone's list of layers
    query: str  # the query projection; with `fused`, the fused one (its first third)
    key: str
    value: str
    output: str  # the attention output projection
    norm: str | None  # the norm before attention; None: post-norm (BERT), nothing to fold
    final: str | None  # the norm before the unembedding; None: none headscan represents (BERT)
    fused: bool  # query, key and value are thirds of one projection's output
    in_out: bool  # weights are stored (in, out), as GPT-2's Conv1D (x @ W + b); else (out, in), as nn.Linear
    grouped: bool  # keys and values are read per key/value head (grouped-query attention)
    norm_kind: str | None  # "layer" where the layout's norms are LayerNorms; None: read off the norm's class
    required: tuple[str, ...]  # paths, from layer 0 (``layer.``) or the backbone (``body.``), that identify it


# Models of other names share these layouts (Mistral, Qwen2, ... share Llama's module names); a model is matched by
# its modules, never by its name, in this order.
LAYOUTS = (
    Layout("bert", "encoder.layer", "attention.self.query", "attention.self.key", "attention.self.value",
           "attention.output.dense", None, None, fused=False, in_out=False, grouped=False, norm_kind=None,
           required=("layer.attention.self.value", "layer.attention.output.dense")),
    Layout("gpt2", "h", "attn.c_attn", "attn.c_attn", "attn.c_attn", "attn.c_proj", "ln_1", "ln_f", fused=True,
           in_out=True, grouped=False, norm_kind="layer", required=("layer.attn.c_attn", "body.ln_f")),
    Layout("llama", "layers", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "input_layernorm", "norm", fused=False, in_out=False, grouped=True, norm_kind=None,
           required=("layer.self_attn.v_proj", "layer.self_attn.o_proj", "layer.input_layernorm", "body.norm")),
)


def backbone(hf_model):
    """The model without its output head (``model.bert`` of a BertForMaskedLM); the model itself if it has none."""
    base = getattr(hf_model, "base_model", hf_model)
    return base if isinstance(base, torch.nn.Module) else hf_model


def _attribute(obj, path: str):
    """``obj.a.b`` for path ``"a.b"``; None where any part is missing."""
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def submodule(module, path: str):
    """``module.a.b`` for path ``"a.b"`` where each part is a module; None otherwise."""
    for part in path.split("."):
        module = getattr(module, part, None)
        if not isinstance(module, torch.nn.Module):
            return None
    return module


def is_conv1d(module) -> bool:
    """GPT-2's Conv1D: ``x @ weight + bias``, weight (in, out), where an nn.Linear's is (out, in)."""
    return type(module).__name__ == "Conv1D"


def in_features(module) -> int | None:
    """The width a linear module reads (an nn.Linear's in_features, a Conv1D's weight rows); None for others."""
    if hasattr(module, "in_features"):
        return int(module.in_features)
    weight = getattr(module, "weight", None)  # GPT-2's Conv1D: weight (in, out)
    if is_conv1d(module) and isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    return None


def out_features(module) -> int:
    """The width a linear module writes (an nn.Linear's out_features, a Conv1D's weight columns)."""
    if hasattr(module, "out_features"):
        return int(module.out_features)
    return int(module.weight.shape[1])  # GPT-2's Conv1D: weight (in, out)


# --- the attention modules whose output holds the pattern (hf_hooks) ---------------------------------------


def _recorded_attention(hf_model) -> list[tuple]:
    """How transformers itself records attention weights for `output_attentions` (its ``_can_record_outputs``):
    (class, output index, layer name, class name) per kind of attention module; [] for older model code."""
    from transformers.utils.output_capturing import OutputRecorder

    for module in hf_model.modules():
        spec = (getattr(type(module), "_can_record_outputs", None) or {}).get("attentions")
        if spec is None:
            continue
        specs = []
        for entry in spec if isinstance(spec, list) else [spec]:
            if isinstance(entry, OutputRecorder):
                specs.append((entry.target_class, entry.index, entry.layer_name, entry.class_name))
            elif isinstance(entry, str):
                specs.append((None, 1, None, entry))
            else:
                specs.append((entry, 1, None, None))
        return specs
    return []


def attention_sites(hf_model) -> list[Site]:
    """The self-attention modules of `hf_model` whose output holds the attention weights under eager attention.

    Modern transformers code says which modules those are (``_can_record_outputs``); older code (DeBERTa-v2,
    MPNet) returns them only when asked, through an ``output_attentions`` argument that the hooks set. The
    innermost such module of each layer is kept; the probe at load time finds where in its output the pattern is.
    """
    sites = []
    specs = _recorded_attention(hf_model)
    for name, module in hf_model.named_modules():
        class_name = type(module).__name__
        if specs:
            for target, index, layer_name, suffix in specs:
                matched = (target is not None and isinstance(module, target)) or (
                    suffix is not None and (class_name == suffix or name.endswith(suffix)))
                if matched and (layer_name is None or f".{layer_name.strip('.')}." in f".{name}."):
                    sites.append(Site(name, module, index))
                    break
        elif ("attention" in class_name.lower() and "cross" not in class_name.lower()
              and "output_attentions" in inspect.signature(module.forward).parameters):
            sites.append(Site(name, module, 1, "output_attentions"))
    # innermost only: DeBERTa-v2's DebertaV2Attention holds the DisentangledSelfAttention that computes the weights
    return [s for s in sites if not any(o.name.startswith(s.name + ".") for o in sites if o is not s and s.name)]


# --- output projections: where heads are cut -----------------------------------------------------------------


def _real(module):
    """The Hugging Face module a TransformerLens bridge component wraps (itself when it wraps none)."""
    inner = getattr(module, "original_component", None)
    return inner if isinstance(inner, torch.nn.Module) else module


def _bridge_outputs(bridge) -> list:
    found = []
    for block in bridge.blocks:
        o = _attribute(block, "attn.o")
        found.append(_real(o) if isinstance(o, torch.nn.Module) else None)
    return found


def _site_outputs(hf_model, attention: tuple, n_layers: int) -> list:
    """hf_hooks: the output projection in or beside each attention module the sweep reads, in layer order (a site
    shared by every layer, as in ALBERT, gives one module for all of them)."""
    by_name = dict(hf_model.named_modules())
    found = []
    for site in attention:
        parent = by_name.get(site.name.rsplit(".", 1)[0]) if "." in site.name else None
        candidates = [submodule(site.module, name) for name in OUTPUT_NAMES] + \
                     ([submodule(parent, name) for name in OUTPUT_SIBLINGS] if parent is not None else [])
        found.append(next((c for c in candidates if c is not None and in_features(c) is not None), None))
    if len(found) == 1 and n_layers > 1:
        found = found * n_layers
    return found


# --- query, key and value projections ------------------------------------------------------------------------


def _projections_in(module) -> dict | None:
    """{"q": (module, column), "k": ..., "v": ...} held by `module` itself, or None."""
    if not isinstance(module, torch.nn.Module):
        return None
    for names in QKV_NAMES:
        parts = [getattr(module, n, None) for n in names]
        if all(isinstance(p, torch.nn.Module) for p in parts):
            return {kind: (part, 0) for kind, part in zip(KINDS, parts)}
    for name in FUSED_QKV_NAMES:
        fused = getattr(module, name, None)
        if isinstance(fused, torch.nn.Module) and (hasattr(fused, "out_features") or hasattr(fused, "weight")):
            width = out_features(fused) // 3
            return {kind: (fused, i * width) for i, kind in enumerate(KINDS)}
    return None


def _projection_candidates(hf_model, outputs: list) -> tuple:
    """Per layer, the q/k/v projections found in the modules above its output projection (its wrapper, its
    attention module, the one above: BERT's attention, whose ``self`` holds them), nearest first."""
    parents: dict[int, list[torch.nn.Module]] = {}
    for module in hf_model.modules():
        for child in module.children():
            parents.setdefault(id(child), []).append(module)
    candidates = []
    for out in outputs:
        found, level = [], [out] if out is not None else []
        for _ in range(3):
            level = [parent for module in level for parent in parents.get(id(module), [])]
            found += [f for m in level for f in (_projections_in(m), _projections_in(getattr(m, _INNER, None))) if f]
        candidates.append(tuple(found))
    return tuple(candidates)


# --- the whole ---------------------------------------------------------------------------------------------


def _layout_of(body) -> tuple[Layout | None, tuple]:
    """The first of `LAYOUTS` whose required modules `body` has, with its layers; (None, ()) for none."""
    for layout in LAYOUTS:
        layers = _attribute(body, layout.layers)
        try:
            first = layers[0] if layers is not None and len(layers) else None
        except TypeError:
            first = None
        if first is None:
            continue
        roots = {"layer": first, "body": body}
        if all(_attribute(roots[path.split(".", 1)[0]], path.split(".", 1)[1]) is not None
               for path in layout.required):
            return layout, tuple(layers)
    return None, ()


@dataclass(frozen=True)
class LayerSites:
    """Where one loaded model keeps each layer's attention parts (see the module docstring)."""

    attention: tuple  # hf_hooks: the `Site` of each attention module read, in call order; () on the bridge
    outputs: tuple  # per layer, the attention output projection, None where not found (one module may repeat)
    projections: tuple  # per layer, candidate {"q"|"k"|"v": (module, first column)} dicts, nearest first
    layout: Layout | None  # the weight layout of `LAYOUTS` the model has; None: its weights are not read
    layers: tuple  # per layer, the layout's layer module; () without a layout
    body: Any  # the backbone the layout's paths start from

    def _part(self, layer: int, path: str | None):
        return None if path is None else _attribute(self.layers[layer], path)

    def weight_site(self, layer: int, kind: str) -> tuple[Any, int, int | None]:
        """(module, first column, width) of one layer's "q", "k" or "v" weights under the layout: a separate
        projection whole (width None), or its third of a fused one."""
        module = self._part(layer, {"q": self.layout.query, "k": self.layout.key, "v": self.layout.value}[kind])
        if not self.layout.fused:
            return module, 0, None
        width = module.weight.shape[1 if self.layout.in_out else 0] // 3
        return module, KINDS.index(kind) * width, width

    def output(self, layer: int):
        """One layer's attention output projection under the layout."""
        return self._part(layer, self.layout.output)

    def norm(self, layer: int):
        """The norm before one layer's attention under the layout; None for a post-norm layout."""
        return self._part(layer, self.layout.norm)

    @property
    def final_norm(self):
        """The norm before the unembedding under the layout; None where the layout has none."""
        return None if self.layout is None or self.layout.final is None else _attribute(self.body, self.layout.final)

    def norm_kind(self) -> str | None:
        """"layer" or "rms": the kind of the norms before attention; None for a post-norm layout."""
        if self.layout.norm is None:
            return None
        if self.layout.norm_kind is not None:
            return self.layout.norm_kind
        return "layer" if isinstance(self.norm(0), torch.nn.LayerNorm) else "rms"


def layer_sites(hf_model, *, bridge=None, attention: tuple = (), n_layers: int) -> LayerSites:
    """Resolve where `hf_model`'s attention parts are (through `bridge` where the model has one; else around the
    `attention` sites the hooks read). Never raises for a part it does not find: that part is None."""
    outputs = _bridge_outputs(bridge) if bridge is not None else _site_outputs(hf_model, tuple(attention), n_layers)
    body = backbone(hf_model)
    layout, layers = _layout_of(body)
    return LayerSites(attention=tuple(attention), outputs=tuple(outputs),
                      projections=_projection_candidates(hf_model, outputs), layout=layout, layers=layers, body=body)
