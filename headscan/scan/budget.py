"""Eager or chunked: how much memory a layer's attention takes either way, and which one a sweep runs.

``attention="auto"`` goes chunked, where chunked mode reproduces the model's scores
(`headscan.models.chunked_refusal`), once one layer's eager pattern passes `EAGER_LAYER_BYTES`: from
there eager mode holds the model's whole pattern (and its scores) where chunked mode holds a block of a few MiB, and chunked
mode was measured no slower (docs/long-contexts.md). It also goes chunked wherever eager mode's estimate passes
the budget. The estimates are measured (benchmarks/long_context.py; docs/speed.md: what each mode holds at 4,096 tokens).

This module does not run models: it reads their shape.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from ..models.chunked import block_rows
from ..models.forward import chunked_refusal, refused

if TYPE_CHECKING:
    from ..models import HookedModel

__all__ = ["TEMPORARIES", "EAGER_LAYER_BYTES", "eager_bytes", "chunked_bytes", "default_budget_mib", "auto_mode",
           "choose"]

# Eager mode holds, per layer at its peak, about this many (batch, head, q, k) float32 tensors where it scores a
# layer's pattern whole: the bridge's scores and pattern, then the metrics' temporaries on top (the value-weighted
# pattern, the syntax metric's word attention products, each about a pattern's size at one word per token).
# Measured on smollm2 over one 2,048-token EWT segment, CoNLL-U, every table, scored whole: eager's
# whole-process peak over chunked's, 1,070 MiB, was 7.4 patterns of 144 MiB; see `eager_bytes`.
TEMPORARIES = 7
# A layer past `EAGER_LAYER_BYTES` is scored over blocks of its query rows (headscan.scan.layers), so eager mode
# holds only what the model's own attention does: its scores and its pattern, both alive during the softmax.
# Measured at 4,096 tokens (smollm2, one segment): eager's peak over chunked's was 660 MiB, one pattern of 576 MiB
# and the model's float mask (docs/speed.md).
MODEL_HELD = 2


def eager_bytes(n_heads: int, batch: int, seq: int) -> int:
    """Estimated peak extra bytes of one layer in eager mode, plus the model's float mask: `TEMPORARIES` float32
    (batch, head, seq, seq) tensors where the layer is scored whole; past `EAGER_LAYER_BYTES`, where it is scored
    over blocks of its query rows, the model's `MODEL_HELD` tensors and one block's temporaries (`chunked_bytes`).

    >>> eager_bytes(9, 1, 512) // 2**20, eager_bytes(9, 1, 4096) // 2**20  # smollm2 at 512 and 4k tokens
    (64, 1295)
    """
    pattern, mask = 4 * batch * n_heads * seq * seq, 4 * batch * seq * seq
    if pattern > EAGER_LAYER_BYTES:
        return MODEL_HELD * pattern + mask + chunked_bytes(n_heads, batch, seq, None)
    return TEMPORARIES * pattern + mask


def chunked_bytes(n_heads: int, batch: int, seq: int, query_chunk: int | None) -> int:
    """The same estimate in chunked mode: the temporaries of one block of queries (None: sized by bytes,
    `headscan.models.chunked.block_rows`), plus the boolean mask."""
    block = min(block_rows(query_chunk, batch, n_heads, seq), seq)
    return 4 * batch * block * seq * TEMPORARIES * n_heads + batch * seq * seq


def default_budget_mib(device: str) -> int:
    """MiB one layer's eager attention may take before ``attention="auto"`` goes chunked, by device kind:
    a quarter of the GPU's memory (cuda), 2 GiB on Apple MPS, a quarter of the RAM up to 8 GiB on CPU."""
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        return torch.cuda.get_device_properties(index).total_memory // 4 // 2**20
    if device.startswith("mps"):
        return 2048
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = 16 * 2**30
    return int(min(8192, ram // 4 // 2**20))


# Past this size one layer's eager pattern, and each of its temporaries, is handed out by glibc's malloc as fresh
# pages and faulted in anew on every operation (its largest mmap threshold; docs/speed.md), while chunked mode
# keeps its blocks within `headscan.models.chunked.BLOCK_BYTES`: from here on chunked mode holds a fraction of
# eager's memory and was measured no slower (smollm2, one segment: 1,024 tokens 77 s against 88 s; 4,096 tokens
# 72 s against 191 s, 2.2 GB against 2.9 GB whole-process).
EAGER_LAYER_BYTES = 32 * 2**20


def auto_mode(n_heads: int, batch: int, seq: int, budget_bytes: int, chunked_runs: bool = True) -> str:
    """What ``attention="auto"`` picks for a model of `n_heads` heads on batches of `batch` segments of `seq`
    tokens: ``"chunked"`` where chunked mode runs (`chunked_runs`) and either one layer's float32 pattern passes
    `EAGER_LAYER_BYTES` or eager mode's estimate (`eager_bytes`) passes `budget_bytes`; else ``"eager"``, the
    reference, which at these sizes is as fast.

    >>> auto_mode(9, 1, 1024, 8 * 2**30), auto_mode(9, 1, 512, 8 * 2**30), auto_mode(9, 1, 4096, 8 * 2**30, False)
    ('chunked', 'eager', 'eager')
    """
    if not chunked_runs:
        return "eager"
    layer = 4 * batch * n_heads * seq * seq
    return "chunked" if layer > EAGER_LAYER_BYTES or eager_bytes(n_heads, batch, seq) > budget_bytes else "eager"


def choose(model: HookedModel, *, batch_size: int, max_len: int, budget_mib: int | None = None,
           attention: str = "auto") -> str:
    """``"eager"`` or ``"chunked"`` for `attention` (``auto``, ``eager`` or ``chunked``) on `model`.

    ``auto`` is `auto_mode` with `budget_mib` (default: `default_budget_mib` of the model's device), asking
    the model whether chunked mode reproduces its scores only when it would go chunked; ``chunked`` on a model
    that it cannot reproduce raises `ModelLoadError` with the reason.
    """
    if attention == "eager":
        return "eager"
    if attention == "chunked":
        reason = chunked_refusal(model)
        if reason is not None:
            raise refused(model, reason)
        return "chunked"
    budget = (budget_mib if budget_mib is not None else default_budget_mib(str(model.device))) * 2**20
    if auto_mode(model.n_heads, batch_size, max_len, budget) == "eager":
        return "eager"
    return "chunked" if chunked_refusal(model) is None else "eager"
