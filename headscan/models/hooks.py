"""Reading attention patterns out of a model as its forward pass produces them: the two hooking paths.

- ``transformer_lens``: `bridge_forward` attaches hooks to a TransformerBridge's ``blocks.{L}.attn.hook_pattern``.
- ``hf_hooks``: `module_forward` attaches PyTorch forward hooks to the Hugging Face model's own attention
  modules (found by `headscan.models.sites.attention_sites` and `discover`), under eager attention.

Both call ``hook(pattern, hook=...)`` per layer with (batch, head, q, k) and stop the forward pass after the
last hooked layer (raising `Stop`). `headscan.models.forward` chooses between them and runs the probe.

Chunked attention (`headscan.models.chunked`) reads no pattern at all: it recomputes each layer's attention in
blocks of queries and calls the same hooks once per block, with a `QueryBlock` as the second argument.

This module does not load models (see `headscan.models.load`) or score heads.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ModelLoadError
from .hooked import PROBE
from .sites import Site, attention_sites, backbone

if TYPE_CHECKING:
    from .hooked import HookedModel

__all__ = ["PatternSite", "QueryBlock", "Stop", "Unhookable", "bridge_forward", "module_forward",
           "unobserved_norms", "unkept_patterns", "discover"]

@dataclass(frozen=True)
class PatternSite:
    """Where a pattern hook's pattern was read: the second argument of every hook on the ``hf_hooks`` path.

    (On the ``transformer_lens`` path it is TransformerLens' own ``HookPoint``; a sweep reads neither.)
    """

    layer: int
    name: str  # the Hugging Face module's name, e.g. "transformer.layer.0.attention"


@dataclass(frozen=True)
class QueryBlock:
    """Which rows of a layer's pattern a chunked-mode hook was handed: the second argument of every pattern
    hook under ``attention="chunked"``.

    The block holds queries ``start .. stop - 1`` of ``n_queries``, against every key; the hooks of one layer
    are called once per block, in order, and the blocks tile ``0 .. n_queries - 1``.

    >>> QueryBlock(layer=3, start=512, stop=1024, n_queries=1500).query_start
    512
    """

    layer: int
    start: int  # first query position of the block (absolute, from 0)
    stop: int  # one past its last query position
    n_queries: int  # the layer's query length: the last block has stop == n_queries

    @property
    def query_start(self) -> int:
        return self.start

    @property
    def size(self) -> int:
        return self.stop - self.start


# --- the transformer_lens path -----------------------------------------------------------------------------


def _stop_pass(tensor, hook):
    from transformer_lens.model_bridge.exceptions import StopAtLayerException

    # TransformerBridge.forward catches this (it is how its own stop_at_layer works) and returns early.
    raise StopAtLayerException(tensor)


# The bridge's hook point of each kind of internal (headscan.models.chunked.INTERNALS), under blocks.{layer}.
BRIDGE_INTERNALS = {"v": "attn.hook_v", "z": "attn.hook_z", "out": "hook_out"}


def _handing(fn: Callable, layer: int) -> Callable:
    def hook(tensor, hook):
        fn(tensor, layer)
        return None  # the tensor goes on unchanged

    return hook


@contextlib.contextmanager
def bridge_forward(bridge, hooks: dict[int, Callable], last: int, internals: dict[str, dict[int, Callable]] | None = None):
    """Pattern hooks on ``blocks.{L}.attn.hook_pattern``, and `internals` ({kind: {layer: fn(tensor, layer)}}) on
    the hook points of `BRIDGE_INTERNALS`: values (batch, k, kv_head, d_head) with b_V, fired before the
    layer's pattern; per-head outputs (batch, q, head, d_head); the residual after block L (batch, q, d_model).
    The pass stops after block `last` (its "out" internal, if any, is called first), or, when nothing after
    them is wanted, once that block's pattern and head outputs (where hooked) have been handed over: the rest of
    the block (for a small model's last layer, most of its arithmetic: the output projection and the MLP) is then
    not run."""
    internals = internals or {}
    fwd_hooks = [(f"blocks.{layer}.attn.hook_pattern", hook) for layer, hook in hooks.items()]
    final = None
    for kind, by_layer in internals.items():
        for layer, fn in by_layer.items():
            if kind == "out" and layer == last:
                final = fn
            else:
                fwd_hooks.append((f"blocks.{layer}.{BRIDGE_INTERNALS[kind]}", _handing(fn, layer)))
    # A hook point's hooks run in the order they were added, so a stop added last runs after the wanted hook
    # there. Values come before the pattern; head outputs may come before or after it (post-hoc patterns), so
    # the pass stops once the last layer's pattern and head outputs have both been handed over: the output
    # projection and the MLP after them are not run (a sixth of minilm's forward).
    if final is not None or last not in hooks:
        stops = [f"blocks.{last}.{BRIDGE_INTERNALS['out']}"]
    else:
        stops = [f"blocks.{last}.attn.hook_pattern"] + ([f"blocks.{last}.{BRIDGE_INTERNALS['z']}"]
                                                          if last in internals.get("z", {}) else [])
    fired: set[str] = set()

    def stop(tensor, hook):
        fired.add(hook.name)
        if len(fired) < len(stops):
            return None
        fired.clear()
        if final is not None:
            final(tensor, last)
        _stop_pass(tensor, hook)

    def forward(input_ids, attention_mask):
        fired.clear()  # a pass that failed part-way leaves nothing for the next one
        return bridge(input_ids, attention_mask=attention_mask)

    with bridge.hooks(fwd_hooks=[*fwd_hooks, *((name, stop) for name in stops)]), unobserved_norms(bridge), \
            unkept_patterns(bridge):
        yield forward


@contextlib.contextmanager
def unkept_patterns(bridge):
    """For the pass, each attention bridge drops the pattern TransformerLens keeps on it as it returns.

    TransformerLens' joint-QKV attention bridges (GPT-2's, Pythia's, ...) store their last pattern as ``_pattern``,
    which nothing of headscan's reads: every layer's (batch, head, q, k) pattern stayed alive until the next pass
    replaced it, so an eager pass held all of them at once."""
    handles = []

    def drop(module, args, output):
        vars(module)["_pattern"] = None  # into the bridge's own __dict__, where TransformerLens put it

    try:
        for module in bridge.modules():
            if "_pattern" in vars(module):
                handles.append(module.register_forward_hook(drop))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _norm_forward(norm):
    """A norm's forward with nothing on its statistics' hook points: hook_in, the Hugging Face norm, hook_out."""
    def forward(hidden_states, **kwargs):
        hidden_states = norm.hook_in(hidden_states)
        result = norm.original_component(hidden_states)
        return norm.hook_out(result if result.dtype == hidden_states.dtype else result.to(hidden_states.dtype))

    return forward


@contextlib.contextmanager
def unobserved_norms(bridge):
    """For the pass, the bridge's norms whose ``hook_scale`` and ``hook_normalized`` nobody hooks run as the
    Hugging Face norm between their hook_in and hook_out (no bridge, None: nothing to do).

    TransformerLens' `NormalizationBridge` (native-autograd path) computes each norm's mean, variance, scale and
    normalised input on every call, to hand them to those two hook points, and then returns the Hugging Face
    norm's own output when no hook edits them: about a tenth of a small model's forward. The output is the same
    tensor either way. A norm on TransformerLens' other (python) path, or with a hook on either point, keeps
    its forward."""
    from transformer_lens.model_bridge.generalized_components.normalization import NormalizationBridge

    replaced = []
    for module in bridge.modules() if bridge is not None else ():
        if not isinstance(module, NormalizationBridge) or module.original_component is None:
            continue
        native = module.use_native_layernorm_autograd or getattr(module.config, "layer_norm_folding", False)
        watched = any(point.fwd_hooks or point.bwd_hooks for point in (module.hook_scale, module.hook_normalized))
        if native and not watched and "forward" not in vars(module):
            # into the instance's own __dict__: a bridge component's __setattr__ hands attributes on to the
            # module it wraps
            vars(module)["forward"] = _norm_forward(module)
            replaced.append(module)
    try:
        yield
    finally:
        for module in replaced:
            del vars(module)["forward"]


# --- the hf_hooks path -------------------------------------------------------------------------------------


class Stop(Exception):
    """Raised after the last hooked layer (by either path, or chunked attention): the rest of the pass is not needed."""


def call_backbone(backbone, input_ids, attention_mask) -> None:
    """One forward pass of `backbone` whose only product is what its hooks read."""
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if _takes_use_cache(type(backbone)):
        kwargs["use_cache"] = False  # a key/value cache is only for generation
    backbone(**kwargs)


@functools.cache
def _takes_use_cache(backbone_class) -> bool:
    return "use_cache" in inspect.signature(backbone_class.forward).parameters


def _forcing(site: Site):
    """A forward pre-hook that passes ``site.flag=True`` to the module, however its caller passed it."""
    signature = inspect.signature(site.module.forward)

    def force(module, args, kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.arguments[site.flag] = True
        return bound.args, bound.kwargs

    return force


@contextlib.contextmanager
def _attached(sites, on_output: Callable[[Site, Any], None]):
    """Call ``on_output(site, output)`` after every call of a site's module, for the duration of the block."""
    handles = []
    try:
        for site in sites:
            if site.flag is not None:
                handles.append(site.module.register_forward_pre_hook(_forcing(site), with_kwargs=True))
            handles.append(site.module.register_forward_hook(
                lambda module, args, output, site=site: on_output(site, output)))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def module_forward(model: HookedModel, hooks: dict[int, Callable], last: int):
    # Layers are told apart by call order, not by module: ALBERT runs one attention module in every layer.
    calls = [0]

    def on_output(site: Site, output) -> None:
        layer = calls[0]
        calls[0] += 1
        hook = hooks.get(layer)
        if hook is not None:
            hook(output[site.index], hook=PatternSite(layer, site.name))
        if layer >= last:
            raise Stop

    body = backbone(model.hf_model)

    def forward(input_ids, attention_mask) -> None:
        calls[0] = 0
        try:
            call_backbone(body, input_ids, attention_mask)
        except Stop:
            return
        raise ModelLoadError(f"{model.name}: the forward pass ran {calls[0]} attention layers, expected {last + 1}")

    with _attached(model.layer_sites.attention, on_output):
        yield forward


def _pattern_index(output, site: Site, n: int) -> int | None:
    """Where in `output` the (1, head, n, n) pattern is: the site's index when it fits, else the first that does."""
    items = output if isinstance(output, (tuple, list)) else (output,)

    def fits(item) -> bool:
        return isinstance(item, torch.Tensor) and item.dim() == 4 and item.shape[0] == 1 and item.shape[-2:] == (n, n)

    if 0 <= site.index < len(items) and fits(items[site.index]):
        return site.index
    return next((i for i, item in enumerate(items) if i > 0 and fits(item)), None)


class Unhookable(Exception):
    """This path cannot read the model's patterns; the message says why, in a few words."""


def discover(hf_model, tokenizer) -> dict:
    """Run the probe sentence through `hf_model`'s attention modules: which run, in what order, where each
    returns its pattern, how many heads it has and whether it is causal."""
    sites = attention_sites(hf_model)
    if not sites:
        raise Unhookable("none of its modules is a self-attention module that returns its weights")
    ids = tokenizer([PROBE], add_special_tokens=True, return_tensors="pt")["input_ids"]
    ids = ids.to(next(hf_model.parameters()).device)
    n = ids.shape[1]
    calls = []

    def on_output(site: Site, output) -> None:
        index = _pattern_index(output, site, n)
        pattern = output[index] if index is not None else None
        calls.append((site, index, pattern.shape[1] if index is not None else None,
                      index is not None and bool((pattern.triu(1) == 0).all())))

    with torch.inference_mode(), _attached(sites, on_output):
        call_backbone(backbone(hf_model), ids, torch.ones_like(ids))
    if not calls:
        raise Unhookable("no attention module ran in a forward pass")
    found = {}
    for site, index, _, _ in calls:
        if index is None:
            raise Unhookable(f"{site.name} ({type(site.module).__name__}) returned no (batch, head, q, k) weights "
                              f"under eager attention")
        if found.setdefault(site.name, index) != index:
            raise Unhookable(f"{site.name} returned its weights at different places in its output")
    heads = {n_heads for _, _, n_heads, _ in calls}
    if len(heads) != 1:
        raise Unhookable(f"its layers have different numbers of heads ({sorted(heads)})")
    by_name = {site.name: site for site in sites}
    ordered = dict.fromkeys(site.name for site, _, _, _ in calls)
    return {
        "sites": tuple(replace(by_name[name], index=found[name]) for name in ordered),
        "n_layers": len(calls),
        "n_heads": heads.pop(),
        "causal": all(causal for _, _, _, causal in calls),
    }
