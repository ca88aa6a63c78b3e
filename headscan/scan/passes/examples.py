"""The examples pass: for every head and every heads.parquet metric, the bootstrap units (segments or documents)
where the head scores highest and lowest, with their own value, sum and count and their text, in
examples.parquet (``--examples K``, default 5; 0: none).

A head's score is a mean over the whole corpus; its examples say what that mean is made of. Each unit's own
value is its sum over its count (the unit's queries that count for the metric); units with no such query are no
example. The pass reads the per-unit sums the sweep keeps for its intervals (`headscan.scan.reduce.Window`), so
it costs no forward pass: after each window it keeps, per (layer, head, metric), the K highest and K lowest
units so far. Values are ranked to 5 significant digits (a unit's sums are float32 sums whose last digits depend
on how its batch was cut) and ties go to the lower unit index, so the kept units of a corpus do not depend on how
it was cut:
shards merge (the top K of the shards' top K) and a resumed sweep continues to exactly the units of a sweep
that never stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...tables import TABLES
from ...tables.io import significant
from .base import Pass, PassRun, join_axis

__all__ = ["ExamplesPass", "ExamplesState", "keep_extremes", "examples_frame", "ENDS"]

ENDS = ("top", "bottom")  # the highest units first, then the lowest


@dataclass
class ExamplesState:
    metrics: tuple[str, ...]  # the heads.parquet metrics, in the order of the arrays' metric axis
    units: np.ndarray  # (end, layer, head, metric, k) int64: the unit kept at each rank, -1 where fewer than k
    sums: np.ndarray  # (end, layer, head, metric, k) float64: its sum
    counts: np.ndarray  # (end, layer, head, metric, k) float64: its count
    texts: dict[int, str] = field(default_factory=dict)  # unit -> its text, for every unit kept


def keep_extremes(units: np.ndarray, sums: np.ndarray, counts: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    """Of candidate units along the last axis (unit ids, sums, counts; -1 and count 0 for none; a unit given twice
    counts once), the `k` with the highest value sum / count and the `k` with the lowest, ties (`significant`
    digits) to the lower unit: (units, sums, counts), each (2, ..., k), top first. Ranks beyond the candidates
    with a count hold -1, NaN and 0.

    >>> u, s, c = keep_extremes(np.array([4, 2, 9, 7]), np.array([1.0, 3.0, 0.0, 1.0]), np.array([2.0, 4.0, 0, 1]), 2)
    >>> u.tolist(), s.tolist()
    ([[7, 2], [4, 2]], [[1.0, 3.0], [1.0, 3.0]])
    """
    missing = k - units.shape[-1]
    if missing > 0:
        def pad(a, fill):
            return np.concatenate([a, np.full((*a.shape[:-1], missing), fill, a.dtype)], -1)

        units, sums, counts = pad(units, -1), pad(sums, 0.0), pad(counts, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.where((counts > 0) & (units >= 0), sums / counts, np.nan)
    by_unit = np.argsort(np.where(units >= 0, units, np.iinfo(np.int64).max), axis=-1, kind="stable")
    value, units, sums, counts = (np.take_along_axis(a, by_unit, -1) for a in (value, units, sums, counts))
    # a unit kept at both ends while fewer than 2k were seen comes twice: once is enough
    repeat = np.concatenate([np.zeros((*units.shape[:-1], 1), bool), np.diff(units, axis=-1) == 0], -1) & (units >= 0)
    value = np.where(repeat, np.nan, value)
    ranked = significant(value)  # values equal to float32's rounding are ties, which the lower unit wins
    kept = []
    for key in (-ranked, ranked):  # NaN sorts last either way: a unit without a count is never an example
        order = np.argsort(key, axis=-1, kind="stable")[..., :k]
        defined = np.take_along_axis(np.isfinite(value), order, -1)
        kept.append([np.where(defined, np.take_along_axis(a, order, -1), empty)
                     for a, empty in ((units, -1), (sums, np.nan), (counts, 0.0))])
    return tuple(np.stack(part) for part in zip(*kept))


def _both_ends(array: np.ndarray) -> np.ndarray:
    """(end, ..., k) kept arrays as one row of 2k candidates, (..., 2k)."""
    return np.concatenate([array[0], array[1]], -1)


def _texts_kept(units: np.ndarray, texts: dict[int, str]) -> dict[int, str]:
    """The texts of the units `units` keeps, and no others."""
    kept = set(np.unique(units).tolist()) - {-1}
    return {unit: text for unit, text in texts.items() if unit in kept}


class _ExamplesRun(PassRun):
    def __init__(self, run, state: ExamplesState, k: int):
        self.state, self.k, self.corpus = state, k, run.corpus
        names = {name: i for i, name in enumerate(state.metrics)}
        # where each heads.parquet metric's column sits among the sweep's (value-weighted copies are "value")
        self.columns = [i for i, (metric, _, table) in enumerate(run.plan.columns)
                        if table == "heads" and metric.name in names]

    def fill(self, window, segments: list[int], units: list[int]) -> None:
        if not self.columns or not window.units:
            return
        ids = np.array(list(window.units), dtype=np.int64)  # window rows in order: unit ids
        rows = np.array(list(window.units.values()))
        order = np.argsort(rows)
        ids = ids[order]
        pick = lambda a: a[..., self.columns].double().cpu().numpy().transpose(0, 2, 3, 1)  # noqa: E731
        sums, counts = pick(window.sums), pick(window.counts)  # (layer, head, metric, unit)
        shape = sums.shape[:-1]
        state = self.state
        # this window's units beside those kept so far (each end's), then the extremes of all of them
        candidates = [np.concatenate([_both_ends(state.units), np.broadcast_to(ids, (*shape, len(ids)))], -1),
                      np.concatenate([_both_ends(state.sums), sums], -1),
                      np.concatenate([_both_ends(state.counts), counts], -1)]
        state.units, state.sums, state.counts = keep_extremes(*candidates, self.k)
        text = {}
        for position, unit in zip(segments, units):
            text.setdefault(unit, []).append(self.corpus.segments[position].text)
        state.texts = _texts_kept(state.units, state.texts | {unit: " ".join(parts) for unit, parts in text.items()})


class ExamplesPass(Pass):
    name = "examples"
    tables = ("examples",)

    def wanted(self, plan) -> bool:
        return getattr(plan.config, "examples", 0) > 0 and any(t == "heads" for _, _, t in plan.columns)

    def empty(self, plan, model) -> ExamplesState:
        metrics = tuple(dict.fromkeys(metric.name for metric, _, table in plan.columns if table == "heads"))
        shape = (2, len(plan.layers), model.n_heads, len(metrics), plan.config.examples)
        return ExamplesState(metrics, np.full(shape, -1, np.int64), np.full(shape, np.nan), np.zeros(shape))

    def open(self, run, state: ExamplesState) -> PassRun:
        return _ExamplesRun(run, state, run.plan.config.examples)

    def merge(self, states: list[ExamplesState], names: list[str]) -> ExamplesState:
        first = states[0]
        k = first.units.shape[-1]
        merged = [np.concatenate([_both_ends(getattr(s, name)) for s in states], -1)
                  for name in ("units", "sums", "counts")]
        units, sums, counts = keep_extremes(*merged, k)
        texts = {unit: text for s in states for unit, text in s.texts.items()}
        return ExamplesState(first.metrics, units, sums, counts, _texts_kept(units, texts))

    def join(self, states: list[ExamplesState], order, names: list[str]) -> ExamplesState:
        # each head's examples are ranked among its own units: the layers' rows join
        joined = [join_axis([getattr(s, name) for s in states], 1, order) for name in ("units", "sums", "counts")]
        texts = {unit: text for s in states for unit, text in s.texts.items()}
        return ExamplesState(states[0].metrics, *joined, texts)

    def save(self, state: ExamplesState):
        header = {"metrics": list(state.metrics), "texts": {str(unit): text for unit, text in state.texts.items()}}
        return header, {"units": state.units, "sums": state.sums, "counts": state.counts}

    def load(self, header: dict, arrays: dict) -> ExamplesState:
        units = np.asarray(arrays["units"], dtype=np.int64)
        sums, counts = (np.asarray(arrays[n], dtype=np.float64) for n in ("sums", "counts"))
        metrics = tuple(header.get("metrics", ()))
        if units.ndim != 5 or units.shape != sums.shape or units.shape != counts.shape or units.shape[3] != len(metrics):
            raise ValueError("its arrays do not fit together")
        return ExamplesState(metrics, units, sums, counts, {int(u): t for u, t in header.get("texts", {}).items()})

    def frames(self, state: ExamplesState, per_head: dict) -> dict:
        return {"examples": examples_frame(state, per_head)}

    def notes(self, state: ExamplesState) -> dict:
        return {"examples": f"the {state.units.shape[-1]} highest and lowest units of each head and heads metric"}


def examples_frame(state: ExamplesState, per_head: dict) -> pd.DataFrame:
    """examples.parquet of one model: a row per (layer, head, metric, end, rank) that holds a unit."""
    _, n_layers, n_heads, n_metrics, k = state.units.shape
    end, flat_head, metric, rank = np.meshgrid(np.arange(2), np.arange(n_layers * n_heads), np.arange(n_metrics),
                                               np.arange(k), indexing="ij")
    units = state.units.reshape(2, n_layers * n_heads, n_metrics, k)
    sums = state.sums.reshape(units.shape)
    counts = state.counts.reshape(units.shape)
    keep = units >= 0
    pick = lambda a: a[keep]  # noqa: E731
    rows = pick(flat_head)
    head = {name: column if column is None or isinstance(column, str) else np.asarray(column)[rows]
            for name, column in per_head.items()}
    nan = float("nan")
    with np.errstate(invalid="ignore", divide="ignore"):
        value = pick(sums) / pick(counts)
    frame = pd.DataFrame(head | {
        "metric": np.asarray(state.metrics, dtype=object)[pick(metric)], "end": np.asarray(ENDS)[pick(end)],
        "rank": pick(rank) + 1, "value": value, "sum": pick(sums), "count": pick(counts), "ci_low": nan,
        "ci_high": nan, "units": 1.0, "top_unit_share": 1.0, "n_eff": nan, "variance_df": nan, "thin": pd.NA,
        "chance": nan, "unit": pick(units), "text": [state.texts.get(int(u), "") for u in pick(units)]})
    order = {name: i for i, name in enumerate(state.metrics)}
    frame = frame.sort_values(["layer", "head", "metric", "end", "rank"], kind="stable",
                              key=lambda c: c.map(order) if c.name == "metric" else
                              (c.map({e: i for i, e in enumerate(ENDS)}) if c.name == "end" else c))
    return TABLES["examples"].conform(frame)
