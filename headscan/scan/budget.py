"""Eager or chunked: how much memory a layer's attention takes either way, and which one a sweep runs.

``attention="auto"`` goes chunked when one layer's eager attention would pass the budget and chunked mode
reproduces the model's scores (`headscan.models.HookedModel.chunked_refusal`); the estimates are measured
(benchmarks/long_context.py).

This module does not run models: it reads their shape.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch

from ..models.chunked import block_rows
from ..models.forward import refused

if TYPE_CHECKING:
    from ..models import HookedModel

__all__ = ["TEMPORARIES", "eager_bytes", "chunked_bytes", "default_budget_mib", "choose"]

# Eager mode holds, per layer at its peak, about this many (batch, head, q, k) float32 tensors: the scores and
# the pattern inside the attention (the mask adds one (batch, 1, q, k)), then the pattern with the metrics' own
# temporaries (the masked copy, x log x, products with masks). Measured with benchmarks/long_context.py on
# smollm2 (peak resident memory growth over the q^2 term): see `eager_bytes`.
TEMPORARIES = 4


def eager_bytes(n_heads: int, batch: int, seq: int) -> int:
    """Estimated peak extra bytes of one layer in eager mode: `TEMPORARIES` float32 (batch, head, seq, seq)
    tensors (scores, pattern, the metrics' temporaries) plus the model's float mask.

    >>> eager_bytes(9, 1, 8192) // 2**20  # smollm2 at 8k tokens
    9472
    """
    return 4 * batch * seq * seq * (TEMPORARIES * n_heads + 1)


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


def choose(model: HookedModel, *, batch_size: int, max_len: int, budget_mib: int | None = None,
           attention: str = "auto") -> str:
    """``"eager"`` or ``"chunked"`` for `attention` (``auto``, ``eager`` or ``chunked``) on `model`.

    ``auto`` goes chunked when one layer's eager attention would take more than `budget_mib` (default:
    `default_budget_mib` of the model's device) and chunked mode reproduces the model's scores; ``chunked`` on a
    model that it cannot reproduce raises `ModelLoadError` with the reason.
    """
    if attention == "eager":
        return "eager"
    if attention == "chunked":
        reason = model.chunked_refusal()
        if reason is not None:
            raise refused(model, reason)
        return "chunked"
    budget = (budget_mib if budget_mib is not None else default_budget_mib(str(model.device))) * 2**20
    if eager_bytes(model.n_heads, batch_size, max_len) <= budget:
        return "eager"
    return "chunked" if model.chunked_refusal() is None else "eager"
