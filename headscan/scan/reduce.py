"""The sweep: run a corpus through hooked models and reduce every layer's attention pattern as it is produced.

`sweep` is also ``headscan.sweep`` (this module is `headscan.scan`, so the two names cannot clash).

One forward pass per batch. A hook on each layer's attention pattern hands it, the padding mask and the token
ids to every registered metric, which reduces it at once to per-segment sums and counts; the pattern is then
dropped. No activation cache is kept, so peak memory does not grow with the corpus.

The corpus is cut into *windows* of whole bootstrap units (segments, or documents): a window's per-unit sums
are added into a `headscan.state.PartialState` when the window ends, with the unit's Poisson bootstrap weights
and power sums, so 95% intervals come from the same single pass. A state saved at a window end resumes bit
for bit, and the states of disjoint shards add up to the unsharded one (`headscan.state.merge_states`).

This module does not draw anything or parse command lines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .. import __version__, intervals
from ..metrics import syntax, values
from ..models import chunked
from ..config import SweepConfig
from ..corpus.text import Corpus, Segment, batches, encode
from ..errors import ConfigError, SweepInterrupted
from ..metrics.attention import METRICS, AttentionBatch, Metric
from ..models.hooks import QueryBlock
from ..models.load import HookedModel, resolve_device
from ..tables.provenance import CorpusProvenance, ModelProvenance, RunProvenance
from .state import FINGERPRINT_FIELDS, PartialState, Shard
from ..tables.io import TABLES, SweepTables, head_label

__all__ = ["sweep_model", "accumulate", "finish", "plan_windows", "fingerprint", "example_attention",
           "SweepInterrupted"]

# A metric, one position of its axis (() for a metric without one), and the table its rows go to: the metric's
# own, or "value" for a heads metric computed on value-weighted attention.
Column = tuple[Metric, tuple, str]


def has_words(corpus_kind: str) -> bool:
    """Whether a corpus of this kind carries gold words and trees (for the syntax table): CoNLL-U."""
    return corpus_kind == "conllu"


def columns_of(config: SweepConfig, words: bool = False) -> list[Column]:
    """The score columns of one head: each metric once per position of its axis, in registry order; then, with
    ``config.values``, every pattern metric of heads.parquet again on value-weighted attention (table "value").

    The syntax metric only where the corpus has `words` (CoNLL-U): elsewhere it would be an all-NaN table.
    Metrics that need captured internals (`Metric.needs`: moved, dla) only with ``config.values``.
    """
    own = [(metric, key, metric.table) for metric in METRICS.values()
           if (words or metric.table != "syntax") and (config.values or not metric.needs)
           for key in (metric.axis.values(config) if metric.axis else [()])]
    weighted = [(metric, (), "value") for metric in METRICS.values() if metric.table == "heads" and not metric.needs]
    return own + (weighted if config.values else [])


def _column_name(column: Column) -> list:
    metric, key, table = column
    return [metric.name, list(key)] + ([table] if table != metric.table else [])


def fingerprint(model: HookedModel, corpus: Corpus, config: SweepConfig) -> dict:
    """Everything two partial states must share to be added up, or a saved state to be resumed."""
    return {
        "headscan": __version__,
        "model": {"name": model.name, "id": model.id, "revision": model.revision},
        "corpus": {"source": corpus.source, "kind": corpus.kind, "sha256": corpus.sha256},
        "settings": {name: getattr(config, name) for name in FINGERPRINT_FIELDS},
        "columns": [_column_name(column) for column in columns_of(config, has_words(corpus.kind))],
    }


# --- one layer ---------------------------------------------------------------------------------------------


def _special_mask(tokens: torch.Tensor, model: HookedModel) -> torch.Tensor:
    ids = [i for i in model.special_token_ids.values() if i is not None]
    ids += list(getattr(model.tokenizer, "all_special_ids", []) or [])
    return torch.isin(tokens, torch.tensor(sorted(set(ids)), dtype=tokens.dtype, device=tokens.device))


def _batch_masks(input_ids: torch.Tensor, real: torch.Tensor, model: HookedModel, config: SweepConfig,
                 words=None) -> dict:
    """What every layer of one batch shares: the tokens that count and the [SEP] tokens, (batch, seq) each,
    and the batch's words (CoNLL-U) on the model's device."""
    counts = real & ~_special_mask(input_ids, model) if config.specials == "exclude" else real
    sep = model.special_token_ids["sep"]
    sep_mask = input_ids == sep if sep is not None else torch.zeros_like(real)
    words = words.to(input_ids.device) if words is not None else None
    next_tokens, _ = values.next_token_targets(input_ids, counts, real)  # (batch, seq): the token each query predicts
    return {"ids": input_ids, "counts": counts, "sep": sep_mask, "words": words, "next": next_tokens}


def _attention_batch(pattern: torch.Tensor, masks: dict, model: HookedModel, config: SweepConfig,
                     query_start: int = 0, norms: torch.Tensor | None = None) -> AttentionBatch:
    """The metrics' view of one layer's pattern, or of the rows ``query_start ..`` of it in chunked mode."""
    pattern = raw = pattern.float()  # (batch, head, q, k); a new tensor for half precision, the same one otherwise
    counts = masks["counts"]  # (batch, k): the keys that count; the block's rows of it are its queries
    if config.specials == "exclude":
        # Renormalise each query's attention over the keys that count: a new tensor, never written in place.
        kept = pattern * counts[:, None, None, :].to(pattern.dtype)
        pattern = kept / kept.sum(-1, keepdim=True).clamp_min(torch.finfo(pattern.dtype).tiny)
    queries = counts[:, query_start: query_start + pattern.shape[-2]]  # (batch, q)
    return AttentionBatch(pattern, queries, counts, masks["ids"], masks["sep"], model.causal, config.max_offset,
                          words=masks["words"], raw_pattern=raw if raw is not pattern else None,
                          query_start=query_start, max_len=min(config.max_len, model.max_context), value_norms=norms)


def _value_batch(batch: AttentionBatch) -> AttentionBatch:
    """The same rows with value-weighted attention as the pattern: A[q, k] ||f(x_k)|| renormalised per query over
    the keys that count (`headscan.values.value_weighted`), for the value table's columns."""
    weighted = values.value_weighted(batch.pattern, batch.value_norms, batch.key_mask)  # (batch, head, q, k), new
    return dataclasses.replace(batch, pattern=weighted, raw_pattern=None, words=None)


def _logit_batch(contributions: torch.Tensor, scale: torch.Tensor, masks: dict, model: HookedModel,
                 config: SweepConfig) -> AttentionBatch:
    """One layer's logit contributions (batch, head, q) with the final scale (batch, q), for dla's columns once the
    forward pass is over. No pattern is kept: its place holds a zero-stride view of one 0, for the shapes."""
    b, h, n = contributions.shape
    placeholder = contributions.new_zeros(()).expand(b, h, n, n)  # (batch, head, q, k), no memory
    counts = masks["counts"]
    return AttentionBatch(placeholder, counts, counts, masks["ids"], masks["sep"], model.causal, config.max_offset,
                          logit_contributions=contributions, final_scale=scale)


def _group_of(metric: Metric, table: str) -> str:
    """Which AttentionBatch a column is scored on: "attention", "value" (value-weighted) or "logits" (dla)."""
    if "logit_contributions" in metric.needs:
        return "logits"
    return "value" if table == "value" and metric.table != "value" else "attention"


def _score(batches: dict[str, AttentionBatch | None], columns: list[Column], given: dict | None = None) -> dict:
    """The metrics of `columns` whose batch is in `batches` and carries what they need, on one layer (or one block
    of its queries): {(metric, table): (sums, counts)}, each (batch, head[, axis]).

    `given` maps a metric to sums and counts computed elsewhere (the syntax metric in chunked mode).
    """
    scored = {}
    for metric, table in dict.fromkeys((m, t) for m, _, t in columns):
        batch = batches.get(_group_of(metric, table))
        if given and metric in given:
            scored[metric, table] = given[metric]
        elif batch is not None and all(getattr(batch, name) is not None for name in metric.needs):
            scored[metric, table] = metric.function(batch)
    return scored


def _add_scores(into: dict, scored: dict) -> dict:
    """Blocks of one layer's queries add up (chunked mode)."""
    for key, (s, c) in scored.items():
        into[key] = (into[key][0] + s, into[key][1] + c) if key in into else (s, c)
    return into


def _columns_tensor(scored: dict, columns: list[Column], batch: int, heads: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's scores as (batch, head, column) sums and counts; a column not scored (its internals were not
    captured) gets 0 and 0, so its value is NaN."""
    sums, counts = [], []
    for metric, table in dict.fromkeys((m, t) for m, _, t in columns):
        if (metric, table) in scored:
            s, c = scored[metric, table]  # (batch, head[, axis])
            sums.append(s if s.dim() == 3 else s[..., None])
            counts.append(c if c.dim() == 3 else c[..., None])
        else:
            width = len([1 for m, _, t in columns if m is metric and t == table])
            zeros = torch.zeros((batch, heads, width), dtype=torch.float32, device=device)
            sums.append(zeros)
            counts.append(zeros)
    return torch.cat([s.to(device, torch.float64) for s in sums], -1), torch.cat([c.to(device, torch.float64) for c in counts], -1)


# --- windows -----------------------------------------------------------------------------------------------


def _unit(index: int, document: int, config: SweepConfig) -> int:
    return document if config.bootstrap_unit == "document" else index


def plan_windows(corpus: Corpus, config: SweepConfig, shard: Shard | None = None) -> list[list[int]]:
    """The sweep's plan: segment indices in windows of at least ``config.window`` segments, cut only between
    bootstrap units, restricted to `shard`. The same corpus, settings and shard always give the same plan.

    >>> corpus = Corpus("c", "text", "", tuple(Segment("a", i, document=i // 3) for i in range(7)))
    >>> plan_windows(corpus, SweepConfig(window=2))
    [[0, 1], [2, 3], [4, 5], [6]]
    >>> plan_windows(corpus, SweepConfig(window=2, bootstrap_unit="document"))
    [[0, 1, 2], [3, 4, 5], [6]]
    >>> plan_windows(corpus, SweepConfig(window=2), Shard(1, 2))
    [[3, 4], [5]]
    """
    windows: list[list[int]] = []
    current: list[int] = []
    last_unit = None
    for index, document in enumerate(corpus.segment_documents.tolist()):  # no segment is read from a file
        if shard is not None and not shard.holds(document):
            continue
        unit = _unit(index, document, config)
        if len(current) >= config.window and unit != last_unit:
            windows.append(current)
            current = []
        current.append(index)
        last_unit = unit
    if current:
        windows.append(current)
    return windows


# --- one model ---------------------------------------------------------------------------------------------


def _accumulator_device(model: HookedModel) -> torch.device:
    # float64 sums stay where the model runs (one host sync per window, not per layer); MPS has no float64.
    return torch.device("cpu") if model.device.type == "mps" else model.device


def accumulate(
    model: HookedModel,
    corpus: Corpus,
    config: SweepConfig,
    *,
    shard: Shard | None = None,
    state: PartialState | None = None,
    save: Callable[[PartialState], None] | None = None,
    save_every: float = 120.0,
    should_stop: Callable[[], bool] = lambda: False,
    progress: bool = False,
) -> PartialState:
    """Add every remaining window of `model` over `corpus` (or its `shard`) into `state`, and return it.

    `save(state)` is called at the end of a window when `save_every` seconds have passed since the last save,
    at the end, and when the sweep is stopped. When `should_stop()` turns true between two batches, the window
    in progress is dropped, the state as of the last finished window is saved, and `SweepInterrupted` is
    raised; that state resumes exactly.
    """
    words = has_words(corpus.kind)
    columns = columns_of(config, words)
    shape = (model.n_layers, model.n_heads, len(columns))
    if state is None:
        state = PartialState.empty(fingerprint(model, corpus, config), shard, shape, config.bootstrap)
        if words:
            state.baseline = np.zeros((2, len(syntax.BASELINE_OFFSETS), len(syntax.COLUMNS)))
    weights_note = state.model.get("weights")  # a resumed state read the weights when it started
    state.model = model.provenance()
    head_weights, unread = _read_weights(model)  # once, for the weights table and for value weighting
    if not state.weights.size:
        state.weights, weights_note = _weight_scores(model, head_weights, unread)
    state.model["weights"] = weights_note
    windows = plan_windows(corpus, config, shard)
    device = _accumulator_device(model)
    totals = {name: torch.from_numpy(getattr(state, name)).to(device)
              for name in ("sums", "counts", "replicate_sums", "replicate_counts", "moments", "baseline")}
    pad = model.special_token_ids["pad"]
    pad = pad if pad is not None else 0  # masked out, so any id will do (GPT-2 has no pad token)
    current: dict = {}
    capture, notes = _capture(model, config, head_weights, unread)
    state.model.update(notes)  # whether values and dla were captured, and how W_U was taken
    weighted = any(table == "value" for _, _, table in columns)

    def batches_of(pattern, layer: int, query_start: int = 0) -> dict:
        """The layer's AttentionBatch, with its value norms where captured, and its value-weighted twin."""
        norms = current["norms"].get(layer)  # (batch, head, k), from the layer's values: handed over before the pattern
        batch = _attention_batch(pattern, current["masks"], model, config, query_start, norms)
        return {"attention": batch, "value": _value_batch(batch) if weighted and norms is not None else None}

    def reduce_layer(layer: int):
        def hook(pattern, hook):  # `hook`: TransformerLens passes it by that name; a QueryBlock in chunked mode
            where = hook
            if not isinstance(where, QueryBlock):  # eager: the whole pattern at once
                current["scored"][layer] = _score(batches_of(pattern, layer), columns)
                return None  # the pattern goes on unchanged
            # chunked: a block of query rows. Per-token metrics add up over blocks; the syntax metric needs whole
            # rows and columns of word attention, so its word attention is added up and scored at the last block.
            scoring = batches_of(pattern, layer, where.start)
            batch = scoring["attention"]
            given = {}
            if syntax_metric is not None:
                words = current["masks"]["words"]
                raw = batch.pattern if batch.raw_pattern is None else batch.raw_pattern
                part = syntax.word_attention(raw, words.token_word, words.n_words, where.start)  # (batch, head, word, word)
                current["word_attention"][layer] = current["word_attention"].get(layer, 0) + part
                if where.stop == where.n_queries:
                    given[syntax_metric] = syntax.accuracy_of(current["word_attention"].pop(layer), words)
                else:
                    zeros = torch.zeros((*pattern.shape[:2], len(syntax.COLUMNS)), dtype=torch.float32, device=pattern.device)
                    given[syntax_metric] = (zeros, zeros)
            scored = _score(scoring, columns, given)
            current["scored"][layer] = _add_scores(current["scored"][layer], scored) if where.start else scored
            return None

        return hook

    def keep_norms(v, layer):  # (batch, k, kv_head, d_head), value bias included: before the layer's pattern
        current["norms"][layer] = values.value_norms(v, factor=capture["factors"][layer])  # (batch, head, k)

    def keep_contributions(z, layer):  # (batch, q, head, d_head): each head's output before W_O
        directions = capture["directions"]
        if directions.device != z.device:  # a device map: the layer sits elsewhere
            directions = directions.to(z.device)
        current["contributions"][layer] = values.logit_contributions(
            z, capture["W_O"][layer], directions, current["masks"]["next"].to(z.device))  # (batch, head, q)

    def keep_scale(residual, layer):  # (batch, q, d_model): the residual stream the final norm reads
        current["scale"] = values.final_norm_scale(residual, kind=capture["final_norm"], eps=capture["final_eps"])

    internals = {}
    if capture is not None:
        internals["v"] = {layer: keep_norms for layer in range(model.n_layers)}
        if capture.get("directions") is not None:
            internals["z"] = {layer: keep_contributions for layer in range(model.n_layers)}
            internals["out"] = {model.n_layers - 1: keep_scale}

    syntax_metric = METRICS["syntax"] if words else None
    attention = chunked.choose(model, batch_size=config.batch_size, max_len=min(config.max_len, model.max_context),
                               budget_mib=config.attention_budget, attention=config.attention)
    state.model["attention"] = attention  # recorded: eager, or chunked with its query_chunk
    if attention == "chunked":
        state.model["query_chunk"] = config.query_chunk

    hooks = {layer: reduce_layer(layer) for layer in range(model.n_layers)}
    bar = _progress_bar(sum(map(len, windows)), sum(map(len, windows[: state.windows_done])), model.name, progress)
    started = last_save = time.perf_counter()
    try:
        with model.pattern_forward(hooks, attention=attention, query_chunk=config.query_chunk,
                                   internals=internals) as forward:
            for window in windows[state.windows_done:]:
                units = [_unit(i, int(corpus.segment_documents[i]), config) for i in window]
                local = {unit: n for n, unit in enumerate(dict.fromkeys(units))}
                encoded = encode(corpus, model, config.max_len, indices=window, long=config.long)
                # (layer, unit, head, column): this window's sums per unit, added to `totals` when it ends
                current["sums"] = torch.zeros((shape[0], len(local), *shape[1:]), dtype=torch.float64, device=device)
                current["counts"] = torch.zeros_like(current["sums"])
                current["baseline"] = torch.zeros_like(totals["baseline"])  # (2, offset, syntax column)
                n_tokens = 0
                for batch in batches(encoded, config.batch_size, pad):
                    if should_stop():
                        raise SweepInterrupted(f"{model.name}: stopped")
                    ids, mask = batch.input_ids.to(model.device), batch.attention_mask.to(model.device)
                    current.update(masks=_batch_masks(ids, mask.bool(), model, config, batch.words), scored={},
                                   word_attention={}, norms={}, contributions={}, scale=None)
                    forward(ids, mask)
                    _score_logits(current, columns, model, config)  # dla needs the final scale: after the pass
                    # every layer's sums at once into their units: one index_add per batch, not one per layer
                    rows = torch.tensor([local[units[encoded.segment_of(int(i))]] for i in batch.index],
                                        dtype=torch.long, device=device)
                    # (batch, head, column) per layer; layers may sit on several devices under a device map
                    per_layer = [_columns_tensor(current["scored"][layer], columns, len(batch.index), model.n_heads,
                                                 device) for layer in range(shape[0])]
                    for index, name in enumerate(("sums", "counts")):
                        stacked = torch.stack([pair[index] for pair in per_layer])  # (layer, batch, head, column)
                        current[name].index_add_(1, rows, stacked)
                    if words:  # the fixed-offset baseline on the same words: one rule for the batch, not per layer
                        sums, counts = syntax.offset_baseline(batch.words.to(device))  # (batch, offset, column)
                        current["baseline"] += torch.stack([sums.sum(0), counts.sum(0)])
                    n_tokens += batch.n_tokens
                    if bar is not None:
                        bar.update(len(batch.index))
                _add_window(totals, current, list(local), config)
                state.windows_done += 1
                state.n_segments += len(window)
                state.n_tokens += n_tokens
                state.n_truncated += encoded.n_truncated
                state.n_tokens_lost += encoded.n_tokens_lost
                state.seconds += time.perf_counter() - started
                started = time.perf_counter()
                if save is not None and started - last_save >= save_every:
                    _store(state, totals)
                    save(state)
                    last_save = time.perf_counter()
    except SweepInterrupted:
        _store(state, totals)  # every finished window; the one in progress is dropped
        if save is not None:
            save(state)
        raise
    finally:
        if bar is not None:
            bar.close()
    _store(state, totals)
    state.finished = True
    if save is not None:
        save(state)
    return state


def _score_logits(current: dict, columns: list[Column], model: HookedModel, config: SweepConfig) -> None:
    """Add dla's columns to every layer's scores, once the pass has given the final norm's scale; the layers'
    contributions, (batch, head, q) each, are then dropped."""
    scale = current["scale"]
    for layer, contributions in current["contributions"].items():
        batch = _logit_batch(contributions, scale.to(contributions.device), current["masks"], model, config)
        current["scored"][layer].update(_score({"logits": batch}, columns))
    current["contributions"] = {}


def _read_weights(model: HookedModel):
    """Each head's weights (`headscan.circuits.HeadWeights`), or None and why not. An architecture whose weights
    headscan cannot read costs its weights table, value table and dla (NaN, with the reason), not the sweep."""
    from ..models import weights as circuits
    from ..errors import HeadscanError

    try:
        return circuits.head_weights(model), None
    except (HeadscanError, AttributeError, KeyError, RuntimeError, TypeError, ValueError) as error:
        return None, str(error)


def _capture(model: HookedModel, config: SweepConfig, weights, unread: str | None) -> tuple[dict | None, dict]:
    """What the sweep needs to weight attention by values and attribute logits, and provenance notes saying
    whether it was captured and how: ({"factors", "W_O", "directions", "final_norm", "final_eps"} or None,
    {"values": ..., "dla": ...}). A model it cannot capture keeps its sweep: its value table and dla are NaN."""
    from ..models import weights as circuits

    if not config.values:
        return None, {"values": "off (values=False)", "dla": "off (values=False)"}
    if model.path != "transformer_lens":
        why = ("not captured: this model is read through Hugging Face forward hooks (path hf_hooks), which hand over "
               "attention patterns but not values or head outputs; its value table and dla are NaN")
        return None, {"values": why, "dla": why}
    if weights is None:
        why = f"not captured: weights not read ({unread}); its value table and dla are NaN"
        return None, {"values": why, "dla": why}
    with torch.no_grad():
        W_O = weights.W_O.detach()  # (layer, head, d_head, d_model), the bridge's own (no norm folds into W_O)
        factors = [values.output_norm_factor(W_O[layer]).to(W_O.device) for layer in range(model.n_layers)]
        capture = {"factors": factors, "W_O": [W_O[layer] for layer in range(model.n_layers)]}
        notes = {"values": "captured: value norms ||(x W_V + b_V) W_O^h|| of each layer's values as attention reads "
                           "them (blocks.{L}.attn.hook_v; value bias in, output bias out), W_O from the bridge"}
        if not model.causal:
            notes["dla"] = "not captured: a bidirectional model has no next-token logit"
        elif weights.final_norm is None:
            notes["dla"] = f"not captured: no final norm before the unembedding that headscan represents ({weights.family})"
        else:
            directions = circuits.logit_directions(weights)  # (d_model, vocab)
            capture["directions"] = directions.T.contiguous().T  # gathering a token's direction reads one row
            capture["final_norm"], capture["final_eps"] = weights.final_norm, weights.final_eps
            notes["dla"] = (f"captured: head outputs from blocks.{{L}}.attn.hook_z; W_U {weights.embedding} "
                            f"({weights.folded}); final {weights.final_norm} norm scale from "
                            f"blocks.{model.n_layers - 1}.hook_out, frozen; directions centred over the vocabulary")
    return capture, notes


WEIGHT_METRICS = ("copying",)  # the rows of the weights table, in the order of PartialState.weights


def _weight_scores(model: HookedModel, weights, unread: str | None) -> tuple[np.ndarray, str]:
    """The weight-only scores of `model`, (weight metric, layer, head), and how the weights were taken."""
    from ..models import weights as circuits
    from ..errors import HeadscanError

    if weights is not None:
        try:
            scores = circuits.copying_scores(weights).double().cpu().numpy()[None]
            return scores, f"embedding {weights.embedding}; folded: {weights.folded}"
        except (HeadscanError, RuntimeError, ValueError) as error:  # e.g. an eigensolver that does not converge
            unread = str(error)
    return np.full((len(WEIGHT_METRICS), model.n_layers, model.n_heads), np.nan), f"not read: {unread}"


def _add_window(totals: dict, window: dict, units: list[int], config: SweepConfig) -> None:
    """Add one window's per-unit sums into the running totals, with their bootstrap weights and power sums."""
    sums = window["sums"].transpose(0, 1)  # (unit, layer, head, column)
    counts = window["counts"].transpose(0, 1)
    totals["sums"] += sums.sum(0)
    totals["counts"] += counts.sum(0)
    if config.bootstrap:
        weights = torch.from_numpy(intervals.bootstrap_weights(units, config.bootstrap, config.seed)).to(sums.device)
        # (replicate, unit) @ (unit, layer * head * column): one matrix product per window
        totals["replicate_sums"] += (weights @ sums.flatten(1)).view_as(totals["replicate_sums"])
        totals["replicate_counts"] += (weights @ counts.flatten(1)).view_as(totals["replicate_counts"])
    totals["moments"] = intervals.combine_moments(totals["moments"], intervals.unit_moments(sums, counts))
    totals["baseline"] += window["baseline"]


def _store(state: PartialState, totals: dict) -> None:
    for name, tensor in totals.items():
        setattr(state, name, tensor.cpu().numpy().copy())


def _progress_bar(total: int, done: int, name: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc=f"sweep {name}", unit="seg", file=sys.stderr, dynamic_ncols=True)


def finish(state: PartialState, config: SweepConfig) -> dict[str, pd.DataFrame]:
    """The tables of a finished state: each score column's rows go to its metric's table."""
    model = ModelProvenance.from_json(state.model)
    columns = columns_of(config, has_words(state.fingerprint["corpus"]["kind"]))
    values = state.values(config.interval)  # name -> (layer, head, column)
    n_layers, n_heads, _ = state.sums.shape
    layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")  # (layer, head)
    group = n_heads // (model.n_kv_heads or n_heads)
    per_head = {
        "model": model.name,
        "family": model.family,
        "layer": layer.ravel(),
        "head": head.ravel(),
        "label": [head_label(l, h) for l, h in zip(layer.ravel(), head.ravel())],
        "kv_group": head.ravel() // group,
    }
    parts: dict[str, list[pd.DataFrame]] = {}
    for index, (metric, key, table_name) in enumerate(columns):
        table = TABLES[table_name]
        keys = dict(zip(metric.axis.columns, key)) if metric.axis else {}
        if "metric" in table.keys:
            keys["metric"] = metric.name
        part = pd.DataFrame(per_head | keys | {name: array[..., index].ravel() for name, array in values.items()})
        parts.setdefault(table.name, []).append(part)
    # Rows of a table: by metric (registry order), then layer, head and the metric's axis.
    frames = {}
    for name, pieces in parts.items():
        frame = pd.concat(pieces, ignore_index=True)
        keys = list(TABLES[name].keys)
        order = ["metric"] * ("metric" in keys) + ["layer", "head"] + [k for k in keys if k != "metric"]
        frame = frame.sort_values(order, key=_registry_order, kind="stable")
        if name == "syntax":
            frame = syntax.attach_baseline(frame, state.baseline[0], state.baseline[1])
        frames[name] = TABLES[name].conform(frame)
    if state.weights.size:
        frames["weights"] = _weights_frame(state, per_head)
    return frames


def _weights_frame(state: PartialState, per_head: dict) -> pd.DataFrame:
    how = str(state.model.get("weights", ""))
    embedding = how.split(";")[0].removeprefix("embedding ") if how.startswith("embedding ") else None
    nan = float("nan")
    parts = [pd.DataFrame(per_head | {"metric": name, "value": state.weights[i].ravel(), "sum": nan, "count": nan,
                                      "ci_low": nan, "ci_high": nan, "units": nan, "top_unit_share": nan,
                                      "embedding": embedding})
             for i, name in enumerate(WEIGHT_METRICS)]
    return TABLES["weights"].conform(pd.concat(parts, ignore_index=True))


def _registry_order(column: pd.Series) -> pd.Series:
    if column.name == "metric":
        order = {name: i for i, name in enumerate(METRICS)}
        return column.map(order)
    return column


def model_provenance(state: PartialState, config: SweepConfig) -> ModelProvenance:
    return ModelProvenance.from_json(state.model | {
        "n_segments": state.n_segments,
        "n_tokens": state.n_tokens,
        "n_truncated": state.n_truncated,
        "n_tokens_lost": state.n_tokens_lost,
        "max_len": config.max_len,
        "seconds": round(state.seconds, 3),
    })


def sweep_model(model: HookedModel, corpus: Corpus, config: SweepConfig = SweepConfig(), *, shard: Shard | None = None,
                progress: bool = False) -> SweepTables:
    """Score every head of `model` over `corpus` (or its `shard`): its tables, with this one model's provenance."""
    state = accumulate(model, corpus, config, shard=shard, progress=progress)
    return SweepTables(finish(state, config), run_provenance(corpus, config, [model_provenance(state, config)]))


# --- provenance --------------------------------------------------------------------------------------------


def _git_revision() -> str | None:
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        result = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None


def _versions() -> dict:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    versions = {"python": platform.python_version(), "headscan": __version__}
    for package in ("torch", "transformers", "transformer-lens", "numpy", "pandas"):
        try:
            versions[package.replace("-", "_")] = version(package)
        except PackageNotFoundError:
            versions[package.replace("-", "_")] = None
    return versions


def run_provenance(corpus: Corpus, config: SweepConfig, models: list[ModelProvenance], *, command: str | None = None,
                   started: datetime | None = None, shard: Shard | None = None) -> RunProvenance:
    return RunProvenance(
        headscan_version=__version__,
        git_revision=_git_revision(),
        command=command,
        started=started.isoformat(timespec="seconds") if started else None,
        finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        corpus=CorpusProvenance.from_json(corpus.provenance()),
        config=config.to_json() | {"device": resolve_device(config.device)},
        versions=_versions(),
        models=tuple(models),
        extra={} if shard is None else {"shard": str(shard)},
    )


def texts_corpus(texts: list[str], limit: int | None) -> Corpus:
    """A corpus of the given strings, one segment (and one document) each: a notebook's list of sentences."""
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise ConfigError(f"corpus: item {bad[0]} of the list is a {type(texts[bad[0]]).__name__}, not a string",
                          setting="corpus")
    kept = [t.strip() for t in texts if t.strip()][:limit]
    segments = tuple(Segment(text, i + 1, document=i) for i, text in enumerate(kept))
    if not segments:
        raise ConfigError("corpus: the list holds no text (every item is empty)", setting="corpus")
    digest = hashlib.sha256(json.dumps(texts).encode()).hexdigest()
    return Corpus(f"<list of {len(texts)} texts>", "list", digest, segments, documents="none: each text is its own document")


def slug(name: str) -> str:
    """A file name for a model spec (an alias, a Hugging Face id or a path).

    >>> slug("meta-llama/Llama-3.2-1B"), slug("/tmp/my model/")
    ('meta-llama--Llama-3.2-1B', 'tmp--my_model')
    """
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name.strip("/").replace("/", "--")) or "model"


def example_attention(model: HookedModel, text: str, layer: int) -> tuple[list[str], np.ndarray]:
    """The tokens of `text` and layer `layer`'s attention pattern on it, (head, q, k), as the sweep sees them."""
    if not 0 <= layer < model.n_layers:
        raise ConfigError(f"layer {layer} is out of range for {model.name} (0..{model.n_layers - 1})")
    corpus = Corpus("example", "text", "", (Segment(text, 0),))
    encoded = encode(corpus, model, model.max_context)
    ids = torch.tensor([encoded.token_ids[0]], dtype=torch.long)
    captured = {}

    def hook(pattern, hook):
        captured["pattern"] = pattern[0].detach().float().cpu().numpy()  # (head, q, k)

    with model.pattern_forward({layer: hook}) as forward:
        forward(ids.to(model.device), torch.ones_like(ids).to(model.device))
    # decode one id at a time: readable labels ("cat", not byte-level BPE's "Ġcat"), whitespace shown quoted
    words = [model.tokenizer.decode([token]) for token in encoded.token_ids[0]]
    return [word.strip() or repr(word) for word in words], captured["pattern"]
