"""The syntax baseline pass: on a corpus with gold words (CoNLL-U), the fixed-offset baseline's sums and counts
over the same words the heads are scored on (`headscan.metrics.syntax.offset_baseline`), shown beside each
head in the syntax table, and each head's paired comparison with it.

The baseline itself is not bootstrapped: it is a fixed rule. The comparison is paired: per bootstrap unit u
(a segment or a document) the head's hits minus the offset's hits on the same dependents, d_u = h_u - b_u,
over the unit's dependents c_u, so the difference D = sum d_u / sum c_u gets its interval from the units'
power sums of (d_u, c_u), the delta method of `headscan.intervals.interval`. The best offset is only known
once the corpus is done, so the pass keeps the power sums against every offset (offset, layer, head, column)
and the table reads those of the offset chosen: the interval holds that offset fixed.

Chosen and estimated on the same words, the best of six offsets and the best of a model's heads are a little
optimistic (the winner's curse). So the table's ``baseline`` and ``vs_baseline`` are *cross-fitted*
(`cross_fit`): the units are split by the parity of their index (a document's, or a segment's where segments are
resampled), a deterministic split that every shard and resumed sweep agrees on; on the even units the offset is
the one best on the odd units and on the odd units the one best on the even units, and the two halves' hits are
added up, with the delta-method interval over all the units (each unit's d_u against its own half's held-out
offset; the choice is held fixed, as in cross-fitting). The same for the best head of each relation and direction
(``best_*``): on each half the head most accurate on the other half. The in-sample numbers, offset and head chosen
on the whole corpus, are kept beside them (``*_in_sample``). Where both halves choose the same offset as the whole
corpus, the held-out numbers equal the in-sample ones; where a column has no dependent in one half, NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from ... import intervals
from ...metrics import syntax
from .base import Pass, PassRun, join_axis, sums_array

__all__ = ["BaselinePass", "BaselineState", "PAIRED_COLUMNS", "IN_SAMPLE_COLUMNS", "CROSS_FIT_COLUMNS", "HALVES",
           "paired_difference", "cross_fit", "half_of"]

# The syntax table's columns for the paired comparison (`headscan.tables.TABLES["syntax"].extra`): cross-fitted
PAIRED_COLUMNS = ("vs_baseline", "vs_baseline_low", "vs_baseline_high")
# ... and in sample, the offset chosen on the whole corpus
IN_SAMPLE_COLUMNS = ("baseline_in_sample", "vs_baseline_in_sample", "vs_baseline_in_sample_low",
                     "vs_baseline_in_sample_high")
# What `cross_fit` adds to each row besides `PAIRED_COLUMNS` and ``baseline``
CROSS_FIT_COLUMNS = ("baseline_offset_even", "baseline_offset_odd", "best_even", "best_odd", "best_held_out",
                     "best_vs_baseline", "best_vs_baseline_low", "best_vs_baseline_high")
HALVES = "units split by the parity of their index (document, or segment where segments are resampled): even, odd"


def half_of(units) -> np.ndarray:
    """The half of the cross-fit each unit index falls in: 0 even, 1 odd.

    >>> half_of([0, 3, 8]).tolist()
    [0, 1, 0]
    """
    return np.asarray(list(units), dtype=np.int64) % 2


@dataclass
class BaselineState:
    # syntax column: a (relation, direction) of `headscan.metrics.syntax.columns` for the model's family (`columns`)
    sums: np.ndarray  # (2, offset, syntax column): the baseline's sums and counts
    # (2, offset, layer, head, syntax column): sum_u d_u^2 and sum_u d_u c_u with d_u the head's hits minus the
    # offset's in unit u; None where the sweep scored no syntax column (or a state saved without them)
    paired: np.ndarray | None = None
    units: np.ndarray | None = None  # (2, syntax column): sum_u c_u^2, and the number of units (every column)
    # The same per half of the units (`half_of`: 0 even, 1 odd), for the cross-fit; None where not kept (as paired,
    # or a state saved before headscan kept them): (half, 2, offset, column) the baseline's sums and counts,
    # (half, layer, head, column) the heads' hits, (half, 2, offset, layer, head, column) `paired`'s power sums and
    # (half, 2, column) `units`'
    half_sums: np.ndarray | None = None
    half_heads: np.ndarray | None = None
    half_paired: np.ndarray | None = None
    half_units: np.ndarray | None = None
    # the model's layers along the layer axes (a sweep of some layers: `SweepPlan.layers`); None: every layer, in order
    layers: tuple[int, ...] | None = None

    @property
    def has_halves(self) -> bool:
        return all(getattr(self, name) is not None for name in _HALF_ARRAYS)

    @property
    def columns(self) -> tuple[tuple[str, str], ...]:
        """The (relation, direction) of each syntax column: a causal model's `syntax.COLUMNS`, a bidirectional
        one's `syntax.PLAIN_COLUMNS` (no ``_visible`` directions), told apart by their number."""
        width = self.sums.shape[-1]
        if width not in (len(syntax.COLUMNS), len(syntax.PLAIN_COLUMNS)):
            raise ValueError(f"a syntax baseline state of {width} columns: neither a causal model's "
                             f"{len(syntax.COLUMNS)} nor a bidirectional one's {len(syntax.PLAIN_COLUMNS)}")
        return syntax.columns(width == len(syntax.COLUMNS))


_HALF_ARRAYS = ("half_sums", "half_heads", "half_paired", "half_units")


class _BaselineRun(PassRun):
    def __init__(self, run, state: BaselineState):
        self.state, self.device, self.causal = state, run.device, bool(run.model.causal)
        self.totals = torch.from_numpy(state.sums).to(run.device)
        # where the syntax metric's columns sit among the sweep's, in `syntax.columns(causal)` order
        self.columns = [i for i, (metric, _, _) in enumerate(run.plan.columns) if metric.name == "syntax"]
        self.width = len(syntax.columns(self.causal))
        paired = len(self.columns) == self.width and state.paired is not None
        self.paired = torch.from_numpy(state.paired).to(run.device) if paired else None
        self.units = torch.from_numpy(state.units).to(run.device) if paired else None
        halves = paired and state.has_halves  # a sweep resumed from a state saved without them keeps none
        self.halves = {name: torch.from_numpy(getattr(state, name)).to(run.device) for name in _HALF_ARRAYS} \
            if halves else None

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
        base = torch.zeros((n_units, len(syntax.BASELINE_OFFSETS), self.width), dtype=torch.float64,
                           device=self.device)  # (unit, offset, column): the offsets' hits per unit
        count = torch.zeros((n_units, self.width), dtype=torch.float64, device=self.device)
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
        if self.halves is not None:
            self._fill_halves(window, heads, base, count)

    def _fill_halves(self, window, heads: torch.Tensor, base: torch.Tensor, count: torch.Tensor) -> None:
        """The window's sums and power sums per half of the units (`half_of`), for the cross-fit: the same terms
        as `fill` adds up over every unit, each added into its unit's half."""
        half = torch.from_numpy(half_of(window.units)).to(self.device)  # (unit,) in the window's row order
        split = torch.nn.functional.one_hot(half, 2).to(torch.float64)  # (unit, half)
        into = self.halves
        into["half_sums"][:, 0] += torch.einsum("uv,uoc->voc", split, base)
        into["half_sums"][:, 1] += torch.einsum("uv,uc->vc", split, count)[:, None, :]
        into["half_heads"] += torch.einsum("uv,luhc->vlhc", split, heads)
        for k in range(base.shape[1]):  # a few offsets; every head at once
            difference = heads - base[None, :, None, k]  # (layer, unit, head, column)
            into["half_paired"][:, 0, k] += torch.einsum("uv,luhc->vlhc", split, difference * difference)
            into["half_paired"][:, 1, k] += torch.einsum("uv,luhc->vlhc", split, difference * count[None, :, None])
        into["half_units"][:, 0] += split.T @ (count * count)
        into["half_units"][:, 1] += split.sum(0)[:, None]

    def end_window(self) -> None:
        self.totals += self.window

    def store(self, last: bool = False) -> None:
        array = self.totals.cpu().numpy()
        self.state.sums = array if last else array.copy()
        if self.paired is not None:
            for name in ("paired", "units"):
                array = getattr(self, name).cpu().numpy()
                setattr(self.state, name, array if last else array.copy())
        if self.halves is not None:
            for name, tensor in self.halves.items():
                array = tensor.cpu().numpy()
                setattr(self.state, name, array if last else array.copy())


def _delta(difference_sum, count, n_units, ss, sc, cc, level: float):
    """(value, low, high): the ratio D = `difference_sum` / `count` and its delta-method interval over `n_units`
    units with power sums sum_u d_u^2 (`ss`), d_u c_u (`sc`) and c_u^2 (`cc`), clipped to [-1, 1]; NaN where
    `count` is not above 0 or a term is NaN."""
    difference_sum, count = np.asarray(difference_sum, dtype=float), np.asarray(count, dtype=float)
    n = len(count)
    defined = np.isfinite(difference_sum) & (count > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.where(defined, difference_sum / count, np.nan)
    terms = {"units": n_units, "contributing": n_units, "s": difference_sum, "c": count, "ss": ss, "sc": sc, "cc": cc}
    moments = np.zeros((len(intervals.MOMENT_TERMS), n))
    for name, term in terms.items():
        moments[intervals.MOMENT_TERMS.index(name)] = np.where(defined, term, 0.0)
    low, high = intervals.interval(value, None, None, moments, method="delta", level=level,
                                   bounds=(np.full(n, -1.0), np.full(n, 1.0)))
    return value, np.where(defined, low, np.nan), np.where(defined, high, np.nan)


def _rows(frame, state: BaselineState) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each row's syntax column (its index in the state's `BaselineState.columns`; 0 where it is none of them),
    layer (its place on the state's layer axes) and head, and whether its column is one of them."""
    # one index look-up for every row, -1 for a (relation, direction) the sweep has none of
    column = pd.MultiIndex.from_tuples(state.columns).get_indexer(
        pd.MultiIndex.from_arrays([frame["relation"], frame["direction"]])).astype(np.int64)
    layer = frame["layer"].to_numpy(int)
    if state.layers is not None:  # a sweep of some layers keeps those alone, in order
        layer = np.searchsorted(np.asarray(state.layers), layer)
    return np.where(column >= 0, column, 0), layer, frame["head"].to_numpy(int), column >= 0


def paired_difference(frame, state: BaselineState, level: float = 0.95):
    """(vs_baseline, low, high) per row of a syntax `frame` (keyed by layer, head, relation and direction, with
    ``sum``, ``count`` and the chosen ``baseline_offset``): the head's accuracy minus its baseline's on the same
    dependents and the delta-method interval over the units; NaN where not recorded or no dependent counts.
    The offset is held fixed: this is the in-sample comparison when it was chosen on the same corpus."""
    n = len(frame)
    nan = np.full(n, np.nan)
    if state.paired is None or state.units is None or n == 0:
        return nan, nan, nan
    column, layer, head, known = _rows(frame, state)
    offsets = frame["baseline_offset"].to_numpy(dtype=float, na_value=np.nan)
    known = known & np.isfinite(offsets)
    offset = np.searchsorted(np.asarray(syntax.BASELINE_OFFSETS), np.where(known, offsets, 0).astype(int))
    count = np.where(known, frame["count"].to_numpy(dtype=float, na_value=np.nan), np.nan)
    difference_sum = frame["sum"].to_numpy(dtype=float, na_value=np.nan) - state.sums[0][offset, column]
    return _delta(difference_sum, count, state.units[1][column], state.paired[0][offset, layer, head, column],
                  state.paired[1][offset, layer, head, column], state.units[0][column], level)


def cross_fit(frame, state: BaselineState, *, causal: bool = False, level: float = 0.95) -> dict[str, np.ndarray]:
    """The cross-fitted comparison of each row of a syntax `frame` (keyed by layer, head, relation and direction)
    with the fixed-offset baseline, and of its relation and direction's best head; columns by name.

    Each half of the units (`half_of`) is scored with the choices made on the other: ``baseline_offset_even``
    is the best offset on the even units (`headscan.metrics.syntax.best_baseline`, among those the model's
    queries can see, `causal`), used on the odd ones, and ``baseline_offset_odd`` the reverse. ``baseline``
    is the offsets' held-out accuracy, both halves' hits added up over all the dependents, and ``vs_baseline``
    (``_low``, ``_high``) the head's accuracy minus it on the same dependents, with the delta-method interval
    over every unit, each unit's difference against its half's held-out offset (the choices held fixed).
    ``best_even`` (``best_odd``): the row's head is its relation and direction's most accurate on the even (odd)
    units (ties to the lower layer, then head); ``best_held_out``: the accuracy, added up over both halves, of the
    head most accurate on the other half, and ``best_vs_baseline`` (``_low``, ``_high``) its paired difference
    from the offset chosen on that same other half, the same on every row of the relation and direction. NaN
    (<NA>) where a half has no dependent of the column, or the state kept no halves.
    """
    n = len(frame)
    out = {"baseline": np.full(n, np.nan), **{c: np.full(n, np.nan) for c in PAIRED_COLUMNS},
           **{c: np.full(n, np.nan) for c in CROSS_FIT_COLUMNS}}
    out |= {c: pd.array([pd.NA] * n, dtype="Int64") for c in ("baseline_offset_even", "baseline_offset_odd")}
    out |= {c: pd.array([pd.NA] * n, dtype="boolean") for c in ("best_even", "best_odd")}
    if not state.has_halves or n == 0:
        return out
    half_sums, heads, paired, units = state.half_sums, state.half_heads, state.half_paired, state.half_units
    # per half: the best offset (its index among BASELINE_OFFSETS) and the most accurate head, per column
    choice, pick, defined = [], [], []
    for half in (0, 1):
        value, offset = syntax.best_baseline(half_sums[half, 0], half_sums[half, 1], causal=causal)
        choice.append(np.searchsorted(np.asarray(syntax.BASELINE_OFFSETS), offset))
        flat = heads[half].reshape(-1, heads.shape[-1])  # (layer * head, column); a column's heads share one count
        pick.append(np.argmax(flat, axis=0))  # the first largest: the lower layer, then head
        defined.append(np.isfinite(value) & (half_sums[half, 1, 0] > 0))
    both = defined[0] & defined[1]  # (column,)
    columns = np.arange(heads.shape[-1])
    count = half_sums[0, 1, 0] + half_sums[1, 1, 0]  # (column,)
    n_units = units[0, 1] + units[1, 1]
    cc = units[0, 0] + units[1, 0]
    # half h is scored with the other half's choices: other[h] = the choice made on half 1 - h
    held_base = sum(half_sums[h, 0, choice[1 - h], columns] for h in (0, 1))  # (column,)

    column, layer, head, known = _rows(frame, state)
    ok = known & both[column]
    hits = heads[0, layer, head, column] + heads[1, layer, head, column]
    with np.errstate(invalid="ignore", divide="ignore"):
        out["baseline"] = np.where(ok, held_base[column] / count[column], np.nan)
    ss, sc = (sum(paired[h, t, choice[1 - h][column], layer, head, column] for h in (0, 1)) for t in (0, 1))
    value, low, high = _delta(np.where(ok, hits - held_base[column], np.nan), count[column], n_units[column], ss, sc,
                              cc[column], level)
    out |= dict(zip(PAIRED_COLUMNS, (value, low, high)))
    for name, offsets, mine in (("baseline_offset_even", choice[0], defined[0]),
                                ("baseline_offset_odd", choice[1], defined[1])):
        values = np.asarray(syntax.BASELINE_OFFSETS)[offsets][column]
        out[name] = pd.array(np.where(known & mine[column], values, 0), dtype="Int64")
        out[name][~(known & mine[column])] = pd.NA
    flat_index = layer * heads.shape[2] + head
    for name, picked, mine in (("best_even", pick[0], defined[0]), ("best_odd", pick[1], defined[1])):
        flags = pd.array(flat_index == picked[column], dtype="boolean")
        flags[~(known & mine[column])] = pd.NA
        out[name] = flags

    # the best head, per column: on half h the head picked on the other half, against that half's offset
    flat_heads = heads.reshape(2, -1, heads.shape[-1])  # (half, layer * head, column)
    flat_paired = paired.reshape(2, 2, paired.shape[2], -1, paired.shape[-1])  # (half, 2, offset, layer * head, col)
    best_hits = sum(flat_heads[h, pick[1 - h], columns] for h in (0, 1))
    best_ss, best_sc = (sum(flat_paired[h, t, choice[1 - h], pick[1 - h], columns] for h in (0, 1)) for t in (0, 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        held_out = np.where(both, best_hits / count, np.nan)
    best = _delta(np.where(both, best_hits - held_base, np.nan), count, n_units, best_ss, best_sc, cc, level)
    out["best_held_out"] = np.where(ok, held_out[column], np.nan)
    for name, array in zip(("best_vs_baseline", "best_vs_baseline_low", "best_vs_baseline_high"), best):
        out[name] = np.where(ok, array[column], np.nan)
    return out


class BaselinePass(Pass):
    name = "baseline"
    tables = ("syntax",)

    def wanted(self, plan) -> bool:
        return plan.words

    def empty(self, plan, model) -> BaselineState:
        n_offsets, n_columns = len(syntax.BASELINE_OFFSETS), len(syntax.columns(model.causal))
        shape = (n_offsets, len(plan.layers), model.n_heads, n_columns)
        some = tuple(plan.layers) if len(plan.layers) < model.n_layers else None
        return BaselineState(np.zeros((2, n_offsets, n_columns)), np.zeros((2, *shape)), np.zeros((2, n_columns)),
                             np.zeros((2, 2, n_offsets, n_columns)), np.zeros((2, *shape[1:])),
                             np.zeros((2, 2, *shape)), np.zeros((2, 2, n_columns)), layers=some)

    def open(self, run, state: BaselineState) -> PassRun:
        return _BaselineRun(run, state)

    def merge(self, states: list[BaselineState], names: list[str]) -> BaselineState:
        total = states[0].sums.copy()
        for state in states[1:]:
            total = total + state.sums  # same fingerprint, so the same shape
        if any(state.paired is None or state.units is None for state in states):
            return BaselineState(total)
        merged = BaselineState(total, sum(state.paired for state in states), sum(state.units for state in states),
                               layers=states[0].layers)
        if all(state.has_halves for state in states):  # the halves are of unit indices, the same in every shard
            for name in _HALF_ARRAYS:
                setattr(merged, name, sum(getattr(state, name) for state in states))
        return merged

    def join(self, states: list[BaselineState], order, names: list[str]) -> BaselineState:
        # the offsets' sums are the corpus's, the same in every part; the heads' terms join along their layer axes
        first = states[0]
        layers = [layer for state in states for layer in state.layers]
        joined = BaselineState(first.sums.copy(), layers=tuple(np.take(layers, order).tolist()))
        if any(state.paired is None or state.units is None for state in states):
            return joined
        joined.paired, joined.units = join_axis([s.paired for s in states], 2, order), first.units.copy()
        if all(state.has_halves for state in states):
            joined.half_sums, joined.half_units = first.half_sums.copy(), first.half_units.copy()
            joined.half_heads = join_axis([s.half_heads for s in states], 1, order)
            joined.half_paired = join_axis([s.half_paired for s in states], 3, order)
        return joined

    def save(self, state: BaselineState):
        arrays = {"sums": state.sums}
        if state.paired is not None and state.units is not None:
            arrays |= {"paired": state.paired, "units": state.units}
            if state.has_halves:
                arrays |= {name: getattr(state, name) for name in _HALF_ARRAYS}
        return {"layers": None if state.layers is None else list(state.layers)}, arrays

    def load(self, header: dict, arrays: dict) -> BaselineState:
        layers = header.get("layers")
        sums = sums_array(arrays["sums"], 3)
        if sums.shape[0] != 2:
            raise ValueError("its arrays do not fit together")
        if "paired" not in arrays:  # saved without the paired comparison: the table leaves it NaN
            return BaselineState(sums, layers=layers if layers is None else tuple(layers))
        paired, units = sums_array(arrays["paired"], 5), sums_array(arrays["units"], 2)
        if paired.shape[0] != 2 or units.shape != (2, paired.shape[-1]) or paired.shape[-1] != sums.shape[-1]:
            raise ValueError("its arrays do not fit together")
        state = BaselineState(sums, paired, units, layers=layers if layers is None else tuple(layers))
        if not all(name in arrays for name in _HALF_ARRAYS):  # saved before the cross-fit: its columns stay NaN
            return state
        halves = {name: sums_array(arrays[name], ndim) for name, ndim in zip(_HALF_ARRAYS, (4, 4, 6, 3))}
        if (halves["half_sums"].shape != (2, *sums.shape) or halves["half_heads"].shape != (2, *paired.shape[2:])
                or halves["half_paired"].shape != (2, *paired.shape) or halves["half_units"].shape != (2, *units.shape)):
            raise ValueError("its arrays do not fit together")
        for name, array in halves.items():
            setattr(state, name, array)
        return state

    def notes(self, state: BaselineState) -> dict:
        if not state.has_halves:
            return {"syntax_cross_fit": "none (a state saved without its halves): baseline and vs_baseline are NaN"}
        return {"syntax_cross_fit": {"split": HALVES, "units": [int(n) for n in state.half_units[:, 1].max(-1)],
                                     "chosen": "the best offset and the best head per relation and direction, on "
                                               "each half, scored on the other"}}

    def shape_frame(self, state: BaselineState, table: str, frame, family):
        if table != "syntax":
            return frame
        causal = family == "causal"
        # the baseline among the offsets the model's queries can see, chosen on the whole corpus: in sample
        frame = syntax.attach_baseline(frame, state.sums[0], state.sums[1], causal=causal)
        in_sample = (frame["baseline"], *paired_difference(frame, state))
        # ... and cross-fitted, each half of the units scored with the choices of the other: what findings rest on
        return frame.assign(**dict(zip(IN_SAMPLE_COLUMNS, in_sample)), **cross_fit(frame, state, causal=causal))
