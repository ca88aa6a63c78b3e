"""The syntax baseline pass: on a corpus with gold words (CoNLL-U), the fixed-offset baseline's sums and counts
over the same words the heads are scored on (`headscan.metrics.syntax.offset_baseline`), shown beside each
head in the syntax table, and each head's paired comparison with it.

The baseline itself is not bootstrapped: it is a fixed rule. The comparison is paired: per bootstrap unit u
(a segment or a document) the head's hits minus the offset's hits on the same dependents, d_u = h_u - b_u,
over the unit's dependents c_u, so the difference D = sum d_u / sum c_u gets its interval from the units'
power sums of (d_u, c_u), the delta method of `headscan.intervals.interval`. The best offset is only known
once the corpus is done, so the pass keeps the power sums against every offset (offset, layer, head, column)
and the table reads those of the offset chosen: the interval holds that offset fixed. Choosing the best of
a few offsets on the same words raises the baseline, so the difference errs low: "beats its baseline" stays
a safe claim.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ... import intervals
from ...metrics import syntax
from .base import Pass, PassRun, sums_array

__all__ = ["BaselinePass", "BaselineState", "PAIRED_COLUMNS", "paired_difference"]

# The syntax table's columns for the paired comparison (`headscan.tables.TABLES["syntax"].extra`).
PAIRED_COLUMNS = ("vs_baseline", "vs_baseline_low", "vs_baseline_high")


@dataclass
class BaselineState:
    sums: np.ndarray  # (2, offset, syntax column): the baseline's sums and counts
    # (2, offset, layer, head, syntax column): sum_u d_u^2 and sum_u d_u c_u with d_u the head's hits minus the
    # offset's in unit u; None where the sweep scored no syntax column (or a state saved without them)
    paired: np.ndarray | None = None
    units: np.ndarray | None = None  # (2, syntax column): sum_u c_u^2, and the number of units (every column)


class _BaselineRun(PassRun):
    def __init__(self, run, state: BaselineState):
        self.state, self.device, self.causal = state, run.device, bool(run.model.causal)
        self.totals = torch.from_numpy(state.sums).to(run.device)
        # where the syntax metric's columns sit among the sweep's, in `syntax.COLUMNS` order
        self.columns = [i for i, (metric, _, _) in enumerate(run.plan.columns) if metric.name == "syntax"]
        paired = len(self.columns) == len(syntax.COLUMNS) and state.paired is not None
        self.paired = torch.from_numpy(state.paired).to(run.device) if paired else None
        self.units = torch.from_numpy(state.units).to(run.device) if paired else None

    def begin_window(self) -> None:
        self.window = torch.zeros_like(self.totals)
        self.parts: list[tuple[list[int], torch.Tensor, torch.Tensor]] = []  # per batch: segment positions, sums, counts

    def after_batch(self, step) -> None:
        words = step.batch.words
        if words is not None:  # the fixed-offset baseline on the same words: one rule for the batch
            sums, counts = syntax.offset_baseline(words.to(self.device), causal=self.causal)  # (batch, offset, column)
            self.window += torch.stack([sums.sum(0), counts.sum(0)])
            if self.paired is not None:
                self.parts.append(([step.encoded.segment_of(int(i)) for i in step.batch.index], sums, counts[:, 0]))

    def fill(self, window, segments: list[int], units: list[int]) -> None:
        if self.paired is None or not self.parts:
            return
        n_units = len(window.units)
        base = torch.zeros((n_units, len(syntax.BASELINE_OFFSETS), len(syntax.COLUMNS)), dtype=torch.float64,
                           device=self.device)  # (unit, offset, column): the offsets' hits per unit
        count = torch.zeros((n_units, len(syntax.COLUMNS)), dtype=torch.float64, device=self.device)
        for positions, sums, counts in self.parts:
            rows = torch.tensor([window.units[units[p]] for p in positions], dtype=torch.long, device=self.device)
            base.index_add_(0, rows, sums.to(torch.float64))
            count.index_add_(0, rows, counts.to(torch.float64))
        heads = window.sums[..., self.columns]  # (layer, unit, head, column): the heads' hits per unit
        for k in range(base.shape[1]):  # a few offsets; every head at once
            difference = heads - base[None, :, None, k]  # (layer, unit, head, column)
            self.paired[0, k] += (difference * difference).sum(1)
            self.paired[1, k] += (difference * count[None, :, None]).sum(1)
        self.units[0] += (count * count).sum(0)
        self.units[1] += n_units

    def end_window(self) -> None:
        self.totals += self.window

    def store(self, last: bool = False) -> None:
        array = self.totals.cpu().numpy()
        self.state.sums = array if last else array.copy()
        if self.paired is not None:
            for name in ("paired", "units"):
                array = getattr(self, name).cpu().numpy()
                setattr(self.state, name, array if last else array.copy())


def paired_difference(frame, state: BaselineState, level: float = 0.95):
    """(vs_baseline, low, high) per row of a syntax `frame` (keyed by layer, head, relation and direction, with
    ``sum``, ``count`` and the chosen ``baseline_offset``): the head's accuracy minus its baseline's on the same
    dependents and the delta-method interval over the units; NaN where not recorded or no dependent counts."""
    n = len(frame)
    nan = np.full(n, np.nan)
    if state.paired is None or state.units is None or n == 0:
        return nan, nan, nan
    # each row's syntax column, -1 for a (relation, direction) the sweep has none of
    column = pd.MultiIndex.from_tuples(syntax.COLUMNS).get_indexer(
        pd.MultiIndex.from_arrays([frame["relation"], frame["direction"]]))
    offsets = frame["baseline_offset"].to_numpy(dtype=float, na_value=np.nan)
    known = (column >= 0) & np.isfinite(offsets)
    column = np.where(known, column, 0)
    offset = np.searchsorted(np.asarray(syntax.BASELINE_OFFSETS), np.where(known, offsets, 0).astype(int))
    layer, head = frame["layer"].to_numpy(int), frame["head"].to_numpy(int)
    count = frame["count"].to_numpy(dtype=float, na_value=np.nan)
    difference_sum = frame["sum"].to_numpy(dtype=float, na_value=np.nan) - state.sums[0][offset, column]
    defined = known & (count > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.where(defined, difference_sum / count, np.nan)
    terms = {"units": state.units[1][column], "contributing": state.units[1][column], "s": difference_sum,
             "c": count, "ss": state.paired[0][offset, layer, head, column],
             "sc": state.paired[1][offset, layer, head, column], "cc": state.units[0][column]}
    moments = np.zeros((len(intervals.MOMENT_TERMS), n))
    for name, term in terms.items():
        moments[intervals.MOMENT_TERMS.index(name)] = term
    low, high = intervals.interval(value, None, None, moments, method="delta", level=level,
                                   bounds=(np.full(n, -1.0), np.full(n, 1.0)))
    return value, np.where(defined, low, np.nan), np.where(defined, high, np.nan)


class BaselinePass(Pass):
    name = "baseline"
    tables = ("syntax",)

    def wanted(self, plan) -> bool:
        return plan.words

    def empty(self, plan, model) -> BaselineState:
        shape = (len(syntax.BASELINE_OFFSETS), model.n_layers, model.n_heads, len(syntax.COLUMNS))
        return BaselineState(np.zeros((2, len(syntax.BASELINE_OFFSETS), len(syntax.COLUMNS))),
                             np.zeros((2, *shape)), np.zeros((2, len(syntax.COLUMNS))))

    def open(self, run, state: BaselineState) -> PassRun:
        return _BaselineRun(run, state)

    def merge(self, states: list[BaselineState], names: list[str]) -> BaselineState:
        total = states[0].sums.copy()
        for state in states[1:]:
            total = total + state.sums  # same fingerprint, so the same shape
        if any(state.paired is None or state.units is None for state in states):
            return BaselineState(total)
        return BaselineState(total, sum(state.paired for state in states), sum(state.units for state in states))

    def save(self, state: BaselineState):
        arrays = {"sums": state.sums}
        if state.paired is not None and state.units is not None:
            arrays |= {"paired": state.paired, "units": state.units}
        return {}, arrays

    def load(self, header: dict, arrays: dict) -> BaselineState:
        sums = sums_array(arrays["sums"], 3)
        if sums.shape[0] != 2:
            raise ValueError("its arrays do not fit together")
        if "paired" not in arrays:  # saved without the paired comparison: the table leaves it NaN
            return BaselineState(sums)
        paired, units = sums_array(arrays["paired"], 5), sums_array(arrays["units"], 2)
        if paired.shape[0] != 2 or units.shape != (2, paired.shape[-1]) or paired.shape[-1] != sums.shape[-1]:
            raise ValueError("its arrays do not fit together")
        return BaselineState(sums, paired, units)

    def shape_frame(self, state: BaselineState, table: str, frame, family):
        if table != "syntax":
            return frame
        # the baseline among the offsets the model's queries can see, then each head against it on the same words
        frame = syntax.attach_baseline(frame, state.sums[0], state.sums[1], causal=family == "causal")
        return frame.assign(**dict(zip(PAIRED_COLUMNS, paired_difference(frame, state))))
