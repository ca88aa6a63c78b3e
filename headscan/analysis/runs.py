"""Runs side by side: several sweeps' tables as one, every model named apart, and what their provenance says.

`compare_runs` puts one or more runs together, table by table through the registry (`headscan.tables.TABLES`),
renaming a model ``run:model`` when more than one run has it. `model_shapes`, `run_summary` and
`model_sources` read the runs' typed provenance (`headscan.tables.provenance`) into display tables.

This module draws nothing, chooses no findings and loads no model.

>>> run_names(["a/out", "b/out", "c/gpt2"])
['out', 'out-2', 'gpt2']
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import split_control
from ..errors import TablesError
from ..metrics import METRICS
from ..setting_values import format_layers
from ..tables import IMPORTED, TABLES, ModelProvenance, RunProvenance, SweepTables
from .claims import has_verdicts
from .formats import code

__all__ = ["ReportModel", "Comparison", "run_names", "compare_runs", "model_shapes", "run_summary", "model_sources",
           "swept_layers"]


@dataclass(frozen=True)
class ReportModel:
    """A model as one report shows it."""

    name: str  # shown in the report: the model's name, or "run:model" when several runs have that name
    run: str  # the run's name (its folder's name)
    model: str  # the name in the run's tables
    family: str  # "causal" or "bidirectional", from the tables
    provenance: ModelProvenance = field(compare=False, hash=False)  # every field None when the run has none


@dataclass
class Comparison:
    """One or more runs' tables side by side, every model renamed apart (see `compare_runs`)."""

    frames: dict[str, pd.DataFrame]  # table name (a key of TABLES) -> the rows of every run
    runs: list[tuple[str, SweepTables]]  # (run name, its tables as loaded)
    models: list[ReportModel]
    # models whose scores were imported from a published file and that no sweep given holds -> their provenance
    published: dict[str, ModelProvenance] = field(default_factory=dict)

    def __getitem__(self, name: str) -> pd.DataFrame:
        """Table `name`'s rows; no rows (with the table's columns) when no run has it."""
        if name in self.frames:
            return self.frames[name]
        return pd.DataFrame({c: pd.Series(dtype=d) for c, d in TABLES[name].columns.items()})

    @property
    def heads(self) -> pd.DataFrame:
        return self["heads"]

    @property
    def tested(self) -> bool:
        """Whether the heads table records the sweep's verdicts against each row's null (`headscan.metrics.nulls`):
        then a claim is a finding, else a row beyond chance."""
        return has_verdicts(self.heads)

    @property
    def offsets(self) -> pd.DataFrame:
        return self["offsets"]

    @property
    def scores(self) -> pd.DataFrame:
        """Every per-head score with an interval: heads.parquet's rows, and retrieval.parquet's where a retrieval
        run joined (what the atlas colours by)."""
        return pd.concat([self.heads, self["retrieval"].drop(columns=list(TABLES["retrieval"].extra))],
                         ignore_index=True) if "retrieval" in self.frames else self.heads

    @property
    def score_metrics(self) -> list[str]:
        """The metrics of `scores`: the heads table's, then the retrieval table's."""
        extra = list(dict.fromkeys(self.frames["retrieval"]["metric"])) if "retrieval" in self.frames else []
        return self.metrics + extra

    @property
    def metrics(self) -> list[str]:
        """The heads table's metrics, in the registry's order where it knows them."""
        present = list(dict.fromkeys(self.heads["metric"]))
        order = {name: i for i, name in enumerate(METRICS)}
        return sorted(present, key=lambda m: (order.get(m, len(order)), present.index(m)))

    def model(self, name: str) -> ReportModel:
        return next(m for m in self.models if m.name == name)

    def controls(self, name: str) -> list[ReportModel]:
        """The control models swept beside model `name` in its run (`ModelProvenance.control_of`), in order."""
        trained = self.model(name)
        return [m for m in self.models if m.run == trained.run and m.provenance.control_of == trained.model
                and m.provenance.control is not None]

    def control_map(self) -> dict[str, list[str]]:
        """Report name of each trained model that has controls -> the report names of its controls."""
        found = {m.name: [c.name for c in self.controls(m.name)] for m in self.models if m.provenance.control is None}
        return {name: controls for name, controls in found.items() if controls}


def run_names(paths: Sequence[str | os.PathLike]) -> list[str]:
    """A short, distinct name for each run: its folder's name, with ``-2``, ``-3`` ... on repeats."""
    names, seen = [], Counter()
    for path in paths:
        base = Path(path).resolve().name if Path(path).name in ("", ".", "..") else Path(path).name
        seen[base] += 1
        names.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return names


def compare_runs(runs: Sequence[SweepTables], names: Sequence[str] | None = None) -> Comparison:
    """Put several runs' tables into one, renaming a model ``run:model`` when more than one run has it.

    Parameters
    ----------
    runs : sequence of SweepTables
        The runs, as `headscan.tables.load` returns them.
    names : sequence of str, optional
        One name per run; `run_names` of their paths (``run1``, ``run2`` ... for runs not read from a
        folder) by default.

    Returns
    -------
    Comparison
        Every table any run has, the ``model`` column (and similarity_across's ``other_model``) renamed, and one
        `ReportModel` per model.
    """
    if names is None:
        names = run_names([run.path or f"run{i + 1}" for i, run in enumerate(runs)])
    swept = [(name, run) for name, run in zip(names, runs) if "heads" in run.frames]
    seen = Counter(model for _, run in swept for model in run.models)
    models, parts, joined, published = [], {}, set(), {}
    for name, run in zip(names, runs):
        if "heads" not in run.frames:  # a retrieval or patching run's tables join the sweep of the same model
            alone = {model: run.provenance.model(model) for model in run.models if _published_alone(run, model, seen)}
            published.update(alone)
            kind = "patching" if "patching" in run.frames else "retrieval"
            rename = {model: model if model in alone else _joined_name(model, name, swept, seen, joined, kind)
                      for model in run.models}
        else:
            rename = {model: f"{name}:{model}" if seen[model] > 1 else model for model in run.models}
            for model, shown in rename.items():
                family = str(run.heads.loc[run.heads["model"] == model, "family"].iloc[0])
                models.append(ReportModel(shown, name, model, family, run.provenance.model(model)))
        controls = {m for m in run.models if split_control(m)[1] is not None}
        for table, frame in run.frames.items():
            if table in ("similarity", "similarity_across") and controls:
                # which heads attend alike is asked of trained models: a control's heads^2 rows (and every pair
                # across models with it) would multiply the report's memory for no question it answers
                keep = ~frame["model"].isin(controls)
                if "other_model" in frame:
                    keep &= ~frame["other_model"].isin(controls)
                frame = frame[keep]
            frame = frame.copy()
            for column in ("model", "other_model"):  # similarity_across names the other model of the run too
                if column in frame:
                    frame[column] = frame[column].map(lambda m, names=rename: names.get(m, m)).astype("string")
            parts.setdefault(table, []).append(frame)
    frames = {table: pd.concat(parts[table], ignore_index=True) for table in TABLES if table in parts}
    return Comparison(frames, list(zip(names, runs)), _controls_beside(models), published)


def _controls_beside(models: list[ReportModel]) -> list[ReportModel]:
    """`models` with each control right after its trained model of the same run (the order figures show them in)."""
    trained = [m for m in models if m.provenance.control_of is None or not any(
        t.run == m.run and t.model == m.provenance.control_of for t in models)]
    out = []
    for m in trained:
        out.append(m)
        out += [c for c in models if c is not m and c.run == m.run and c.provenance.control_of == m.model]
    return out + [m for m in models if m not in out]


def _published_alone(run: SweepTables, model: str, seen: Counter) -> bool:
    """Whether `model`'s scores were imported from a published file (``headscan import-scores``) for a model no
    sweep given holds: they stand beside the others in the retrieval section, with no atlas grid of their own."""
    return run.provenance.model(model).source == IMPORTED and not seen[model]


def _joined_name(model: str, run: str, swept: list, seen: Counter, joined: set, kind: str = "retrieval") -> str:
    """The report name of the swept model that a retrieval (or patching) run's `model` joins; refused when none
    is, or when it is ambiguous, or already joined by another run of the same kind."""
    if seen[model] != 1:
        where = "none of the sweeps given" if not seen[model] else f"{seen[model]} of the sweeps given"
        raise TablesError(f"{run}: holds {kind} tables of {model}, which {where} swept; report it beside exactly "
                          f"one sweep of {model} (headscan report SWEEP_OUT {run})")
    if (model, kind) in joined:
        raise TablesError(f"{run}: a second {kind} run of {model}; report one {kind} run per model")
    joined.add((model, kind))
    return model


# --- provenance as display tables -------------------------------------------------------------------------


def _count(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, (int, np.integer)) or (isinstance(value, float) and value.is_integer()):
        return f"{int(value):,}"
    return str(value)


def _text(value) -> str:
    return "–" if value is None else str(value)


def _shown(field_value, fallback):
    return fallback if field_value is None else field_value


def swept_layers(p: ModelProvenance) -> str | None:
    """Which layers a sweep of part of a model's layers (``--layers``) holds, in words; None for every layer.

    >>> swept_layers(ModelProvenance("m", n_layers=12, extra={"layers": [0, 5, 6, 7]}))
    'layers 0,5-7 of 12'
    """
    layers = p.extra.get("layers")
    if not layers:
        return None
    return f"layers {format_layers(layers)} of {_count(p.n_layers)}"


def model_shapes(comparison: Comparison) -> pd.DataFrame:
    """One row per model comparing their shapes, from each run's provenance (the tables where it is silent).

    Returns
    -------
    DataFrame
        Columns ``model, family, layers, heads, kv heads, width, parameters, tokenizer, vocabulary, context``
        as display strings ("–" where unknown), plus ``run`` first when the report has several runs.
    """
    rows = []
    for m in comparison.models:
        p = m.provenance
        part = comparison.heads[comparison.heads["model"] == m.name]
        rows.append({
            "run": m.run,
            "model": m.name,
            "family": _shown(p.family, m.family),
            "layers": _count(_shown(p.n_layers, int(part["layer"].max()) + 1))
            + (f" (swept: {format_layers(p.extra['layers'])})" if p.extra.get("layers") else ""),
            "heads": _count(_shown(p.n_heads, int(part["head"].max()) + 1)),
            "kv heads": _count(_shown(p.n_kv_heads, int(part["kv_group"].max()) + 1)),
            "width": _count(p.d_model),
            "parameters": _count(p.n_params),
            "tokenizer": _text(p.tokenizer),
            "vocabulary": _count(p.vocab_size),
            "context": _count(p.max_context),
        })
    frame = pd.DataFrame(rows)
    return frame.drop(columns="run") if len(comparison.runs) == 1 else frame


def _recorded(p: RunProvenance) -> bool:
    return any((p.command, p.started, p.headscan_version, p.corpus.source, p.models))


def run_summary(run: SweepTables) -> pd.DataFrame | None:
    """Where a run's tables came from, as ``(what, value)`` display rows; None when it recorded nothing.

    Rows: folder, command, started, finished, headscan (version and git revision), corpus, config, versions,
    and the tables the run holds with their row counts.
    """
    p = run.provenance
    if not _recorded(p):
        return None
    corpus = p.corpus
    corpus_text = (f"{_text(corpus.source)} ({corpus.kind or '?'}, {_count(corpus.n_segments)} segments"
                   + (f", sha256 {corpus.sha256[:16]}…" if corpus.sha256 else "") + ")")
    rows = [
        ("folder", code(run.path) if run.path else "–"),
        ("command", code(p.command) if p.command else "–"),
        ("started", _text(p.started)),
        ("finished", _text(p.finished)),
        ("headscan", _text(p.headscan_version) + (f" (git {p.git_revision[:12]})" if p.git_revision else "")),
        ("corpus", corpus_text),
        ("config", ", ".join(f"{k}={v}" for k, v in p.config.items()) or "–"),
        ("versions", ", ".join(f"{k} {v}" for k, v in p.versions.items()) or "–"),
        ("tables", ", ".join(f"{TABLES[name].file} ({len(frame):,} rows)" for name, frame in run.frames.items())),
    ]
    return pd.DataFrame(rows, columns=["", "value"])


def model_sources(run: SweepTables) -> pd.DataFrame:
    """One display row per model of a run: where its weights came from and how much of the corpus it read."""
    rows = []
    for m in run.provenance.models:
        revision = _text(m.revision)
        rows.append({
            "model": m.name,
            "source": _text(m.source),
            "id": code(m.id) if m.id else "–",
            "revision": revision if len(revision) <= 24 else revision[:24] + "…",
            "segments": _count(m.n_segments),
            "tokens": _count(m.n_tokens),
            "seconds": "–" if m.seconds is None else f"{m.seconds:.1f}",
        })
    return pd.DataFrame(rows, columns=["model", "source", "id", "revision", "segments", "tokens", "seconds"])
