"""Finishing a sweep: partial states into tables, with their provenance, published as one set.

`finish` turns one model's finished `PartialState` into its tables (each score column's rows into its
metric's table, then each pass's tables: `headscan.scan.passes`); `publish` is the one step that
the local sweep, `merge` and the Ray sweep share: finish every model, fill the run's provenance, put the
models side by side and write them into the output folder, removing the partial states.

This module runs no model.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from .. import __version__
from ..config import IMPORTANCE_METHODS, SweepConfig
from ..corpus import Corpus
from ..errors import TablesError
from ..metrics import METRICS
from ..metrics.custom import custom_provenance
from ..metrics.nulls import add_findings
from ..models import resolve_device
from ..tables import (
    TABLES,
    CorpusProvenance,
    ModelProvenance,
    RunProvenance,
    SweepTables,
    head_columns,
    side_by_side,
    write,
)
from .environment import git_revision, versions
from .passes import PASSES
from .passes.weights import WEIGHT_CHANCE, WEIGHT_METRICS, weights_frame
from .plan import column_names, columns_of, has_words
from .state import PartialState, Shard, columns_text

__all__ = ["WEIGHT_METRICS", "WEIGHT_CHANCE", "finish", "weights_frame", "swept_config", "model_provenance",
           "run_provenance", "config_json", "publish"]

def finish(state: PartialState, config: SweepConfig) -> dict[str, pd.DataFrame]:
    """The tables of a finished state: each score column's rows go to its metric's table."""
    model = ModelProvenance.from_json(state.model)
    config = swept_config(state, config)
    columns = columns_of(config, has_words(state.fingerprint["corpus"]["kind"]), causal=model.family == "causal")
    saved = state.fingerprint.get("columns")
    if saved is not None and saved != column_names(columns):  # never read one column's sums as another's
        raise TablesError(f"{model.name}: its partial state's score columns are not those this headscan finishes "
                          f"for it ({columns_text(saved, column_names(columns))}): it was swept by another version "
                          f"(one that still scored a bidirectional model's syntax _visible rows, say); sweep it again")
    bounds = np.array([metric.bounds() for metric, _, _ in columns]).reshape(-1, 2).T  # (2, column)
    sparse = np.array([metric.sparse for metric, _, _ in columns], dtype=bool)
    values = state.values(config.interval, bounds=(bounds[0], bounds[1]), sparse=sparse)  # (layer, head, column)
    # and under the most a metric can be when no query sees more than max_len keys (entropy: ln max_len nats):
    # after `thin` has read the intervals against the metric's own bounds, so that its calibration stands
    ceiling = np.array([metric.bounds(keys=config.max_len)[1] for metric, _, _ in columns])  # (column,)
    values |= {end: np.minimum(values[end], ceiling) for end in ("ci_low", "ci_high", "joint_low", "joint_high")}
    n_layers, n_heads, _ = state.sums.shape  # the swept layers (all, unless the sweep had `layers`)
    layer, head = np.meshgrid(np.asarray(state.layers), np.arange(n_heads), indexing="ij")  # (layer, head)
    group = n_heads // (model.n_kv_heads or n_heads)
    per_head = head_columns(model.name, model.family, layer.ravel(), head.ravel(), head.ravel() // group)
    by_table: dict[str, list[int]] = {}
    for index, (_, _, table_name) in enumerate(columns):
        by_table.setdefault(table_name, []).append(index)
    n_rows = n_layers * n_heads
    # Rows of a table: by metric (registry order), then layer, head and the metric's axis.
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
        order = ["metric"] * ("metric" in keys) + ["layer", "head"] + [k for k in keys if k != "metric"]
        frame = frame.sort_values(order, key=_registry_order, kind="stable")
        for pass_name, own in state.passes.items():  # a pass completes or filters a score table (the baseline)
            frame = PASSES[pass_name].shape_frame(own, name, frame, model.family)
        frames[name] = TABLES[name].conform(frame)
    for pass_name, own in state.passes.items():  # and writes tables of its own
        frames |= PASSES[pass_name].frames(own, per_head)
    return frames


def _registry_order(column: pd.Series) -> pd.Series:
    if column.name == "metric":
        order = {name: i for i, name in enumerate(METRICS)}
        return column.map(order)
    if column.name == "method":
        return column.map({name: i for i, name in enumerate(IMPORTANCE_METHODS)})
    return column


def swept_config(state: PartialState, config: SweepConfig) -> SweepConfig:
    """The sweep's `config` as `state`'s model was swept with it (`headscan.scan.plan.for_model`): importance only
    where `importance_models` names it, and max_len as its fingerprint holds it (clamped to the model's context)."""
    max_len = state.fingerprint.get("settings", {}).get("max_len", config.max_len)
    return dataclasses.replace(config.for_swept(state.fingerprint.get("model", {}).get("name", "")), max_len=max_len)


def model_provenance(state: PartialState, config: SweepConfig) -> ModelProvenance:
    notes = {key: value for name, own in state.passes.items() for key, value in PASSES[name].notes(own).items()}
    return ModelProvenance.from_json(state.model | notes | {
        "n_segments": state.n_segments,
        "n_tokens": state.n_tokens,
        "n_truncated": state.n_truncated,
        "n_tokens_lost": state.n_tokens_lost,
        "max_len": swept_config(state, config).max_len,
        "seconds": round(state.seconds, 3),
        **state.tallies,
    })


def run_provenance(corpus: Corpus | CorpusProvenance, config, models: Sequence[ModelProvenance] = (), *,
                   command: str | None = None, started: datetime | None = None, shard: Shard | None = None,
                   unit_why: str) -> RunProvenance:
    """A run's provenance: how it was called, on what corpus (or input), with which settings (`config`, any
    run's config: a sweep's, retrieval's, a job's) and versions (and `models`); `unit_why` says why the bootstrap
    resampled the unit it did (`headscan.scan.plan.resolve_unit`). Every run's provenance is built here."""
    device = {"device": resolve_device(config.device)} if hasattr(config, "device") else {}
    return RunProvenance(
        headscan_version=__version__,
        git_revision=git_revision(),
        command=command,
        started=started.isoformat(timespec="seconds") if started else None,
        finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        corpus=corpus if isinstance(corpus, CorpusProvenance) else CorpusProvenance.from_json(corpus.provenance()),
        config=config_json(config) | device,
        versions=dict(versions()),  # a copy: the cached dict stays as it was
        models=tuple(models),
        extra={"bootstrap_unit": unit_why} | ({} if shard is None else {"shard": str(shard)})
        | ({"custom_metrics": custom} if (custom := custom_provenance()) else {}),
    )


def config_json(config) -> dict:
    """A run's settings as run.json keeps them: the config's own ``to_json``, else its fields (tuples as lists)."""
    if hasattr(config, "to_json"):
        return config.to_json()
    return {name: list(value) if isinstance(value, tuple) else value
            for name, value in dataclasses.asdict(config).items()}


def publish(states: Sequence[PartialState], config: SweepConfig, provenance: RunProvenance,
            out: str | Path | None = None, *, overwrite: bool = False,
            extra: dict[str, Callable[[Path], None]] | None = None, partial: Path | None = None) -> SweepTables:
    """The tables of finished `states` (one per model), side by side, with `provenance` and each model's own;
    written as one set into `out` when given (`headscan.tables.write`, with the `extra` files it names), after
    which the partial states in `partial` are removed."""
    parts = [SweepTables(finish(state, config)) for state in states]
    described = tuple(model_provenance(state, config) for state in states)
    tables = side_by_side(parts, dataclasses.replace(provenance, models=described))
    for name in dict.fromkeys(name for state in states for name in state.passes):  # tables over every model
        tables.frames.update(PASSES[name].across(list(states)))
    # each row's verdict against its null, over every model's family: only now are the controls all in
    frames, summary = add_findings(tables.frames, q=config.fdr)
    tables.frames.update(frames)
    tables.provenance = dataclasses.replace(tables.provenance,
                                            extra={**tables.provenance.extra, "findings": summary})
    if out is not None:
        tables.path = write(tables, out, overwrite=overwrite, extra=extra)
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
    return tables
