"""The window loop: a corpus through one hooked model, every layer's attention reduced as it is produced.

Read `accumulate` top to bottom: plan, hooks, passes, then window after window: encode the window's segments, run
its batches through the model (each layer's pattern goes to every registered metric, which reduces it at once to
per-segment sums and counts; the pattern is then dropped), let the passes add what they do per window, add the
window's per-unit sums into the running totals with their Poisson bootstrap weights and power sums, and save
now and then. No activation cache is kept, so peak memory does not grow with the corpus.

The corpus is cut into *windows* of whole bootstrap units (segments, or documents; `headscan.scan.plan`), so 95%
intervals come from the same single pass. A state saved at a window end resumes bit for bit, and the states of
disjoint shards add up to the unsharded one (`headscan.scan.state.merge_states`). Optional work (the weights
table, the syntax baseline, importance, similarity) plugs in beside the loop as registered passes
(`headscan.scan.passes`).

This module does not draw anything, parse command lines or write tables (see `headscan.scan.finish`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import intervals
from ..config import SweepConfig
from ..corpus import Corpus, EncodedCorpus, batches, encode
from ..errors import SweepInterrupted
from ..models import HookedModel, pattern_forward
from . import budget
from .finish import publish, run_provenance
from .layers import LayerHooks, capture_for
from .passes import PASSES, BatchStep, PassRun, SweepRun
from .passes.weights import read_weights
from .plan import SweepPlan, pattern_columns, plan_sweep, unit_of
from .state import PartialState, Shard, add_tallies

__all__ = ["accumulate", "sweep_model", "Window", "Totals"]


@dataclass
class Window:
    """One window's sums per bootstrap unit, added to the running totals when the window ends."""

    units: dict[int, int]  # bootstrap unit -> its row in `sums` and `counts`
    sums: torch.Tensor  # (layer, unit, head, column)
    counts: torch.Tensor  # (layer, unit, head, column)
    chance: torch.Tensor  # (layer, head, column): the null head's sums, not per unit (chance is not bootstrapped)
    n_tokens: int = 0


@dataclass
class Totals:
    """The running sums of `PartialState`'s core arrays (same names and shapes), where the model runs."""

    sums: torch.Tensor
    counts: torch.Tensor
    replicate_sums: torch.Tensor
    replicate_counts: torch.Tensor
    replicate_power: torch.Tensor
    moments: torch.Tensor
    chance: torch.Tensor

    @classmethod
    def of(cls, state: PartialState, device: torch.device) -> Totals:
        return cls(**{f.name: torch.from_numpy(getattr(state, f.name)).to(device) for f in dataclasses.fields(cls)})

    def add(self, window: Window, config: SweepConfig) -> None:
        """Add one window's per-unit sums, with their bootstrap weights and power sums."""
        sums = window.sums.transpose(0, 1)  # (unit, layer, head, column)
        counts = window.counts.transpose(0, 1)
        self.sums += sums.sum(0)
        self.counts += counts.sum(0)
        if config.bootstrap:
            weights = torch.from_numpy(intervals.bootstrap_weights(list(window.units), config.bootstrap, config.seed))
            weights = weights.to(sums.device)
            # (replicate, unit) @ (unit, layer * head * column): one matrix product per window, added in place
            intervals.add_product(self.replicate_sums, weights, sums.flatten(1))
            intervals.add_product(self.replicate_counts, weights, counts.flatten(1))
            # each replicate's sum_u w_bu s_u^2, s_u c_u, c_u^2: its own variance, for the studentized interval
            power = self.replicate_power  # (3, replicate, layer, head, column), added into in place
            intervals.replicate_moments(weights, sums.flatten(1), counts.flatten(1),
                                        into=power.view(*power.shape[:2], -1))
        self.moments = intervals.combine_moments(self.moments, intervals.unit_moments(sums, counts))
        self.chance += window.chance

    def store(self, state: PartialState, last: bool = False) -> None:
        # copies, as later windows add into the totals; after the last window the state takes the totals' own memory
        # (on the CPU it already is the state's), which saves a copy of smollm2's 350 MB of replicate sums
        for f in dataclasses.fields(self):
            array = getattr(self, f.name).cpu().numpy()
            setattr(state, f.name, array if last else array.copy())


def accumulate(
    model: HookedModel,
    corpus: Corpus,
    plan: SweepPlan | SweepConfig,
    *,
    shard: Shard | None = None,
    state: PartialState | None = None,
    save: Callable[[PartialState], None] | None = None,
    save_every: float = 120.0,
    should_stop: Callable[[], bool] = lambda: False,
    progress: bool = False,
) -> PartialState:
    """Add every remaining window of `model` over `corpus` (its `plan`, or a `SweepConfig` and `shard` to plan
    from) into `state`, and return it.

    `save(state)` is called at the end of a window when `save_every` seconds have passed since the last save,
    at the end, and when the sweep is stopped. When `should_stop()` turns true between two batches, the window
    in progress is dropped, the state as of the last finished window is saved, and `SweepInterrupted` is
    raised; that state resumes exactly.
    """
    if not isinstance(plan, SweepPlan):
        plan = plan_sweep(model, corpus, plan, shard)
    config, windows = plan.config, plan.windows
    if state is None:
        shape = (len(plan.layers), model.n_heads, len(plan.columns))  # the swept layers only
        state = PartialState.empty(plan.fingerprint, plan.shard, shape, config.bootstrap)
    head_weights, unread = read_weights(model)  # once, for the weights table and for value weighting
    layers, attention = _hooks(model, plan, state, head_weights, unread)
    device = _accumulator_device(model)
    bar = _progress_bar(sum(map(len, windows)), sum(map(len, windows[: state.windows_done])), model.name, progress)
    run = SweepRun(model, corpus, plan, layers, device, head_weights, unread, state, should_stop,
                   save=(lambda: save(state)) if save is not None else (lambda: None), bar=bar)
    for name in plan.passes:
        state.passes.setdefault(name, PASSES[name].empty(plan, model))
    passes = [PASSES[name].open(run, state.passes[name]) for name in plan.passes]
    totals = Totals.of(state, device)
    batch_bar = None if any(one.moves_bar for one in passes) else bar  # else a pass moves it
    last_save = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            for one in passes:
                stack.enter_context(one)
                one.prepare()
            started = time.perf_counter()
            for window in windows[state.windows_done:]:
                encoded = encode(corpus, model, config.max_len, indices=list(window), long=config.long)
                units = [unit_of(i, int(corpus.segment_documents[i]), config) for i in window]
                for one in passes:
                    one.begin_window()
                with pattern_forward(model, layers.patterns(), attention=attention, query_chunk=config.query_chunk,
                                     internals=layers.internals()) as forward:
                    swept = _sweep_window(forward, layers, encoded, list(window), units, len(plan.columns), passes,
                                          device, should_stop, batch_bar)
                for one in passes:
                    one.fill(swept, list(window), units)
                totals.add(swept, config)
                for one in passes:
                    one.end_window()
                _count(state, len(window), encoded, swept)
                state.seconds += time.perf_counter() - started
                started = time.perf_counter()
                if save is not None and started - last_save >= save_every:
                    _store(state, totals, passes)
                    save(state)
                    last_save = time.perf_counter()
    except SweepInterrupted:
        _store(state, totals, passes)  # every finished window; the one in progress is dropped
        if save is not None:
            save(state)
        raise
    finally:
        if bar is not None:
            bar.close()
    _store(state, totals, passes, last=True)
    state.finished = True
    if save is not None:
        save(state)
    return state


def _hooks(model: HookedModel, plan: SweepPlan, state: PartialState, head_weights, unread) -> tuple[LayerHooks, str]:
    """The pattern hooks of the plan's score columns and the attention mode; notes both in the model's provenance."""
    config = plan.config
    state.model = model.provenance() | ({"max_len_note": plan.clamped} if plan.clamped else {})
    capture, notes = capture_for(model, config, head_weights, unread)
    state.model.update(notes)  # whether values and dla were captured, and how W_U was taken
    layers = LayerHooks(model, config, pattern_columns(list(plan.columns)), capture, plan.words, plan.layers)
    if len(plan.layers) < model.n_layers:  # recorded with the model: which of its layers the tables hold
        state.model["layers"] = list(plan.layers)
    attention = budget.choose(model, batch_size=config.batch_size, max_len=config.max_len,
                              budget_mib=config.attention_budget, attention=config.attention)
    state.model["attention"] = attention  # recorded: eager, or chunked with its query_chunk
    if attention == "chunked":
        state.model["query_chunk"] = config.query_chunk or "sized by bytes (headscan.models.chunked.block_rows)"
    return layers, attention


def _sweep_window(forward, layers: LayerHooks, encoded: EncodedCorpus, segments: list[int], units: list[int],
                  n_columns: int, passes: list[PassRun], device, should_stop: Callable[[], bool], bar) -> Window:
    """One window's batches through the model: their sums per bootstrap unit (`units`: each segment's) in
    `n_columns` score columns; `segments` are the window's corpus indices."""
    model = layers.model
    local = {unit: n for n, unit in enumerate(dict.fromkeys(units))}
    sums = torch.zeros((len(layers.layers), len(local), model.n_heads, n_columns), dtype=torch.float64, device=device)
    window = Window(local, sums, torch.zeros_like(sums), torch.zeros_like(sums[:, 0]))
    pad = model.special_token_ids["pad"]
    pad = pad if pad is not None else 0  # masked out, so any id will do (GPT-2 has no pad token)
    swept: set[int] = set()  # the window's segments through the model: swept again by a resumed sweep
    for batch in batches(encoded, layers.config.batch_size, pad):
        if should_stop():
            stopped = SweepInterrupted(f"{model.name}: stopped")
            stopped.redo = len(swept)  # said in the stop message (`headscan.scan.run`)
            raise stopped
        ids, mask = batch.input_ids.to(model.device), batch.attention_mask.to(model.device)
        layers.start(ids, mask.bool(), batch.words)
        step = BatchStep(batch, encoded, segments)
        for one in passes:
            one.before_batch(step)
        forward(ids, mask)
        for one in passes:
            one.after_batch(step)
        # every layer's sums at once into their units: one index_add per batch, not one per layer
        rows = torch.tensor([local[units[encoded.segment_of(int(i))]] for i in batch.index], dtype=torch.long,
                            device=device)
        sums, counts, chance = layers.finish(len(batch.index), device)  # (layer, batch, head, pattern column) each
        # columns no pattern fills (importance's) come last, filled by their pass
        for into, stacked in zip((window.sums, window.counts), (sums, counts)):
            into[..., : stacked.shape[-1]].index_add_(1, rows, stacked)
        window.chance[..., : chance.shape[-1]] += chance.sum(1)
        window.n_tokens += batch.n_tokens
        swept.update(encoded.segment_of(int(i)) for i in batch.index)
        if bar is not None:
            bar.update(len(batch.index))
    return window


def _count(state: PartialState, n_segments: int, encoded: EncodedCorpus, window: Window) -> None:
    """A finished window's segments and tokens into the state's counts."""
    state.windows_done += 1
    state.n_segments += n_segments
    state.n_tokens += window.n_tokens
    state.n_truncated += encoded.n_truncated
    state.n_tokens_lost += encoded.n_tokens_lost
    if encoded.trees:  # how the CoNLL-U words were found among the tokens
        state.tallies = add_tallies(state.tallies, {"tokens_straddling_words": encoded.n_straddling,
                                                    "words_without_token": encoded.n_words_without_token})


def _store(state: PartialState, totals: Totals, passes: list[PassRun], last: bool = False) -> None:
    totals.store(state, last)
    for one in passes:
        one.store(last)


def _accumulator_device(model: HookedModel) -> torch.device:
    # float64 sums stay where the model runs (one host sync per window, not per layer); MPS has no float64.
    return torch.device("cpu") if model.device.type == "mps" else model.device


def _progress_bar(total: int, done: int, name: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, desc=f"sweep {name}", unit="seg", file=sys.stderr, dynamic_ncols=True)


def sweep_model(model: HookedModel, corpus: Corpus, config: SweepConfig | None = None, *, shard: Shard | None = None,
                progress: bool = False):
    """Score every head of `model` over `corpus` (or its `shard`): its `SweepTables`, with this one model's
    provenance; nothing is written."""
    config = config or SweepConfig()
    plan = plan_sweep(model, corpus, config, shard)
    state = accumulate(model, corpus, plan, progress=progress)
    config = dataclasses.replace(config, bootstrap_unit=plan.config.bootstrap_unit)  # max_len as given
    return publish([state], config, run_provenance(corpus, config, unit_why=plan.unit_why))
