"""Reading, writing and combining a sweep's tables: one folder of parquet files and ``run.json``, published whole.

A sweep output folder (``OUT``) holds one parquet file per registered table plus ``run.json``:

- ``heads.parquet``: one row per (model, layer, head, metric);
- ``offsets.parquet``: one row per (model, layer, head, offset);
- ``run.json``: the run's provenance (also stored in each parquet file's metadata under ``headscan``).

The tables and their columns are declared in `headscan.tables.schema`. Sums and counts are kept so that sweeps
over disjoint parts of a corpus combine exactly (see `combine`).

This module does not compute scores (see `headscan.metrics` and `headscan.scan`), and imports no torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import TablesError
from . import folders
from .provenance import RunProvenance
from .schema import HEAD_COLUMNS, TABLES

__all__ = ["RUN_TABLES", "SweepTables", "load", "write", "check_out", "merge_tables", "side_by_side", "thin_rows"]

PROVENANCE_KEY = b"headscan"
# A run holds one of these: a sweep's, headscan retrieval's or patch's; a registered job adds its first table
# (`headscan.scan.jobs.register_job`).
RUN_TABLES = ["heads", "retrieval", "patching"]


@dataclass
class SweepTables:
    """The tables of one sweep, as pandas DataFrames keyed by table name, with their provenance.

    ``tables["heads"]`` and ``tables.heads`` are the same DataFrame.
    """

    frames: dict[str, pd.DataFrame]
    provenance: RunProvenance = field(default_factory=RunProvenance)
    path: Path | None = None

    def __getitem__(self, name: str) -> pd.DataFrame:
        if name not in self.frames:
            raise TablesError(f"no table {name!r} in this run; it has {', '.join(self.frames)}")
        return self.frames[name]

    @property
    def heads(self) -> pd.DataFrame:
        return self["heads"]

    @property
    def offsets(self) -> pd.DataFrame:
        return self["offsets"]

    @property
    def models(self) -> list[str]:
        """The models of the run, in order: those of heads.parquet, or of its first table (a retrieval run)."""
        frame = self.frames["heads"] if "heads" in self.frames else next(iter(self.frames.values()))
        return list(dict.fromkeys(frame["model"]))

    def wide(self, values: str = "value") -> pd.DataFrame:
        """heads as one row per (model, layer, head) and one column per metric (the `values` column).

        >>> heads = pd.DataFrame({"model": "m", "family": "causal", "layer": 0, "head": [0, 1, 0, 1],
        ...     "label": ["L0H0", "L0H1"] * 2, "kv_group": [0, 1] * 2, "metric": ["self"] * 2 + ["entropy"] * 2,
        ...     "value": [0.5, 0.25, 1.0, 2.0]})
        >>> SweepTables({"heads": heads}).wide()
          model  family  layer  head label  kv_group  self  entropy
        0     m  causal      0     0  L0H0         0  0.50      1.0
        1     m  causal      0     1  L0H1         1  0.25      2.0
        """
        heads = self.heads
        index = list(HEAD_COLUMNS)
        metrics = list(dict.fromkeys(heads["metric"]))
        # set_index + unstack keeps only the (model, layer, head) rows that exist, unlike a pivot_table
        # with dropna=False, which builds the product of every index level.
        frame = heads.set_index([*index, "metric"])[values].unstack("metric")
        frame = frame[metrics].reset_index()
        frame.columns.name = None
        models = {name: i for i, name in enumerate(dict.fromkeys(heads["model"]))}
        return frame.sort_values(["model", "layer", "head"], key=lambda c: c.map(models) if c.name == "model" else c,
                                 kind="stable").reset_index(drop=True)


# --- writing ----------------------------------------------------------------------------------------------


def _write_parquet(frame: pd.DataFrame, path: Path, provenance: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(frame, preserve_index=False)
    metadata = dict(table.schema.metadata or {})
    metadata[PROVENANCE_KEY] = json.dumps(provenance, default=str).encode()
    pq.write_table(table.replace_schema_metadata(metadata), path)


def run_entries() -> set[str]:
    """All that `write` puts in a run's folder: its tables' files, run.json, and a shard's partial states."""
    return {table.file for table in TABLES.values()} | {"run.json", "state"}


def check_out(out: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Check, before any work, that `out` can receive a run: it is new (or empty), or `overwrite` is set and it
    holds a run (its run.json) other than the folder one is in; and a real write there succeeds. Returns the
    folder as the system resolves it (`headscan.tables.folders.where`), which `write` then writes."""
    shown, target = str(out), folders.where(out)
    if target.exists() and not target.is_dir():
        raise TablesError(f"{shown}: exists and is not a folder; choose another --out")
    # what --overwrite would still refuse is said first, so that the advice to pass it is never refused in turn
    full = target.is_dir() and any(target.iterdir())
    if full:
        if not (target / "run.json").is_file():  # --overwrite replaces a run, never a folder of someone's own files
            raise TablesError(f"{shown}: holds files but no run.json, so it is not a headscan run, and --overwrite "
                              f"replaces only a run; choose another --out, or empty the folder")
        folders.check_not_here(target, shown)
        folders.check_only_ours(target, shown, run_entries(), "a headscan run")
    folders.check_writable(target, shown)
    if full and not overwrite:
        raise TablesError(f"{shown}: already holds a headscan run; pass --overwrite to replace it, or choose another "
                          f"--out")
    return target


def write(tables: SweepTables, out: str | os.PathLike, *, overwrite: bool = False,
          extra: dict[str, Callable[[Path], None]] | None = None) -> Path:
    """Publish `tables` as the folder `out`: one set of files that appears whole, replacing an old set only with
    `overwrite` (`headscan.tables.folders.publish`: an empty folder already there is filled, run.json last), so
    no reader ever sees files from two runs or half a file. `extra` maps a relative path to a function that
    writes that file (the partial states of a sharded run). Returns the folder's absolute path.
    """
    target = check_out(out, overwrite=overwrite)
    frames = {name: TABLES[name].conform(frame) for name, frame in tables.frames.items()}  # check all first
    tables.provenance = dataclasses.replace(tables.provenance, run_id=uuid.uuid4().hex)
    provenance = tables.provenance.to_json()

    def fill(folder: Path) -> None:
        for name, frame in frames.items():
            _write_parquet(frame, folder / TABLES[name].file, provenance)
        (folder / "run.json").write_text(json.dumps(provenance, indent=2, default=str) + "\n")
        for relative, writer in (extra or {}).items():
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            writer(folder / relative)

    return folders.publish(target, fill, last="run.json")


# --- reading ----------------------------------------------------------------------------------------------


def load(out: str | os.PathLike) -> SweepTables:
    """Read a sweep output folder back as DataFrames plus its provenance.

    ``pd.read_parquet(out / "heads.parquet")`` works just as well; this adds the checks, the dtypes and
    the provenance. Every registered table found in the folder is read; heads.parquet (a sweep),
    retrieval.parquet (``headscan retrieval``) or patching.parquet (``headscan patch``) must be there, and every file must come from the same run
    (their provenance carries the run's id).
    """
    out = Path(out)
    if not out.is_dir():
        raise TablesError(f"{out}: no such folder; pass the --out folder of a `headscan sweep` run")
    main = next((name for name in RUN_TABLES if name in TABLES and (out / TABLES[name].file).is_file()), None)
    if main is None:
        raise TablesError(f"{out}: has no heads.parquet, retrieval.parquet or patching.parquet; is it the --out "
                          f"folder of a `headscan sweep`, `headscan retrieval` or `headscan patch` run?")
    frames, stamps = {}, {}
    for name, table in TABLES.items():
        path = out / table.file
        if path.is_file():
            frame, stamps[path.name] = _read_parquet(path)
            try:
                frames[name] = table.conform(frame)
            except (TablesError, ValueError, TypeError, OverflowError) as error:
                raise TablesError(f"{path}: not a headscan {name} table ({error})") from None
            problem = _unsound(frames[name], table)
            if problem is not None:
                raise TablesError(f"{path}: not a headscan {name} table ({problem}); the file is damaged, sweep again")
    run_json = out / "run.json"
    if run_json.is_file():
        try:
            provenance = json.loads(run_json.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            raise TablesError(f"{run_json}: broken JSON ({error}); the tables' own copy of it is in their parquet "
                              f"metadata, or sweep again") from None
        if not isinstance(provenance, dict):
            raise TablesError(f"{run_json}: expected a JSON object; sweep again")
    else:
        provenance = stamps[TABLES[main].file] or {}
    for file, stamp in stamps.items():
        if stamp is not None and stamp.get("run_id") != provenance.get("run_id"):
            raise TablesError(f"{out}: {file} and run.json come from different runs; sweep again into a new folder")
    try:
        typed = RunProvenance.from_json(provenance)
    except (TypeError, AttributeError, ValueError) as error:
        raise TablesError(f"{run_json}: not a headscan run description ({type(error).__name__}: {error}); "
                          f"sweep again") from None
    return SweepTables(frames, typed, out)


def _unsound(frame: pd.DataFrame, table) -> str | None:
    """Why rows that read with the right columns and dtypes cannot be a sweep's (a damaged file that still
    parses): a row key given twice, a negative layer or head, a label that is not its head's."""
    repeated = int(frame.duplicated(table.row_key).sum())
    if repeated:
        return f"{repeated} rows repeat another row's {', '.join(table.row_key)}"
    if not table.per_head:
        return None
    if bool((frame["layer"] < 0).any() or (frame["head"] < 0).any()):
        return "a negative layer or head"
    labels = "L" + frame["layer"].astype(str) + "H" + frame["head"].astype(str)
    if not bool((labels == frame["label"]).fillna(False).all()):
        return "a label that is not L{layer}H{head} of its row"
    return None


def _read_parquet(path: Path) -> tuple[pd.DataFrame, dict | None]:
    """A parquet file and the provenance in its metadata; a damaged file is one clear error."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
        stamp = (table.schema.metadata or {}).get(PROVENANCE_KEY)
        frame, stamp = table.to_pandas(), json.loads(stamp) if stamp else None
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as error:  # KeyError: damaged pandas metadata
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise TablesError(f"{path}: not a readable parquet file ({first}); sweep again") from None
    if stamp is not None and not isinstance(stamp, dict):
        raise TablesError(f"{path}: its headscan metadata is not a JSON object; sweep again")
    return frame, stamp


# --- combining --------------------------------------------------------------------------------------------


def side_by_side(parts: list[SweepTables], provenance: RunProvenance | None = None) -> SweepTables:
    """Put sweeps of different models side by side (one run of several models); no rows may repeat."""
    if not parts:
        raise TablesError("side_by_side needs at least one sweep")
    names = [name for part in parts for name in part.models]
    if len(set(names)) != len(names):
        raise TablesError(f"a model appears in more than one of the sweeps to put side by side: {names}")
    frames = {
        name: pd.concat([part.frames[name] for part in parts if name in part.frames], ignore_index=True)
        for name in dict.fromkeys(name for part in parts for name in part.frames)
    }
    return SweepTables(frames, provenance or parts[0].provenance)


def merge_tables(parts: list[SweepTables]) -> SweepTables:
    """Combine sweeps of the same models over disjoint parts of a corpus: sums and counts add exactly.

    Refuses a run given twice, parts swept with different settings or models, and parts of the same corpus
    file that are not distinct shards (they would count the same segments twice). Bootstrap intervals cannot
    be combined from tables alone, so they come back as NaN; `headscan merge` combines shards with intervals.
    """
    if not parts:
        raise TablesError("merge_tables needs at least one sweep")
    _check_disjoint(parts)
    frames = {}
    for name in dict.fromkeys(name for part in parts for name in part.frames):
        table = TABLES[name]
        if name == "weights":  # read off the weights, not summed over text: every part holds the same rows
            frames[name] = table.conform(pd.concat([p.frames[name] for p in parts if name in p.frames])
                                         .drop_duplicates(table.row_key))
            continue
        rows = pd.concat([table.conform(part.frames[name]) for part in parts if name in part.frames])
        if name == "examples":  # not sums: each part's extremes, of which the combined extremes are the extremes
            frames[name] = _combined_examples(rows, table)
            continue
        counted = rows["count"] > 0  # chance is a ratio over the same counts: chance * count adds up
        rows = rows.assign(chance_sum=(rows["chance"] * rows["count"]).where(counted, 0.0),
                           chance_missing=(counted & rows["chance"].isna()).astype(int))
        total = rows.groupby(table.row_key, sort=False, as_index=False)[["sum", "count", "chance_sum",
                                                                          "chance_missing"]].sum()
        total["value"] = (total["sum"] / total["count"]).where(total["count"] > 0)
        total["chance"] = (total["chance_sum"] / total["count"]).where((total["count"] > 0)
                                                                        & (total["chance_missing"] == 0))
        total["ci_low"] = total["ci_high"] = total["units"] = total["top_unit_share"] = float("nan")
        total["n_eff"] = total["variance_df"] = total["thin"] = float("nan")  # support unknown: <NA> thin
        total = total.assign(**{column: float("nan") for column in table.extra})  # not sums: cannot be added up
        frames[name] = table.conform(total)
    return SweepTables(frames, RunProvenance(extra={"combined_from": [p.provenance.to_json() for p in parts]}))


SIGNIFICANT = 5  # digits of a unit's value that rank it among examples: float32 sums of thousands of terms keep ~6


def significant(value: np.ndarray, digits: int = SIGNIFICANT) -> np.ndarray:
    """`value` rounded to `digits` significant digits (0, NaN and inf as they are): how examples.parquet ranks a
    unit's value, a ratio of float32 sums whose last digits depend on how its batch was cut and on thread counts.

    >>> significant(np.array([0.123456789, 98765.4321, 0.0, np.nan]), 5).tolist()[:3]
    [0.12346, 98765.0, 0.0]
    """
    value = np.asarray(value, dtype=np.float64)
    finite = np.isfinite(value) & (value != 0)
    magnitude = np.floor(np.log10(np.abs(np.where(finite, value, 1.0))))
    scale = 10.0 ** (digits - 1 - magnitude)
    return np.where(finite, np.round(value * scale) / scale, value)


def _combined_examples(rows: pd.DataFrame, table) -> pd.DataFrame:
    """The examples of runs over disjoint parts of a corpus: per head, metric and end, the highest (top) or lowest
    (bottom) of the parts' own, as many as a part keeps; each part numbered its units from 0, so ``unit`` is <NA>."""
    k = int(rows["rank"].max()) if len(rows) else 0
    keys = ["model", "layer", "head", "metric", "end"]
    rows = rows.assign(_rank=significant(rows["value"].to_numpy(dtype=float, na_value=np.nan)),
                       _order=rows.groupby(keys, sort=False, observed=True).ngroup())  # keys in first-seen order
    top = rows["end"] == "top"
    # parts in order, each in rank order: a stable sort leaves ties in the order of the parts' units
    ordered = pd.concat([rows[top].sort_values("_rank", ascending=False, kind="stable"),
                         rows[~top].sort_values("_rank", ascending=True, kind="stable")])
    kept = ordered.groupby(keys, sort=False, observed=True).head(k)
    kept = kept.assign(rank=kept.groupby(keys, sort=False, observed=True).cumcount() + 1, unit=pd.NA)
    return table.conform(kept.sort_values(["_order", "rank"], kind="stable"))


def _scoring_settings(run: RunProvenance) -> dict:
    """The settings that change scores: all but where and in what batches a run went, and how much it read."""
    return {k: v for k, v in run.config.items() if k not in ("batch_size", "device", "device_map", "limit",
                                                                "attention", "query_chunk", "attention_budget")}


def _check_disjoint(parts: list[SweepTables]) -> None:
    def describe(i: int) -> str:
        return str(parts[i].path or f"part {i + 1}")

    first = parts[0].provenance
    seen: dict = {}
    for i, part in enumerate(parts):
        run = part.provenance
        if sorted(part.models) != sorted(parts[0].models):
            raise TablesError(f"{describe(i)} has models {part.models}, {describe(0)} has {parts[0].models}; "
                              f"combine sweeps of the same models")
        settings, expected = _scoring_settings(run), _scoring_settings(first)
        if settings != expected:
            differ = sorted(k for k in set(settings) | set(expected) if settings.get(k) != expected.get(k))
            raise TablesError(f"{describe(i)} was swept with other settings than {describe(0)} ({', '.join(differ)})")
        key = (run.run_id,) if run.run_id else None
        if run.corpus.sha256 and run.corpus.kind != "list":
            key = (run.corpus.sha256, run.extra.get("shard"))
        if key is not None and key in seen:
            raise TablesError(f"{describe(i)} and {describe(seen[key])} cover the same segments (the same run, or "
                              f"the same corpus and shard); combining them would count them twice")
        if key is not None:
            seen[key] = i


def thin_rows(rows: pd.DataFrame) -> pd.Series:
    """True for rows whose interval should not be trusted: the ``thin`` column (`headscan.intervals.thin`, from the
    data's own heaviness) where it was recorded; else the previous rule, `headscan.intervals.thin_support`, read
    from ``units`` and ``top_unit_share``; False where neither was recorded.

    >>> rows = pd.DataFrame({"units": [400.0, 9.0, 400.0, float("nan"), 400.0],
    ...                      "top_unit_share": [0.01, 0.1, 0.6, float("nan"), 0.01],
    ...                      "thin": pd.array([False, False, pd.NA, pd.NA, True], dtype="boolean")})
    >>> thin_rows(rows).tolist()
    [False, False, True, False, True]
    """
    from ..intervals import THIN_MAX_SHARE, THIN_MIN_UNITS

    if {"units", "top_unit_share"} <= set(rows.columns):
        previous = ((rows["units"] < THIN_MIN_UNITS) | (rows["top_unit_share"] > THIN_MAX_SHARE)).fillna(False)
    else:  # not recorded (headscan 0.1, or built by hand)
        previous = pd.Series(False, index=rows.index)
    if "thin" not in rows.columns:
        return previous.astype(bool)
    recorded = rows["thin"].astype("boolean")
    return recorded.fillna(previous.astype(bool)).astype(bool)
