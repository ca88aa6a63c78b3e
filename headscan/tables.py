"""The tables headscan writes, their one schema, and how to read them back.

A sweep output folder (``OUT``) holds:

- ``heads.parquet``: one row per (model, layer, head, metric);
- ``offsets.parquet``: one row per (model, layer, head, offset);
- ``run.json``: the run's provenance (also stored in each parquet file's metadata under ``headscan``).

Layers and heads are 0-indexed integers (the TransformerLens convention), and ``label`` spells them
``L{layer}H{head}``: Clark et al.'s (2019) 1-indexed BERT "head 3-1" is ``L2H0`` here.
``value`` is ``sum / count`` and is NaN where ``count`` is 0 (the metric is not defined there), never -1.
Sums and counts are kept so that sweeps over disjoint parts of a corpus combine exactly (see `combine`).

This module does not compute scores (see `headscan.metrics` and `headscan.sweep`).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import TablesError

__all__ = ["HEADS_COLUMNS", "OFFSETS_COLUMNS", "SweepTables", "load", "write", "head_label", "combine", "top_heads"]

# One schema for each table: column name -> pandas dtype. Writers and readers both go through these.
HEADS_COLUMNS: dict[str, str] = {
    "model": "string",  # the model's name as given to the sweep (alias, Hugging Face id or folder name)
    "family": "string",  # "causal" or "bidirectional"
    "layer": "int64",  # 0-indexed
    "head": "int64",  # 0-indexed query head
    "label": "string",  # "L{layer}H{head}"
    "kv_group": "int64",  # key/value head this query head reads (grouped-query attention); == head without GQA
    "metric": "string",  # a name in headscan.metrics.METRICS
    "value": "float64",  # sum / count; NaN where count == 0
    "sum": "float64",  # sum of per-query scores over the corpus
    "count": "float64",  # number of queries that count for this metric
    "ci_low": "float64",  # 2.5% point of a Poisson bootstrap over segments; NaN where undefined
    "ci_high": "float64",  # 97.5% point
}

OFFSETS_COLUMNS: dict[str, str] = {
    "model": "string",
    "family": "string",
    "layer": "int64",
    "head": "int64",
    "label": "string",
    "kv_group": "int64",
    "offset": "int64",  # d in A[q, q + d]: -1 is the previous token, +1 the next
    "value": "float64",
    "sum": "float64",
    "count": "float64",
    "ci_low": "float64",
    "ci_high": "float64",
}

PROVENANCE_KEY = b"headscan"


def head_label(layer: int, head: int) -> str:
    """The 0-indexed label of a head.

    >>> head_label(4, 11)
    'L4H11'
    """
    return f"L{layer}H{head}"


def conform(frame: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """Return `frame` with exactly `columns`, in order and with their dtypes."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise TablesError(f"table is missing columns {missing}; expected {list(columns)}")
    return frame[list(columns)].astype(columns).reset_index(drop=True)


@dataclass
class SweepTables:
    """The tables of one sweep output, as pandas DataFrames, with their provenance."""

    heads: pd.DataFrame
    offsets: pd.DataFrame
    provenance: dict = field(default_factory=dict)
    path: Path | None = None

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(self.heads["model"]))

    def wide(self, metric_values: str = "value") -> pd.DataFrame:
        """One row per (model, layer, head), one column per metric."""
        return self.heads.pivot_table(
            index=["model", "family", "layer", "head", "label", "kv_group"],
            columns="metric",
            values=metric_values,
            dropna=False,
        ).reset_index()


@contextlib.contextmanager
def _replacing(path: Path):
    """Yield a temporary name beside `path`, renamed onto it on success: a file appears whole or not at all."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_parquet_atomically(frame: pd.DataFrame, path: Path, provenance: dict) -> None:
    table = pa.Table.from_pandas(frame, preserve_index=False)
    metadata = dict(table.schema.metadata or {})
    metadata[PROVENANCE_KEY] = json.dumps(provenance, default=str).encode()
    with _replacing(path) as tmp:
        pq.write_table(table.replace_schema_metadata(metadata), tmp)


def _write_text_atomically(text: str, path: Path) -> None:
    with _replacing(path) as tmp:
        Path(tmp).write_text(text)


def write(tables: SweepTables, out: str | os.PathLike) -> Path:
    """Write `tables` into the folder `out` (created if needed); each file appears whole or not at all."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    heads = conform(tables.heads, HEADS_COLUMNS)
    offsets = conform(tables.offsets, OFFSETS_COLUMNS)
    _write_parquet_atomically(heads, out / "heads.parquet", tables.provenance)
    _write_parquet_atomically(offsets, out / "offsets.parquet", tables.provenance)
    _write_text_atomically(json.dumps(tables.provenance, indent=2, default=str) + "\n", out / "run.json")
    return out


def load(out: str | os.PathLike) -> SweepTables:
    """Read a sweep output folder back as DataFrames plus its provenance.

    ``pd.read_parquet(out / "heads.parquet")`` works just as well; this adds the checks, the dtypes and
    the provenance.
    """
    out = Path(out)
    if not out.is_dir():
        raise TablesError(f"{out}: no such folder; pass the --out folder of a `headscan sweep` run")
    frames = {}
    for name, columns in (("heads", HEADS_COLUMNS), ("offsets", OFFSETS_COLUMNS)):
        path = out / f"{name}.parquet"
        if not path.is_file():
            raise TablesError(f"{out}: has no {name}.parquet; is it the --out folder of a `headscan sweep` run?")
        try:
            frames[name] = conform(pd.read_parquet(path), columns)
        except TablesError as error:
            raise TablesError(f"{path}: {error}") from None
    provenance = {}
    run_json = out / "run.json"
    if run_json.is_file():
        provenance = json.loads(run_json.read_text())
    else:
        metadata = pq.read_schema(out / "heads.parquet").metadata or {}
        if PROVENANCE_KEY in metadata:
            provenance = json.loads(metadata[PROVENANCE_KEY])
    return SweepTables(frames["heads"], frames["offsets"], provenance, out)


def combine(parts: list[SweepTables]) -> SweepTables:
    """Combine sweeps of the same models over disjoint parts of a corpus: sums and counts add exactly.

    Bootstrap intervals cannot be combined from the tables alone, so they come back as NaN.
    """
    if not parts:
        raise TablesError("combine needs at least one sweep")

    def add(frames: list[pd.DataFrame], keys: list[str], columns: dict[str, str]) -> pd.DataFrame:
        total = pd.concat(frames).groupby(keys, sort=False, as_index=False)[["sum", "count"]].sum()
        total["value"] = (total["sum"] / total["count"]).where(total["count"] > 0)
        total["ci_low"] = float("nan")
        total["ci_high"] = float("nan")
        return conform(total, columns)

    keys = ["model", "family", "layer", "head", "label", "kv_group"]
    heads = add([p.heads for p in parts], keys + ["metric"], HEADS_COLUMNS)
    offsets = add([p.offsets for p in parts], keys + ["offset"], OFFSETS_COLUMNS)
    return SweepTables(heads, offsets, {"combined_from": [p.provenance for p in parts]})


def top_heads(heads: pd.DataFrame, metric: str, n: int = 10) -> pd.DataFrame:
    """The `n` highest-scoring heads of each model on `metric`, with their 95% intervals.

    NaN scores (undefined) rank last and are left out.
    """
    from .metrics import get_metric

    if get_metric(metric).table != "heads":  # an unknown name gets "did you mean"
        raise TablesError(f"{metric!r} is a profile in offsets.parquet, not a head score; pick a metric of heads.parquet")
    if n < 1:
        raise TablesError(f"--top must be at least 1, got {n}")
    rows = heads[(heads["metric"] == metric) & heads["value"].notna()]
    rows = rows.sort_values(["model", "value", "layer", "head"], ascending=[True, False, True, True], kind="stable")
    columns = ["model", "label", "layer", "head", "value", "ci_low", "ci_high", "count"]
    return rows.groupby("model", sort=False).head(n)[columns].reset_index(drop=True)
