"""The importance pass: each window's segments in the sample through the whole model, clean and with heads
removed, into the importance columns of the window's sums (the last columns of the score block; the run itself:
`headscan.scan.importance`). Its state keeps the mean pass's head means and what it decided, so a resumed sweep and
every shard ablate with the same ones."""

from __future__ import annotations

import numpy as np
import torch

from ...config import IMPORTANCE_METHODS
from ...errors import TablesError
from ...metrics.importance import methods
from ..importance import ImportanceRun, ImportanceState
from .base import Pass, PassRun, sums_array

__all__ = ["ImportancePass", "ImportanceState"]

# the rows of the importance table, by method (registry order), target, layer and head
_ORDER = ["method", "target", "layer", "head"]


class _ImportanceRun(PassRun):
    moves_bar = True  # the slow part of the sweep

    def __init__(self, run, state: ImportanceState):
        # a model whose heads cannot be cut is refused here, before the first window
        self.importance = ImportanceRun(run.model, run.corpus, run.plan.config, list(run.plan.columns))
        self.run, self.state = run, state

    def __enter__(self) -> PassRun:
        self.importance.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.importance.__exit__(*exc)

    def prepare(self) -> None:
        self.importance.prepare(self.state, self.run.should_stop, self.run.save)

    def fill(self, window, segments: list[int], units: list[int]) -> None:
        """Add the importance sums of the window's segments into the last columns of `window`."""
        bar, importance = self.run.bar, self.importance
        unit = dict(zip(segments, units))
        sums, counts = importance.window(segments, lambda index: window.units[unit[index]], len(window.units),
                                         self.run.device, self.run.should_stop,
                                         advance=bar.update if bar is not None else None)
        if bar is not None:  # the segments outside the sample, all at once
            bar.update(sum(index not in importance.sampled for index in segments))
        width = sums.shape[-1]
        with torch.inference_mode():  # the window's sums were made under the pattern pass's inference mode
            window.sums[..., -width:] += sums
            window.counts[..., -width:] += counts


class ImportancePass(Pass):
    name = "importance"
    tables = ("importance",)

    def wanted(self, plan) -> bool:
        return bool(methods(plan.config))

    def empty(self, plan, model) -> ImportanceState:
        return ImportanceState(np.zeros((0, 0, 0)))

    def open(self, run, state: ImportanceState) -> PassRun:
        return _ImportanceRun(run, state)

    def merge(self, states: list[ImportanceState], names: list[str]) -> ImportanceState:
        first = states[0]
        for state, name in zip(states[1:], names[1:]):
            _same_importance(first, state, names[0], name)
        return ImportanceState(first.head_means.copy(), dict(first.notes), first.ablation_passes)

    def save(self, state: ImportanceState):
        return {"notes": state.notes, "ablation_passes": state.ablation_passes}, {"head_means": state.head_means}

    def load(self, header: dict, arrays: dict) -> ImportanceState:
        if not isinstance(header.get("notes", {}), dict):
            raise ValueError("bad or missing importance notes in its header")
        return ImportanceState(sums_array(arrays["head_means"], 3), dict(header.get("notes") or {}),
                               header.get("ablation_passes"))

    def shape_frame(self, state: ImportanceState, table: str, frame, family):
        if table != "importance":
            return frame
        # a model fills one importance target: the others' columns are all empty and go
        frame = frame[frame["target"] == state.notes.get("target")]
        order = {name: i for i, name in enumerate(IMPORTANCE_METHODS)}
        return frame.sort_values(_ORDER, key=lambda c: c.map(order) if c.name == "method" else c, kind="stable")

    def notes(self, state: ImportanceState) -> dict:
        return {"importance": state.notes | {"ablation_passes": state.ablation_passes}} if state.notes else {}


def _same_importance(first: ImportanceState, state: ImportanceState, first_name: str, name: str) -> None:
    """Shards add up only if they ablated with the same means and the same heads: every shard draws the same
    sample of the whole corpus, so they agree up to the float rounding of the machines that computed them."""
    if first.notes.get("ablated") != state.notes.get("ablated"):
        raise TablesError(f"{name}: ablated other heads than {first_name} (their mean passes ranked the heads "
                          f"differently); sweep the shards again on one kind of machine")
    if first.head_means.shape != state.head_means.shape:
        raise TablesError(f"{name}: its head means have shape {state.head_means.shape}, {first_name}'s "
                          f"{first.head_means.shape}; merge shards of one sweep")
    scale = float(np.abs(first.head_means).max()) if first.head_means.size else 0.0
    gap = float(np.abs(first.head_means - state.head_means).max()) if first.head_means.size else 0.0
    if gap > 1e-5 * max(scale, 1e-12):
        raise TablesError(f"{name}: its head means differ from {first_name}'s by {gap:.1e}, so their mean "
                          f"ablations removed different things; sweep the shards again on one kind of machine")

