"""Greedy decoding that hands over each step's attention rows: what the retrieval score reads.

`greedy_decode` runs a prompt as Wu et al.'s (2024) reference code does: a prefill of every prompt token but
the last, then greedy steps with the key/value cache, the first of which feeds the last prompt token. Every
forward pass goes through headscan's chunked attention (`headscan.models.chunked.cached_forward`), so the
prefill never builds a (head, n, n) pattern, and a decoding step computes one query row per head. The prefill
feeds the prompt onto the cache in pieces of `PREFILL_CHUNK` tokens, so the MLP and residual activations are
those of one piece, whatever the prompt's length: memory grows linearly with the prompt only through the cache
(plus one block of rows and one piece's activations), where eager attention needs heads x n^2 per layer
(benchmarks/long_context.py measures both). The pieces give the rows and tokens of a one-pass prefill (tested
against Hugging Face's in tests/test_retrieval.py).

Each step hands `each` a `Step`: the token it chose (the argmax of the last position's logits; ties to the
lowest id) and every layer's attention row of the query that chose it, (1, head, 1, k) float32, the rows
eager attention gives. A sliding-window layer's cache keeps only its window's keys; its row is put back at
their positions, with 0 on the keys before the window, so every row has one entry per position.

This module does not score heads (see `headscan.metrics.retrieval`) or build prompts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..errors import ModelLoadError
from . import chunked
from .forward import chunked_refusal, refused

if TYPE_CHECKING:
    from .hooked import HookedModel

__all__ = ["PREFILL_CHUNK", "Step", "greedy_decode", "language_model"]

PREFILL_CHUNK = 1024  # prompt tokens per prefill forward pass: bounds the activations, not the cache


@dataclass(frozen=True)
class Step:
    """One greedy decoding step."""

    token: int  # the token this step generated
    position: int  # position of the query whose rows these are: the token fed to this step (0-based)
    rows: dict[int, torch.Tensor]  # layer -> (1, head, 1, position + 1): that query's attention over every key


def greedy_decode(model: HookedModel, prompt: Sequence[int], each: Callable[[Step], None], *, max_new_tokens: int,
                  stop: Callable[[int], bool], query_chunk: int = 512, prefill_chunk: int = PREFILL_CHUNK) -> list[int]:
    """Decode greedily after `prompt` (token ids, BOS included if wanted): call ``each(step)`` for every step
    and return the generated ids. Stops after `max_new_tokens` steps, or after a step whose token `stop` says
    ends the answer (that step is handed over and returned too). The prompt is prefilled `prefill_chunk` tokens
    at a time; attention runs in blocks of `query_chunk` queries.

    Raises `ModelLoadError` for a bidirectional model, or one whose attention chunked mode cannot reproduce.
    """
    if not model.causal:
        raise ModelLoadError(f"model {model.name!r} is bidirectional: it generates no answer to decode; use a causal "
                             f"(decoder) model")
    if len(prompt) < 1:
        raise ValueError("an empty prompt has no last token to decode from")
    if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
        raise ValueError(f"prefill_chunk must be a whole number >= 1, got {prefill_chunk!r}")
    reason = chunked_refusal(model)
    if reason is not None:
        raise refused(model, reason)
    rows: dict[int, torch.Tensor] = {}
    decoding = [False]  # the prefill's blocks are not kept

    def keep(layer: int):
        def hook(weights, block):
            if decoding[0]:
                rows[layer] = weights  # a fresh tensor per block: keeping it is safe
        return hook

    ids = torch.tensor([list(prompt)], dtype=torch.long, device=model.device)  # (1, n)
    generated: list[int] = []
    with chunked.cached_forward(model, language_model(model), {layer: keep(layer) for layer in range(model.n_layers)},
                                query_chunk=query_chunk) as forward:
        cache = None
        for start in range(0, ids.shape[1] - 1, prefill_chunk):  # every token but the last, piece by piece
            cache = forward(ids[:, start:min(start + prefill_chunk, ids.shape[1] - 1)], cache)[1]
        decoding[0] = True
        fed, position = ids[:, -1:], ids.shape[1] - 1
        for _ in range(max_new_tokens):
            rows.clear()
            logits, cache = forward(fed, cache)  # (1, 1, vocab)
            token = int(logits[0, -1].argmax())
            generated.append(token)
            each(Step(token, position, {layer: _at_positions(row, position + 1) for layer, row in rows.items()}))
            if stop(token):
                break
            fed, position = torch.tensor([[token]], dtype=torch.long, device=model.device), position + 1
    return generated


def _at_positions(row: torch.Tensor, n_keys: int) -> torch.Tensor:
    """(1, head, 1, k) -> (1, head, 1, n_keys): a sliding-window layer's cache holds only its last k keys, so its
    row covers positions n_keys - k .. n_keys - 1; the keys it no longer holds get weight 0, as in eager
    attention's row over the whole sequence."""
    missing = n_keys - row.shape[-1]
    if missing < 0:
        raise RuntimeError(f"a decoding row has {row.shape[-1]} keys, more than the {n_keys} positions decoded so far")
    return torch.nn.functional.pad(row, (missing, 0)) if missing else row


def language_model(model: HookedModel):
    """`model`'s causal language model, head included: its own Hugging Face model, or, on the ``hf_hooks`` path
    (which loads the body without its head), the same checkpoint loaded once more with its head, kept on the
    model for later calls."""
    hf_model = model.hf_model
    if hasattr(hf_model, "get_output_embeddings") and hf_model.get_output_embeddings() is not None:
        return hf_model
    if "language_model" not in model.loaded:
        from transformers import AutoModelForCausalLM

        dtype = next(hf_model.parameters()).dtype
        try:
            lm = AutoModelForCausalLM.from_pretrained(model.id, attn_implementation="eager", dtype=dtype)
        except (OSError, ValueError) as error:
            raise ModelLoadError(f"model {model.name!r}: decoding needs its language-model head, which could not be "
                                 f"loaded from {model.id} ({str(error).splitlines()[0][:120]})") from None
        model.loaded["language_model"] = lm.to(model.device).eval()
    return model.loaded["language_model"]
