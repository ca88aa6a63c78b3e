"""Chunked attention: every head scored at long contexts without the whole (batch, head, q, k) pattern.

A row of a softmax needs only its own query: ``softmax(q_i K^T * scale + mask_i)``. Under
``attention="chunked"`` the model runs with an attention function that headscan registers in transformers'
``AttentionInterface`` under the name ``"headscan_chunked"`` (with ``sdpa``'s boolean masks). Every attention
module hands it exactly what it would hand its eager attention: the queries and keys *after* the position
embedding (rotary or not), the values, the mask the model built for that layer (causal, padding, sliding
window), the scale and the soft-cap. The function computes the layer's attention one block of ``query_chunk``
queries at a time as eager attention does (scores, scale, soft-cap, mask, float32 softmax, grouped-query key
sharing without copying the keys), hands each block of weights to the layer's pattern hook, multiplies it into
the values for the layer's output, and drops it. The layer's output is eager attention's, block by block, so
the rest of the forward pass is what eager mode runs; the attention memory is one block, (batch, head,
query_chunk, k), plus the model's boolean mask (none without padding), instead of several (batch, head, q, k).

Two choices, measured (benchmarks/long_context.py):

- The output comes from the recomputed blocks, not from the model's SDPA: the hooks need every block's weights
  anyway, so the output costs one (block, k) x (k, d_head) product per block, where SDPA would compute QK^T a
  second time.
- TransformerLens' bridge reimplements rotary attention eagerly (its ``PositionEmbeddingsAttentionBridge``
  builds the full scores and pattern whatever the model's attention implementation, and fires
  ``hook_rot_q``/``hook_rot_k`` only there), so reading the bridge's hooks would save nothing. On that path
  chunked mode routes each attention bridge straight to its Hugging Face module for the forward pass.

Where the scores cannot be reproduced exactly (ALiBi, attention sinks, relative position biases, attention
modules that never call transformers' attention functions), `static_refusal` says why from the configuration,
and `headscan.models.forward.chunked_refusal` runs a short probe through both modes and compares every
layer's rows. When a sweep goes chunked is `headscan.scan.budget`'s choice.

This module does not score heads: it hands blocks of rows to the hooks that do.
"""

from __future__ import annotations

import contextlib
import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..errors import ModelLoadError
from .hooks import BRIDGE_INTERNALS, QueryBlock, Stop, call_backbone, unobserved_norms
from .sites import backbone

if TYPE_CHECKING:
    from .hooked import HookedModel

__all__ = ["NAME", "INTERNALS", "EAGER_INSTEAD", "QueryBlock", "Unsupported", "attention_blocks", "chunked_forward",
           "cached_forward", "static_refusal"]

NAME = "headscan_chunked"  # the attention implementation headscan registers with transformers
EAGER_INSTEAD = "; use --attention eager"  # how every refusal of chunked mode ends
INTERNALS = ("v", "z", "out")  # what `chunked_forward` can hand over besides patterns (see its docstring)

# Keyword arguments of an attention call that change the scores in ways this module does not reproduce.
_UNSUPPORTED = {
    "s_aux": "attention sinks (a learned logit per head joins the softmax)",
    "sinks": "attention sinks (a learned logit per head joins the softmax)",
    "position_bias": "a relative position bias added to the scores",
    "alibi": "ALiBi position biases",
}


class Unsupported(Exception):
    """Chunked attention cannot reproduce this model's scores; the message says why, in a few words."""


# With no query chunk given, a block holds as many queries as keep its float32 weights within BLOCK_BYTES, and at
# least MIN_BLOCK: at ordinary lengths a whole layer is one block, so chunked mode scores as few blocks as eager
# mode scores layers (fixed-size blocks of 64 queries made a 1,024-token sweep twice as slow as eager), while at
# long contexts a block stays a few MiB. Eager mode stacks layers up to the same size (`headscan.scan.layers`).
# It stays well below 16 MiB because glibc's malloc hands out any block over 32 MiB (its largest mmap threshold)
# as fresh pages from the kernel and returns them when freed: the metrics' float64 temporaries of 32 MiB of
# weights were faulted in anew on every operation, which tripled a minilm sweep's minor page faults and cost it
# 10-25% of its time (and made blocks of 512 queries at 4k tokens 2.6 times slower than blocks of 64).
BLOCK_BYTES = 8 * 2**20
MIN_BLOCK = 64


def block_rows(query_chunk: int | None, batch: int, n_heads: int, n_keys: int, n_queries: int | None = None) -> int:
    """Queries per block: `query_chunk` when given, else sized by `BLOCK_BYTES` (at least `MIN_BLOCK`) and spread
    evenly over the `n_queries` (default: `n_keys`), so that no block is a small remainder.

    >>> block_rows(None, 16, 12, 40), block_rows(None, 8, 9, 256), block_rows(None, 1, 9, 4096), block_rows(16, 1, 9, 4096)
    (40, 86, 64, 16)
    """
    if query_chunk is not None:
        return query_chunk
    n_queries = n_keys if n_queries is None else n_queries
    largest = max(MIN_BLOCK, BLOCK_BYTES // (4 * batch * n_heads * n_keys))
    blocks = max(1, -(-n_queries // largest))  # ceil: as few blocks as the budget allows ...
    return max(1, -(-n_queries // blocks))  # ... each of about the same size


# --- the attention of one layer, block by block ------------------------------------------------------------


def attention_blocks(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, *, scaling: float,
                     causal: bool, chunk: int, softcap: float | None = None):
    """Yield ``(start, stop, weights)`` for consecutive blocks of at most `chunk` queries.

    `query` is (batch, head, q, d), `key` (batch, kv_head, k, d) with head a multiple of kv_head (query head h
    reads key head h // (head // kv_head), as transformers' ``repeat_kv``), `mask` None or (batch, 1 or head,
    q or 1, k): boolean (True: attend) or additive. The queries are the last q of the k positions (all of them
    without a key/value cache). With no mask, `causal` says whether query i sees only keys up to its own
    position. `weights` (batch, head, stop - start, k) are softmax(q K^T * scaling [soft-capped] + mask) in float32
    (the model's dtype when that is wider), the rows eager attention gives; a new tensor per block, which the
    caller may keep or drop.

    >>> q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    >>> rows = torch.cat([w for _, _, w in attention_blocks(q, k, None, scaling=8 ** -0.5, causal=True, chunk=2)], -2)
    >>> eager = (q @ k.repeat_interleave(2, 1).transpose(-1, -2) * 8 ** -0.5).masked_fill(
    ...     torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    >>> torch.allclose(rows, eager, atol=1e-6)
    True
    """
    batch, n_heads, n_q, d = query.shape
    kv_heads, n_k = key.shape[1], key.shape[2]
    group = n_heads // kv_heads
    keys_t = key.transpose(-1, -2)  # (batch, kv_head, d, k): a view; keys are never copied per query head
    lowest = torch.finfo(torch.promote_types(query.dtype, torch.float32)).min
    key_positions = torch.arange(n_k, device=query.device)
    for start in range(0, n_q, chunk):
        stop = min(start + chunk, n_q)
        block = query[:, :, start:stop].reshape(batch, kv_heads, group * (stop - start), d)  # heads of a group stacked
        scores = torch.matmul(block, keys_t).view(batch, n_heads, stop - start, n_k)  # (batch, head, block, k)
        scores = scores.float() if scores.dtype.itemsize < 4 else scores  # float32 softmax, as eager attention
        scores.mul_(scaling)  # a fresh tensor, so in-place is safe (and one block of memory less)
        if softcap is not None:
            scores.div_(softcap).tanh_().mul_(softcap)
        if mask is not None:
            rows = mask[:, :, start:stop] if mask.shape[-2] > 1 else mask  # (batch, 1 or head, block, k)
            if rows.dtype == torch.bool:
                scores.masked_fill_(~rows, lowest)
            else:
                scores.add_(rows)
        elif causal:
            query_positions = torch.arange(start, stop, device=query.device) + (n_k - n_q)  # absolute positions
            scores.masked_fill_(key_positions[None, :] > query_positions[:, None], lowest)  # (block, k)
        # softmax in place: the same values as torch.softmax to float rounding, without a second block
        scores.sub_(scores.amax(-1, keepdim=True)).exp_()
        scores.div_(scores.sum(-1, keepdim=True))
        yield start, stop, scores


# --- the attention function transformers calls -------------------------------------------------------------


@dataclass
class _Session:
    """What one chunked forward pass does at each layer; layers are told apart by call order."""

    hooks: dict[int, Callable]
    internals: dict[str, dict[int, Callable]]
    query_chunk: int | None  # None: sized by bytes (`block_rows`)
    last: int | None  # the pass stops after this layer's attention; None: it runs to the end (decoding)
    cache: bool = False  # queries may be the last few positions of longer keys (a key/value cache: decoding)
    layer: int = 0
    seen: list = field(default_factory=list)  # (layer, module class) of every call, for messages


_SESSIONS: list[_Session] = []


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature: (batch, seq, head, d_head) output and no weights."""
    if not _SESSIONS:
        raise RuntimeError(f"attention implementation {NAME!r} runs only inside headscan's chunked forward pass")
    session = _SESSIONS[-1]
    layer = session.layer
    session.layer += 1
    session.seen.append(type(module).__name__)
    for name, what in _UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            raise Unsupported(f"{type(module).__name__} adds {what}, which chunked attention does not reproduce")
    if dropout and module.training:
        raise Unsupported("attention dropout is on (the model is in training mode)")
    if query.shape[2] != key.shape[2] and not (session.cache and query.shape[2] < key.shape[2]):
        raise Unsupported(f"queries and keys differ in length ({query.shape[2]} and {key.shape[2]}): a cache or "
                          f"cross-attention")
    batch, n_heads, n_q, _ = query.shape
    kv_heads, n_k = key.shape[1], key.shape[2]
    offset = n_k - n_q  # with a cache, the queries are the last n_q positions
    if n_heads % kv_heads:
        raise Unsupported(f"{n_heads} query heads do not share {kv_heads} key heads evenly")
    group = n_heads // kv_heads
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    # transformers' sdpa: no mask means a plain causal (or full) mask; the module says which
    is_causal = kwargs.get("is_causal")
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal) and n_q > 1
    hook = session.hooks.get(layer)
    internals = {kind: hooks.get(layer) for kind, hooks in session.internals.items()}
    if internals.get("v") is not None:
        internals["v"](value.transpose(1, 2), layer)  # (batch, k, kv_head, d_head)
    output = value.new_empty(batch, n_q, n_heads, value.shape[-1])  # (batch, q, head, d_head), as eager returns it
    values = value  # (batch, kv_head, k, d_head)
    for start, stop, weights in attention_blocks(query, key, attention_mask, scaling=scaling, causal=causal,
                                                 chunk=block_rows(session.query_chunk, batch, n_heads, n_k, n_q),
                                                 softcap=kwargs.get("softcap")):
        if hook is not None:
            hook(weights, QueryBlock(layer, offset + start, offset + stop, n_k))
        size = stop - start
        mixed = torch.matmul(weights.to(value.dtype).view(batch, kv_heads, group * size, -1), values)
        output[:, start:stop] = mixed.view(batch, n_heads, size, -1).transpose(1, 2)  # our own tensor
        del weights, mixed
    if internals.get("z") is not None:
        internals["z"](output, layer)  # (batch, q, head, d_head)
    if session.last is not None and layer >= session.last:
        raise Stop
    return output, None


_registered = False


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, _attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # boolean masks, or None where causality says it all
    _registered = True


@contextlib.contextmanager
def _implementation(hf_model, name: str):
    """Every config of `hf_model` says `name` for the duration of the block."""
    from transformers import PretrainedConfig

    configs = {id(hf_model.config): hf_model.config}
    for module in hf_model.modules():
        config = getattr(module, "config", None)
        if isinstance(config, PretrainedConfig):
            configs[id(config)] = config
            for key in getattr(config, "sub_configs", {}) or {}:
                sub = getattr(config, key, None)
                if isinstance(sub, PretrainedConfig):
                    configs[id(sub)] = sub
    before = {key: config._attn_implementation_internal for key, config in configs.items()}
    try:
        for config in configs.values():
            config._attn_implementation_internal = name
        yield
    finally:
        for key, config in configs.items():
            config._attn_implementation_internal = before[key]


@contextlib.contextmanager
def _native_attention(model: HookedModel):
    """On the bridge, each attention bridge that reimplements attention delegates to its Hugging Face module."""
    if model.path != "transformer_lens":
        yield
        return
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge

    swapped = []
    try:
        for module in model.bridge.modules():
            if isinstance(module, AttentionBridge) and type(module).forward is not AttentionBridge.forward:
                # straight into __dict__: the bridge's components pass attribute writes on to the wrapped module
                module.__dict__["forward"] = types.MethodType(AttentionBridge.forward, module)
                swapped.append(module)
        yield
    finally:
        for module in swapped:
            module.__dict__.pop("forward", None)


@contextlib.contextmanager
def chunked_forward(model: HookedModel, hooks: dict[int, Callable], last: int, *, query_chunk: int | None,
                    internals: dict[str, dict[int, Callable]] | None = None):
    """Yield ``forward(input_ids, attention_mask)`` that calls ``hooks[layer](block, QueryBlock)`` once per block
    of at most `query_chunk` queries (None: `block_rows`) of each hooked layer, in order, and stops after layer
    `last`.

    `internals` maps a kind in `INTERNALS` to {layer: fn(tensor, layer)}: ``"v"`` gets the layer's values as
    attention reads them, (batch, k, kv_head, d_head); ``"z"`` its per-head output before the output
    projection, (batch, q, head, d_head); ``"out"`` (``transformer_lens`` path only: the bridge's
    ``blocks.{L}.hook_out``) the residual stream after the layer's block, (batch, q, d_model). None may be
    written into. With an "out" at layer `last` the pass runs to the end of that block rather than stopping
    after its attention.
    """
    from ..errors import ConfigError

    internals = {kind: dict(by_layer) for kind, by_layer in (internals or {}).items()}
    outs = internals.pop("out", {})
    if outs and model.path != "transformer_lens":
        raise ConfigError(f"internals: {model.name} is read through Hugging Face forward hooks (path hf_hooks); the "
                          f"residual stream after a block ('out') is handed over on the transformer_lens path only")
    _register()
    # with the last block's residual wanted, its hook_out stops the pass; else the last attention does
    session = _Session(dict(hooks), internals, query_chunk, last + 1 if last in outs else last)
    body = backbone(model.hf_model)
    fwd_hooks = [(f"blocks.{layer}.{BRIDGE_INTERNALS['out']}", _handing_out(fn, layer, layer == last))
                 for layer, fn in outs.items()]

    def forward(input_ids, attention_mask) -> None:
        session.layer = 0
        session.seen.clear()
        _SESSIONS.append(session)
        try:
            if model.path == "transformer_lens":
                with model.bridge.hooks(fwd_hooks=fwd_hooks) if fwd_hooks else contextlib.nullcontext():
                    model.bridge(input_ids, attention_mask=attention_mask)
            else:
                call_backbone(body, input_ids, attention_mask)
        except Stop:
            return
        except Unsupported as error:
            raise ModelLoadError(f"{model.name}: {error}{EAGER_INSTEAD}") from None
        finally:
            _SESSIONS.pop()
        raise ModelLoadError(f"{model.name}: only {session.layer} of its attention layers went through chunked "
                             f"attention (expected {last + 1}){EAGER_INSTEAD}")

    # the bridge's norms as in eager mode: nobody reads their statistics here either
    with _implementation(model.hf_model, NAME), _native_attention(model), unobserved_norms(model.bridge):
        yield forward


@contextlib.contextmanager
def cached_forward(model: HookedModel, language_model, hooks: dict[int, Callable], *, query_chunk: int | None):
    """Yield ``forward(input_ids, cache)``: a whole forward pass of `language_model` (`model`'s causal LM, its
    head included) with a key/value cache (None to start one), returning the logits of the last position and
    the cache to pass on.

    Every layer's attention goes through chunked attention: the queries may be the last positions of the keys
    (a cache), and ``hooks[layer](rows, QueryBlock)`` gets each block's rows with absolute query positions
    (one row per decoding step). Nothing stops the pass early: the next token needs the logits.
    """
    _register()
    session = _Session(dict(hooks), {}, query_chunk, None, cache=True)
    # transformers 5 renamed the cache argument (past_key_values -> cache) along the way
    name = "cache" if "cache" in inspect.signature(type(language_model).forward).parameters else "past_key_values"

    def forward(input_ids, cache):
        session.layer = 0
        session.seen.clear()
        _SESSIONS.append(session)
        try:
            output = language_model(input_ids=input_ids, use_cache=True, logits_to_keep=1, **{name: cache})
        except Unsupported as error:
            raise ModelLoadError(f"{model.name}: {error}{EAGER_INSTEAD}") from None
        finally:
            _SESSIONS.pop()
        if session.layer != model.n_layers:
            raise ModelLoadError(f"{model.name}: {session.layer} of its {model.n_layers} attention layers went "
                                 f"through chunked attention{EAGER_INSTEAD}")
        cache = getattr(output, "cache", None)
        return output.logits, cache if cache is not None else output.past_key_values

    with torch.inference_mode(), _implementation(language_model, NAME), _native_attention(model):
        yield forward


def _handing_out(fn: Callable, layer: int, stop: bool) -> Callable:
    def hook(residual, hook):
        fn(residual, layer)
        if stop:
            raise Stop

    return hook


# --- whether a model can run chunked -----------------------------------------------------------------------


def static_refusal(model: HookedModel) -> str | None:
    """Why chunked mode cannot reproduce `model`'s scores, from its configuration alone; None if nothing says so."""
    config = model.hf_model.config.get_text_config()
    kind = getattr(config, "model_type", "") or type(model.hf_model).__name__
    if getattr(config, "alibi", False) or kind in ("bloom", "mpt"):
        return f"{kind} adds ALiBi biases inside its attention module; ALiBi is not implemented in chunked mode"
    if getattr(config, "position_embedding_type", "absolute") in ("relative_key", "relative_key_query"):
        return f"{kind} adds relative position scores inside its attention module"
    if getattr(model.hf_model, "_supports_attention_backend", None) is False and model.path == "hf_hooks":
        return (f"{type(model.hf_model).__name__}'s attention modules do not call transformers' attention functions, "
                f"so the hf_hooks path cannot read their queries and keys")
    return None
