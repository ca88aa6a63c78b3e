"""The window loop: a corpus through one hooked model, every layer's attention reduced as it is produced.

One forward pass per batch. `headscan.scan.layers.LayerHooks` hands each layer's attention pattern, the
padding mask and the token ids to every registered metric, which reduces it at once to per-segment sums and
counts; the pattern is then dropped. No activation cache is kept, so peak memory does not grow with the corpus.

The corpus is cut into *windows* of whole bootstrap units (segments, or documents; `headscan.scan.plan`): a
window's per-unit sums are added into a `headscan.scan.state.PartialState` when the window ends, with the
units' Poisson bootstrap weights, power sums and the replicates' power sums, so 95% intervals come from the
same single pass. A state saved at a window end resumes bit for bit, and the states of disjoint shards add up to the unsharded one
(`headscan.scan.state.merge_states`).

This module does not draw anything, parse command lines or write tables (see `headscan.scan.finish`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import intervals
from ..config import SweepConfig
from ..corpus import Corpus, EncodedCorpus, batches, encode
from ..errors import HeadscanError, SweepInterrupted
from ..metrics import syntax
from ..metrics.importance import methods as importance_methods
from ..models import HookedModel
from ..models import weights as head_weights
from . import budget
from .finish import WEIGHT_METRICS, publish, run_provenance
from .importance import ImportanceRun
from .layers import LayerHooks, capture_for
from .plan import columns_of, fingerprint, for_model, has_words, pattern_columns, plan_windows, resolve_unit, unit_of
from .similarity import SimilarityRun, check_memory
from .similarity import notes as similarity_notes
from .state import PartialState, Shard, add_tallies

__all__ = ["accumulate", "sweep_model"]

_TOTALS = ("sums", "counts", "replicate_sums", "replicate_counts", "replicate_power", "moments", "chance",
           "baseline", "similarity")  # PartialState's


@dataclass
class Window:
    """One window's sums per bootstrap unit, added to the running totals when the window ends."""

    units: dict[int, int]  # bootstrap unit -> its row in `sums` and `counts`
    sums: torch.Tensor  # (layer, unit, head, column)
    counts: torch.Tensor  # (layer, unit, head, column)
    chance: torch.Tensor  # (layer, head, column): the null head's sums, not per unit (chance is not bootstrapped)
    baseline: torch.Tensor  # (2, offset, syntax column): the fixed-offset baseline's sums and counts (CoNLL-U)
    similarity: torch.Tensor  # (2, layer * head, layer * head): head similarity's sums and queries (0 wide: off)
    words: dict = field(default_factory=dict)  # sampled segment -> word-level attention (similarity)
    n_tokens: int = 0


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
    config, clamped = for_model(config, model)  # max_len within the model's context, for everything below
    config = resolve_unit(corpus, config)[0]
    words = has_words(corpus.kind)
    columns = columns_of(config, words)
    if state is None:
        shape = (model.n_layers, model.n_heads, len(columns))
        state = PartialState.empty(fingerprint(model, corpus, config), shard, shape, config.bootstrap)
        if words:
            state.baseline = np.zeros((2, len(syntax.BASELINE_OFFSETS), len(syntax.COLUMNS)))
    weights_note = state.model.get("weights")  # a resumed state read the weights when it started
    state.model = model.provenance() | ({"max_len_note": clamped} if clamped else {})
    weights, unread = _read_weights(model)  # once, for the weights table and for value weighting
    if not state.weights.size:
        state.weights, state.embedding, weights_note = _weight_scores(model, weights, unread)
    state.model["weights"] = weights_note
    capture, notes = capture_for(model, config, weights, unread)
    state.model.update(notes)  # whether values and dla were captured, and how W_U was taken
    layers = LayerHooks(model, config, pattern_columns(columns), capture, words)
    if config.similarity_sample is not None:  # every pair of heads over a seeded sample (headscan.scan.similarity)
        check_memory(model.name, model.n_layers, model.n_heads, model.causal, config,
                     config.attention_budget or budget.default_budget_mib(str(model.device)))
        layers.similarity = SimilarityRun(len(corpus.segments), config, model.n_layers, model.n_heads, model.causal)
        size = model.n_layers * model.n_heads
        if not state.similarity.size:
            state.similarity = np.zeros((2, size, size))
        state.model["similarity"] = similarity_notes(config, layers.similarity.sample)
    attention = budget.choose(model, batch_size=config.batch_size, max_len=config.max_len,
                              budget_mib=config.attention_budget, attention=config.attention)
    state.model["attention"] = attention  # recorded: eager, or chunked with its query_chunk
    if attention == "chunked":
        state.model["query_chunk"] = config.query_chunk or "sized by bytes (headscan.models.chunked.block_rows)"

    # Importance runs whole forward passes of its own after each window's pattern pass, outside the pattern hooks
    # (which stop the pass after the last layer); a model whose heads cannot be cut is refused here.
    importance = ImportanceRun(model, corpus, config, columns) if importance_methods(config) else None

    windows = plan_windows(corpus, config, shard)
    device = _accumulator_device(model)
    totals = {name: torch.from_numpy(getattr(state, name)).to(device) for name in _TOTALS}
    bar = _progress_bar(sum(map(len, windows)), sum(map(len, windows[: state.windows_done])), model.name, progress)
    started = last_save = time.perf_counter()
    try:
        with importance if importance is not None else contextlib.nullcontext():
            if importance is not None:
                importance.prepare(state, should_stop, save)
                started = time.perf_counter()
            for window in windows[state.windows_done:]:
                encoded = encode(corpus, model, config.max_len, indices=window, long=config.long)
                units = [unit_of(i, int(corpus.segment_documents[i]), config) for i in window]
                with model.pattern_forward(layers.patterns(), attention=attention, query_chunk=config.query_chunk,
                                           internals=layers.internals()) as forward:
                    swept = _sweep_window(forward, layers, encoded, units, totals, device, should_stop,
                                          bar if importance is None else None, window)
                if importance is not None:  # the slow part: it moves the progress bar
                    _importance_window(importance, window, units, swept, device, should_stop, bar)
                _add_window(totals, swept, config)
                state.word_attention.update(swept.words)
                state.windows_done += 1
                state.n_segments += len(window)
                state.n_tokens += swept.n_tokens
                state.n_truncated += encoded.n_truncated
                state.n_tokens_lost += encoded.n_tokens_lost
                if encoded.trees:  # how the CoNLL-U words were found among the tokens
                    state.tallies = add_tallies(state.tallies, {"tokens_straddling_words": encoded.n_straddling,
                                                                "words_without_token": encoded.n_words_without_token})
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
    _store(state, totals, last=True)
    state.finished = True
    if save is not None:
        save(state)
    return state


def _importance_window(importance: ImportanceRun, window: list[int], units: list[int], swept: Window, device,
                       should_stop: Callable[[], bool], bar) -> None:
    """Add the importance sums of the window's segments into the last columns of `swept`."""
    unit = dict(zip(window, units))
    sums, counts = importance.window(window, lambda index: swept.units[unit[index]], len(swept.units), device,
                                     should_stop, advance=bar.update if bar is not None else None)
    if bar is not None:  # the segments outside the sample, all at once
        bar.update(sum(index not in importance.sampled for index in window))
    width = sums.shape[-1]
    with torch.inference_mode():  # the window's sums were made under the pattern pass's inference mode
        swept.sums[..., -width:] += sums
        swept.counts[..., -width:] += counts


def _sweep_window(forward, layers: LayerHooks, encoded: EncodedCorpus, units: list[int], totals: dict, device,
                  should_stop: Callable[[], bool], bar, segments: list[int] | None = None) -> Window:
    """One window's batches through the model: their sums per bootstrap unit (`units`: each segment's); `segments`
    are the window's corpus indices (for the similarity sample)."""
    model = layers.model
    local = {unit: n for n, unit in enumerate(dict.fromkeys(units))}
    n_layers, n_heads, n_columns = totals["sums"].shape
    sums = torch.zeros((n_layers, len(local), n_heads, n_columns), dtype=torch.float64, device=device)
    window = Window(local, sums, torch.zeros_like(sums), torch.zeros_like(totals["chance"]),
                    torch.zeros_like(totals["baseline"]), torch.zeros_like(totals["similarity"]))
    similarity = layers.similarity
    pad = model.special_token_ids["pad"]
    pad = pad if pad is not None else 0  # masked out, so any id will do (GPT-2 has no pad token)
    for batch in batches(encoded, layers.config.batch_size, pad):
        if should_stop():
            raise SweepInterrupted(f"{model.name}: stopped")
        ids, mask = batch.input_ids.to(model.device), batch.attention_mask.to(model.device)
        layers.start(ids, mask.bool(), batch.words)
        if similarity is not None:  # the batch's rows from sampled segments, and those segments
            owners = [segments[encoded.segment_of(int(i))] for i in batch.index]
            rows = [row for row, owner in enumerate(owners) if owner in similarity.sampled]
            similarity.begin(rows, [owners[row] for row in rows], layers.gathered.masks.words)
        forward(ids, mask)
        if similarity is not None and (pair := similarity.end(device)) is not None:
            window.similarity += torch.stack(pair)
            window.words.update(similarity.words_kept)
        # every layer's sums at once into their units: one index_add per batch, not one per layer
        rows = torch.tensor([local[units[encoded.segment_of(int(i))]] for i in batch.index], dtype=torch.long,
                            device=device)
        sums, counts, chance = layers.finish(len(batch.index), device)  # (layer, batch, head, pattern column) each
        # importance's columns come last, filled apart (headscan.scan.importance)
        for into, stacked in zip((window.sums, window.counts), (sums, counts)):
            into[..., : stacked.shape[-1]].index_add_(1, rows, stacked)
        window.chance[..., : chance.shape[-1]] += chance.sum(1)
        if batch.words is not None:  # the fixed-offset baseline on the same words: one rule for the batch
            sums, counts = syntax.offset_baseline(batch.words.to(device))  # (batch, offset, column)
            window.baseline += torch.stack([sums.sum(0), counts.sum(0)])
        window.n_tokens += batch.n_tokens
        if bar is not None:
            bar.update(len(batch.index))
    return window


def _read_weights(model: HookedModel):
    """Each head's weights (`headscan.models.weights.HeadWeights`), or None and why not. An architecture whose
    weights headscan cannot read costs its weights table, value table and dla (NaN, with the reason), not the
    sweep."""
    try:
        return head_weights.head_weights(model), None
    except (HeadscanError, AttributeError, KeyError, RuntimeError, TypeError, ValueError) as error:
        return None, str(error)


def _weight_scores(model: HookedModel, weights, unread: str | None) -> tuple[np.ndarray, str | None, str]:
    """The weight-only scores of `model`, (weight metric, layer, head), how the embedding was taken ("tied",
    "untied"; None when the weights were not read) and a provenance note on how the weights were taken."""
    if weights is not None and weights.untrained is not None:
        unread = weights.untrained  # copying would read an unembedding the checkpoint never trained
    elif weights is not None:
        try:
            scores = head_weights.copying_scores(weights).double().cpu().numpy()[None]
            return scores, weights.embedding, f"embedding {weights.embedding}; folded: {weights.folded}"
        except (HeadscanError, RuntimeError, ValueError) as error:  # e.g. an eigensolver that does not converge
            unread = str(error)
    embedding = weights.embedding if weights is not None else None
    return np.full((len(WEIGHT_METRICS), model.n_layers, model.n_heads), np.nan), embedding, f"not scored: {unread}"


def _add_window(totals: dict, window: Window, config: SweepConfig) -> None:
    """Add one window's per-unit sums into the running totals, with their bootstrap weights and power sums."""
    sums = window.sums.transpose(0, 1)  # (unit, layer, head, column)
    counts = window.counts.transpose(0, 1)
    totals["sums"] += sums.sum(0)
    totals["counts"] += counts.sum(0)
    if config.bootstrap:
        weights = torch.from_numpy(intervals.bootstrap_weights(list(window.units), config.bootstrap, config.seed))
        weights = weights.to(sums.device)
        # (replicate, unit) @ (unit, layer * head * column): one matrix product per window, added in place
        intervals.add_product(totals["replicate_sums"], weights, sums.flatten(1))
        intervals.add_product(totals["replicate_counts"], weights, counts.flatten(1))
        # each replicate's sum_u w_bu s_u^2, s_u c_u, c_u^2: its own variance, for the studentized interval
        power = totals["replicate_power"]  # (3, replicate, layer, head, column), added into in place
        intervals.replicate_moments(weights, sums.flatten(1), counts.flatten(1), into=power.view(*power.shape[:2], -1))
    totals["moments"] = intervals.combine_moments(totals["moments"], intervals.unit_moments(sums, counts))
    totals["chance"] += window.chance
    totals["baseline"] += window.baseline
    totals["similarity"] += window.similarity


def _store(state: PartialState, totals: dict, last: bool = False) -> None:
    # copies, as later windows add into the totals; after the last window the state takes the totals' own memory
    # (on the CPU it already is the state's), which saves a copy of smollm2's 350 MB of replicate sums
    for name, tensor in totals.items():
        array = tensor.cpu().numpy()
        setattr(state, name, array if last else array.copy())


def _progress_bar(total: int, done: int, name: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc=f"sweep {name}", unit="seg", file=sys.stderr, dynamic_ncols=True)


def sweep_model(model: HookedModel, corpus: Corpus, config: SweepConfig = SweepConfig(), *, shard: Shard | None = None,
                progress: bool = False):
    """Score every head of `model` over `corpus` (or its `shard`): its `SweepTables`, with this one model's
    provenance; nothing is written."""
    config = resolve_unit(corpus, config)[0]
    state = accumulate(model, corpus, config, shard=shard, progress=progress)
    return publish([state], config, run_provenance(corpus, config))
