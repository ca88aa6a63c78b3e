"""Finishing a sweep: partial states into tables, with their provenance, published as one set.

`finish` turns one model's finished `PartialState` into its tables (each score column's rows into its
metric's table, and the weights table from the scores read off the weights); `publish` is the one step that
the local sweep, `merge` and the Ray sweep share: finish every model, fill the run's provenance, put the
models side by side and write them into the output folder, removing the partial states.

This module runs no model.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import subprocess
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from .. import __version__
from ..config import IMPORTANCE_METHODS, SweepConfig
from ..corpus import Corpus
from ..metrics import METRICS, syntax
from ..models import resolve_device
from ..tables import (TABLES, CorpusProvenance, ModelProvenance, RunProvenance, SweepTables, concat, head_columns,
                      write)
from .plan import columns_of, has_words, resolve_unit
from .similarity import across_sums
from .state import PartialState, Shard

__all__ = ["WEIGHT_METRICS", "WEIGHT_CHANCE", "finish", "weights_frame", "similarity_frame", "swept_config", "model_provenance",
           "run_provenance", "publish"]

WEIGHT_METRICS = ("copying",)  # the rows of the weights table, in the order of PartialState.weights
# Their chance (no corpus, so no null head): copying's is 0, the expected score of OV weights drawn with either
# sign equally likely (negating W_V negates every eigenvalue). The weights table's description says so.
WEIGHT_CHANCE = {"copying": 0.0}


def finish(state: PartialState, config: SweepConfig) -> dict[str, pd.DataFrame]:
    """The tables of a finished state: each score column's rows go to its metric's table."""
    model = ModelProvenance.from_json(state.model)
    config = swept_config(state, config)
    columns = columns_of(config, has_words(state.fingerprint["corpus"]["kind"]))
    bounds = np.array([metric.bounds() for metric, _, _ in columns]).reshape(-1, 2).T  # (2, column)
    sparse = np.array([metric.sparse for metric, _, _ in columns], dtype=bool)
    values = state.values(config.interval, bounds=(bounds[0], bounds[1]), sparse=sparse)  # (layer, head, column)
    n_layers, n_heads, _ = state.sums.shape
    layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")  # (layer, head)
    group = n_heads // (model.n_kv_heads or n_heads)
    per_head = head_columns(model.name, model.family, layer.ravel(), head.ravel(), head.ravel() // group)
    by_table: dict[str, list[int]] = {}
    for index, (_, _, table_name) in enumerate(columns):
        by_table.setdefault(table_name, []).append(index)
    n_rows = n_layers * n_heads
    # Rows of a table: by metric (registry order), then layer, head and the metric's axis; importance's by method
    # and target first. A model fills one importance target: the others' columns are all empty and go.
    frames = {}
    for name, indices in by_table.items():
        # one frame per table, its columns' rows one after another (column, then layer and head), then sorted
        keys: dict[str, list] = {}
        for index in indices:
            metric, key, _ = columns[index]
            own = dict(zip(metric.axis.columns, key)) if metric.axis else {}
            if "metric" in TABLES[name].keys:
                own["metric"] = metric.name
            for column, value in own.items():
                keys.setdefault(column, []).append(value)
        repeated = {column: np.repeat(np.asarray(given, dtype=object), n_rows) for column, given in keys.items()}
        tiled = {column: given if given is None or isinstance(given, str) else np.tile(np.asarray(given), len(indices))
                 for column, given in per_head.items()}
        frame = pd.DataFrame(tiled | repeated | {column: np.moveaxis(array[..., indices], -1, 0).ravel()
                                                   for column, array in values.items()})
        keys = list(TABLES[name].keys)
        if name == "importance":
            frame = frame[frame["target"] == state.importance.get("target")]
            order = ["method", "target", "layer", "head"]
        else:
            order = ["metric"] * ("metric" in keys) + ["layer", "head"] + [k for k in keys if k != "metric"]
        frame = frame.sort_values(order, key=_registry_order, kind="stable")
        if name == "syntax":  # the baseline among the offsets the model's queries can see
            frame = syntax.attach_baseline(frame, state.baseline[0], state.baseline[1], causal=model.family == "causal")
        frames[name] = TABLES[name].conform(frame)
    if state.weights.size:
        frames["weights"] = weights_frame(per_head, state.weights, state.embedding)
    if state.similarity.size:
        frames["similarity"] = similarity_frame(per_head, state.similarity, len(state.model["similarity"]["segments"]))
    return frames


def similarity_frame(per_head: dict, similarity: np.ndarray, n_sampled: int) -> pd.DataFrame:
    """The similarity table of one model from its sums (2, layer * head, layer * head): every ordered pair of heads,
    the diagonal included, head i's columns first, head j's as ``other_*``; value = summed divergence / queries."""
    size = similarity.shape[-1]
    i, j = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")  # (head i, head j), flat over layer * head
    i, j = i.ravel(), j.ravel()
    head = {name: column if column is None or isinstance(column, str) else np.asarray(column)[i]
            for name, column in per_head.items()}
    sums, counts = similarity[0].ravel(), similarity[1].ravel()
    nan = float("nan")
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.where(counts > 0, sums / counts, nan)
    frame = pd.DataFrame(head | {
        "other_layer": np.asarray(per_head["layer"])[j], "other_head": np.asarray(per_head["head"])[j],
        "other_label": np.asarray(per_head["label"])[j], "value": value, "sum": sums, "count": counts,
        "ci_low": nan, "ci_high": nan, "units": float(n_sampled), "top_unit_share": nan, "n_eff": nan,
        "variance_df": nan, "thin": pd.NA, "chance": nan})
    return TABLES["similarity"].conform(frame)


def across_frame(states: Sequence[PartialState]) -> pd.DataFrame | None:
    """similarity_across: every head of each model against every head of each later model of the sweep, over the
    word queries of the similarity sample both kept (`headscan.scan.similarity.across_sums`); None where fewer
    than two models kept word-level attention of the same texts (a shuffled-words control reads other texts)."""
    kept = [state for state in states if state.word_attention
            and state.fingerprint["model"].get("control") != "shuffled-words"]
    frames = []
    for n, first in enumerate(kept):
        for second in kept[n + 1:]:
            a, b = ModelProvenance.from_json(first.model), ModelProvenance.from_json(second.model)
            sums, queries, segments = across_sums(first.word_attention, second.word_attention,
                                                  causal="causal" in (a.family, b.family))
            frames.append(_across_rows(first, a, second, b, sums, queries, segments))
    if not frames:
        return None
    return TABLES["similarity_across"].conform(pd.concat(frames, ignore_index=True))


def _across_rows(first: PartialState, a: ModelProvenance, second: PartialState, b: ModelProvenance, sums: np.ndarray,
                 queries: int, segments: int) -> pd.DataFrame:
    (la, ha, _), (lb, hb, _) = first.sums.shape, second.sums.shape
    i, j = np.meshgrid(np.arange(la * ha), np.arange(lb * hb), indexing="ij")
    i, j = i.ravel(), j.ravel()
    group = ha // (a.n_kv_heads or ha)
    nan = float("nan")
    head = head_columns(a.name, a.family, i // ha, i % ha, (i % ha) // group)
    return pd.DataFrame(head | {
        "other_model": b.name, "other_layer": j // hb, "other_head": j % hb,
        "other_label": [f"L{l}H{h}" for l, h in zip(j // hb, j % hb)],
        "value": sums.ravel() / queries if queries else nan, "sum": sums.ravel(), "count": float(queries),
        "ci_low": nan, "ci_high": nan, "units": float(segments), "top_unit_share": nan, "n_eff": nan,
        "variance_df": nan, "thin": pd.NA, "chance": nan})


def weights_frame(per_head: dict, scores: np.ndarray, embedding: str | None) -> pd.DataFrame:
    """The weights table of one model: `scores` (weight metric, layer, head) in the order of `WEIGHT_METRICS`,
    with nothing summed (sum, count and the interval NaN) and how the embedding was taken ("tied" or "untied")."""
    nan = float("nan")
    parts = [pd.DataFrame(per_head | {"metric": name, "value": scores[i].ravel(), "sum": nan, "count": nan,
                                      "ci_low": nan, "ci_high": nan, "units": nan, "top_unit_share": nan,
                                      "chance": WEIGHT_CHANCE.get(name, nan), "embedding": embedding})
             for i, name in enumerate(WEIGHT_METRICS)]
    return TABLES["weights"].conform(pd.concat(parts, ignore_index=True))


def _registry_order(column: pd.Series) -> pd.Series:
    if column.name == "metric":
        order = {name: i for i, name in enumerate(METRICS)}
        return column.map(order)
    if column.name == "method":
        return column.map({name: i for i, name in enumerate(IMPORTANCE_METHODS)})
    return column


def swept_config(state: PartialState, config: SweepConfig) -> SweepConfig:
    """The sweep's `config` as `state`'s model was swept with it: max_len as its fingerprint holds it (clamped to
    the model's context; `headscan.scan.plan.for_model`)."""
    max_len = state.fingerprint.get("settings", {}).get("max_len", config.max_len)
    return dataclasses.replace(config, max_len=max_len)


def model_provenance(state: PartialState, config: SweepConfig) -> ModelProvenance:
    return ModelProvenance.from_json(state.model | {
        "n_segments": state.n_segments,
        "n_tokens": state.n_tokens,
        "n_truncated": state.n_truncated,
        "n_tokens_lost": state.n_tokens_lost,
        "max_len": swept_config(state, config).max_len,
        "seconds": round(state.seconds, 3),
        **state.tallies,
    })


def _git_revision() -> str | None:
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        result = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None


@functools.cache  # installed versions do not change while a process runs; looking them up takes ~10 ms
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


def run_provenance(corpus: Corpus, config: SweepConfig, models: Sequence[ModelProvenance] = (), *,
                   command: str | None = None, started: datetime | None = None, shard: Shard | None = None,
                   unit_why: str | None = None) -> RunProvenance:
    """A run's provenance: how it was called, on what corpus, with which settings and versions (and `models`);
    `unit_why` says why the bootstrap resampled the unit it did (`headscan.scan.plan.resolve_unit`)."""
    if unit_why is None:
        config, unit_why = resolve_unit(corpus, config)
    return RunProvenance(
        headscan_version=__version__,
        git_revision=_git_revision(),
        command=command,
        started=started.isoformat(timespec="seconds") if started else None,
        finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        corpus=CorpusProvenance.from_json(corpus.provenance()),
        config=config.to_json() | {"device": resolve_device(config.device)},
        versions=dict(_versions()),  # a copy: the cached dict stays as it was
        models=tuple(models),
        extra={"bootstrap_unit": unit_why} | ({} if shard is None else {"shard": str(shard)}),
    )


def publish(states: Sequence[PartialState], config: SweepConfig, provenance: RunProvenance,
            out: str | Path | None = None, *, overwrite: bool = False,
            extra: dict[str, Callable[[Path], None]] | None = None, partial: Path | None = None) -> SweepTables:
    """The tables of finished `states` (one per model), side by side, with `provenance` and each model's own;
    written as one set into `out` when given (`headscan.tables.write`, with the `extra` files it names), after
    which the partial states in `partial` are removed."""
    parts = [SweepTables(finish(state, config)) for state in states]
    described = tuple(model_provenance(state, config) for state in states)
    tables = concat(parts, dataclasses.replace(provenance, models=described))
    across = across_frame(states)
    if across is not None:
        tables.frames["similarity_across"] = across
    if out is not None:
        tables.path = write(tables, out, overwrite=overwrite, extra=extra)
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
    return tables
