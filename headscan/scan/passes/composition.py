"""The composition pass: Q-, K- and V-composition between every pair of heads in different layers, read off the
weights once per model (`headscan.models.composition`), into composition.parquet. No corpus, so nothing is summed:
shards all read the same weights, and a resumed sweep keeps the scores it read when it started.

``--composition auto`` (the default) scores models of at most `AUTO_HEADS` heads, GPT-2 small's 144 (the table has
3 x pairs rows, 28,512 for GPT-2 small); ``on`` scores any model, ``off`` none. A post-LayerNorm model (BERT) is
scored by neither: its provenance says why (``not scored: ... post-LayerNorm``), and so does the report. Where
scores are written, the provenance says how the weights were processed and the null drawn
(`headscan.models.composition.composition_arrays`).

A sweep of some layers (``--layers``) still reads the whole model's composition: a pair's source and receiver may
fall on either side of the split, and the null is drawn over every pair. Its table holds the rows whose receiver it
swept; `headscan merge` keeps one part's whole-model scores, after checking every part read the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...errors import HeadscanError, TablesError
from ...models.composition import composition_arrays, composition_refusal, composition_rows
from ...tables import TABLES
from .base import Pass, PassRun, sums_array

__all__ = ["CompositionPass", "CompositionState", "AUTO_HEADS"]

AUTO_HEADS = 144  # --composition auto scores models of at most this many heads


@dataclass
class CompositionState:
    scores: np.ndarray  # (mode, source layer, source head, layer, head); (0,) * 5 until read
    null: np.ndarray  # (mode, draw): the scores of the model's pairs with the residual basis rotated at random
    note: str | None = None  # why not scored, or how


class CompositionPass(Pass):
    name = "composition"
    tables = ("composition",)

    def wanted(self, plan) -> bool:
        return plan.config.composition != "off"

    def empty(self, plan, model) -> CompositionState:
        return CompositionState(np.zeros((0,) * 5), np.zeros((0, 0)))

    def open(self, run, state: CompositionState) -> PassRun:
        if state.scores.size or state.note:  # a resumed state read the weights when it started
            return PassRun()
        model = run.model
        refusal = composition_refusal(model)
        if refusal is not None:  # before the head count: a post-LayerNorm model is never scored, so say that
            state.note = f"not scored: {refusal}"
            return PassRun()
        heads = model.n_layers * model.n_heads
        if run.plan.config.composition == "auto" and heads > AUTO_HEADS:
            state.note = f"not scored: {heads} heads, more than {AUTO_HEADS} (--composition on scores them)"
            return PassRun()
        if run.head_weights is None:
            state.note = f"not scored: {run.unread}"
            return PassRun()
        try:
            state.scores, state.null, state.note = composition_arrays(model)
        except (HeadscanError, AttributeError, KeyError, RuntimeError, TypeError, ValueError) as error:
            state.note = f"not scored: {error}"
        return PassRun()

    def merge(self, states: list[CompositionState], names: list[str]) -> CompositionState:
        first = states[0]  # the same weights in every shard
        return CompositionState(first.scores.copy(), first.null.copy(), first.note)

    def join(self, states: list[CompositionState], order, names: list[str]) -> CompositionState:
        first = states[0]  # every part read the whole model's weights: the same scores, or the parts differ
        for state, name in zip(states[1:], names[1:]):
            if state.note != first.note or not (np.array_equal(state.scores, first.scores, equal_nan=True)
                                                and np.array_equal(state.null, first.null, equal_nan=True)):
                raise TablesError(f"{name}: its composition scores differ from {names[0]}'s, read off the same "
                                  f"weights (another machine or library version?); sweep the parts again on one "
                                  f"kind of machine, or with --composition off")
        return CompositionState(first.scores.copy(), first.null.copy(), first.note)

    def save(self, state: CompositionState):
        return {"note": state.note}, {"scores": state.scores, "null": state.null}

    def load(self, header: dict, arrays: dict) -> CompositionState:
        return CompositionState(sums_array(arrays["scores"], 5), sums_array(arrays["null"], 2), header.get("note"))

    def frames(self, state: CompositionState, per_head: dict) -> dict:
        if not state.scores.size:
            return {}
        rows = composition_rows(state.scores, state.null)
        n_heads = state.scores.shape[-1]
        swept = np.unique(np.asarray(per_head["layer"]))  # a sweep of some layers: the rows it swept the receiver of
        rows = rows[np.isin(rows["layer"], swept)].reset_index(drop=True)
        at = (np.searchsorted(swept, rows["layer"]) * n_heads + rows["head"]).to_numpy()  # in per_head's order
        heads = pd.DataFrame({k: (np.asarray(v)[at] if np.ndim(v) else v) for k, v in per_head.items()})
        frame = pd.concat([heads, rows.drop(columns=["layer", "head"])], axis=1)
        nan = float("nan")
        frame = frame.assign(sum=nan, count=nan, ci_low=nan, ci_high=nan, units=nan, top_unit_share=nan)
        return {"composition": TABLES["composition"].conform(frame)}

    def notes(self, state: CompositionState) -> dict:
        return {"composition": state.note} if state.note else {}
