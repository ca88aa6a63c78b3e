"""Reading a model's attention, by whichever path: the one place that dispatches, and the probes that check it.

`pattern_forward` runs a loaded model with hooks on its layers' attention and hands each layer's pattern (or,
in chunked mode, each block of its query rows) to them: through the TransformerBridge's hook points
(``transformer_lens``), through forward hooks on the Hugging Face attention modules (``hf_hooks``), or through
headscan's chunked attention function (`headscan.models.chunked`). `check` runs the probe sentence through it
as a model loads; `chunked_refusal` says whether chunked mode reproduces a model's eager attention.

This module does not load models (see `headscan.models.load`) or score heads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from ..errors import ConfigError, ModelLoadError
from . import chunked, hooks
from .hooked import PROBE, HookedModel

__all__ = ["pattern_forward", "check", "chunked_refusal", "probe_refusal", "refused"]

EAGER_INSTEAD = chunked.EAGER_INSTEAD


def refused(model: HookedModel, reason: str, instead: str = EAGER_INSTEAD) -> ModelLoadError:
    """The one error for a model that chunked mode cannot run, with the reason `chunked_refusal` gave and what to
    do instead (a sweep's --attention eager; retrieval, which has no eager mode, says its own)."""
    return ModelLoadError(f"model {model.name!r} cannot run chunked attention: {reason}{instead}")


@contextlib.contextmanager
def pattern_forward(model: HookedModel, hooks_by_layer: dict[int, Callable], attention: str = "eager",
                    query_chunk: int | None = None, internals: dict[str, dict[int, Callable]] | None = None):
    """Attach `hooks_by_layer` (layer -> ``hook(pattern, hook)``) for forward passes that only read patterns.

    Yields ``forward(input_ids, attention_mask)``. This is the one dispatch between the bridge, forward hooks on
    the Hugging Face modules, and chunked attention. The hooks must not write into what they are handed; what
    they return is ignored on the ``hf_hooks`` path and replaces the pattern on the bridge, so return None.
    The forward pass runs without autograd (inference mode) and stops at the last hooked layer's pattern
    when nothing else of that layer is wanted (else after its block), so the output head never runs
    (the vocabulary projection alone is about half of minilm's forward and a fifth of smollm2's:
    benchmarks/bridge_overhead.py), nor, when only patterns (and values) are wanted, the last layer's MLP.

    ``attention="eager"``: each hook gets its layer's whole pattern, (batch, head, q, k), once per forward;
    its second argument says where it was read (a TransformerLens ``HookPoint`` or a `PatternSite`).

    ``attention="chunked"``: the pattern is never built. Each hook is called once per block of at most
    `query_chunk` queries (None: as many as keep a block within 8 MiB, `headscan.models.chunked.block_rows`),
    in order, with rows ``start .. stop - 1`` of the pattern, (batch, head, block, k),
    exactly as eager attention gives them (`headscan.models.chunked`), and a `QueryBlock` saying which rows
    they are. A model whose scores chunked mode cannot reproduce is refused (`chunked_refusal`).

    `internals` also hands over other per-layer tensors of the same forward pass, never to be written into:
    ``{"v": {layer: fn}, "z": {layer: fn}, "out": {layer: fn}}`` calls ``fn(tensor, layer)`` with the
    layer's values, (batch, k, kv_head, d_head), value bias included, before the layer's pattern hook; its
    per-head attention output before the output projection, (batch, q, head, d_head); or the residual
    stream after the layer's block, (batch, q, d_model). A layer named only there is run to as well.
    Eager mode hands them over on the ``transformer_lens`` path (the bridge's ``hook_v``, ``hook_z`` and
    ``hook_out``); chunked mode hands over v and z on both paths, and "out" on the ``transformer_lens``
    path. Elsewhere asking for them is a `ConfigError`.
    """
    internals = {kind: dict(by_layer) for kind, by_layer in (internals or {}).items()}
    unknown = sorted(set(internals) - set(chunked.INTERNALS))
    if unknown:
        raise ConfigError(f"internals: unknown kind {unknown[0]!r}; choose from {', '.join(chunked.INTERNALS)}")
    if attention not in ("eager", "chunked"):
        raise ConfigError(f"attention must be eager or chunked here (auto is decided by the sweep); got {attention!r}",
                          setting="attention")
    if query_chunk is not None and (isinstance(query_chunk, bool) or not isinstance(query_chunk, int) or query_chunk < 1):
        raise ConfigError(f"query_chunk must be a whole number >= 1 (or None: sized by bytes), got {query_chunk!r}",
                          setting="query_chunk")
    layers = set(hooks_by_layer).union(*internals.values())
    outside = sorted(layer for layer in layers if not 0 <= layer < model.n_layers)
    if outside:
        raise ConfigError(f"layer {outside[0]} is out of range for {model.name} (0..{model.n_layers - 1})")
    last = max(layers, default=model.n_layers - 1)
    if attention == "chunked":
        reason = chunked_refusal(model)
        if reason is not None:
            raise refused(model, reason)
        with torch.inference_mode(), chunked.chunked_forward(model, hooks_by_layer, last, query_chunk=query_chunk,
                                                             internals=internals) as forward:
            yield forward
        return
    if any(internals.values()) and model.path != "transformer_lens":
        raise ConfigError(f"internals: {model.name} is read through Hugging Face forward hooks (path hf_hooks), "
                          f"which hand over attention patterns only; in eager mode internals need the "
                          f"transformer_lens path")
    with torch.inference_mode():
        if model.path == "transformer_lens":
            with hooks.bridge_forward(model.bridge, hooks_by_layer, last, internals) as forward:
                yield forward
        else:
            with hooks.module_forward(model, hooks_by_layer, last) as forward:
                yield forward


def check(model: HookedModel) -> None:
    """Run the probe sentence through `pattern_forward`, as a sweep would, and check what every layer hands over."""
    ids = torch.tensor([model.token_ids([PROBE])[0]], dtype=torch.long, device=model.device)
    n = ids.shape[1]
    seen = {}

    def capture(layer: int):
        def hook(pattern, hook):
            seen[layer] = pattern.detach().float().cpu()

        return hook

    with pattern_forward(model, {layer: capture(layer) for layer in range(model.n_layers)}) as forward:
        forward(ids, torch.ones_like(ids))
    missing = [layer for layer in range(model.n_layers) if layer not in seen]
    if missing:
        raise hooks.Unhookable(f"no attention pattern from layer {missing[0]}")
    tolerance = 1e-3 if next(model.hf_model.parameters()).dtype == torch.float32 else 2e-2
    for layer, pattern in seen.items():
        if tuple(pattern.shape) != (1, model.n_heads, n, n):
            raise hooks.Unhookable(f"layer {layer} gave a pattern of shape {tuple(pattern.shape)}, "
                                   f"expected (1, {model.n_heads}, {n}, {n})")
        if not torch.allclose(pattern.sum(-1), torch.ones(()), atol=tolerance):
            raise hooks.Unhookable(f"layer {layer}'s attention rows do not sum to 1")
    causal = all(bool((p.triu(1) == 0).all()) for p in seen.values())
    if causal != model.causal:
        raise hooks.Unhookable(f"it was taken for {model.family} but its probe pattern is "
                               f"{'' if causal else 'not '}lower-triangular")


def chunked_refusal(model: HookedModel) -> str | None:
    """None when chunked mode reproduces `model`'s scores exactly, else one sentence saying why not.

    Checked once per model (the answer is kept on it): static checks, then `probe_refusal`.
    """
    if not model._chunked_refusal:
        model._chunked_refusal.append(probe_refusal(model))
    return model._chunked_refusal[0]


def probe_refusal(model: HookedModel) -> str | None:
    """`chunked_refusal` computed afresh: None when chunked mode reproduces `model`'s scores exactly.

    After the static checks, a probe (two sentences of different lengths, so padding counts) runs through eager
    and chunked mode with blocks of 3 queries, and every layer's rows of real queries must agree to 1e-4.
    """
    reason = chunked.static_refusal(model)
    if reason is not None:
        return reason
    ids = model.token_ids([PROBE, "A short one."])
    n = max(map(len, ids))
    pad = model.special_token_ids["pad"] or 0
    input_ids = torch.tensor([row + [pad] * (n - len(row)) for row in ids], device=model.device)
    mask = torch.tensor([[1] * len(row) + [0] * (n - len(row)) for row in ids], device=model.device)
    real = mask.bool()
    eager, blocks = {}, {}

    def keep(store, layer):
        def hook(pattern, hook):
            store.setdefault(layer, []).append(pattern.detach().float().cpu())
        return hook

    layers = range(model.n_layers)
    try:
        with pattern_forward(model, {layer: keep(eager, layer) for layer in layers}) as forward:
            forward(input_ids, mask)
        with torch.inference_mode(), chunked.chunked_forward(model, {layer: keep(blocks, layer) for layer in layers},
                                                             model.n_layers - 1, query_chunk=3) as forward:
            forward(input_ids, mask)
    except ModelLoadError as error:
        text = str(error).removeprefix(f"{model.name}: ").removesuffix(EAGER_INSTEAD)
        if "attention layers went through" in text:
            return (f"the attention modules of {type(model.hf_model).__name__} do not call transformers' attention "
                    f"functions ({text.split(' of ')[0].removeprefix('only ')} of {model.n_layers} layers did), so "
                    f"chunked mode cannot recompute their scores")
        return text
    rows = real[:, None, :, None].cpu()  # (batch, 1, q, 1): rows of real queries
    for layer in layers:
        want = eager[layer][0]
        got = torch.cat(blocks[layer], dim=-2)
        if got.shape != want.shape:
            return f"chunked attention gave layer {layer} rows of shape {tuple(got.shape)}, eager {tuple(want.shape)}"
        gap = float(torch.where(rows, (got - want).abs(), 0).max())
        if not gap <= 1e-4:
            return (f"chunked attention differs from the model's eager attention by {gap:.1e} at layer {layer}, so its "
                    f"scores are not reproduced exactly")
    return None
