"""When a row of a table may carry a claim: one rule for every claim a report makes.

A claim about a row (a findings sentence, an entry of a top-head list, a role badge, a "looks furthest" line, a
syntax finding) needs two things of the row's numbers:

- its interval is not thin (`headscan.tables.thin_rows`: enough units, none holding too much of the sum);
- its interval lies beyond chance on the metric's striking side: ``ci_low > chance`` where high values are
  striking (a share of attention), ``ci_high < chance`` where low ones are (entropy). ``chance`` is the row's
  value under the null head, uniform attention over what each query sees (`headscan.tables` documents it).

`why_not` says, row by row, why a row cannot carry a claim ("" where it can); `supported` is its boolean.
A row of a table that records its verdict (``null_kind``, ``finding``: `headscan.metrics.nulls`, the sweep's
test against what heads that learned nothing score, corrected for the number of rows tested) carries a claim
exactly where ``finding`` is true: the rule above is then the sweep's, with the null in place of chance.

A row without an interval (a sweep without bootstrap, tables added up by `headscan.tables.merge_tables`) or
without a chance level (a table written before headscan recorded it) carries none: nothing says how far from
uniform attention it lies.

This module draws nothing, loads no model and imports no torch; which end of a metric is striking comes from
the caller (`headscan.analysis.ranking.striking_of` reads it from the metric registry).
"""

from __future__ import annotations

import functools
import io
from importlib import resources

import numpy as np
import pandas as pd

from .. import tables
from ..config import split_control
from ..intervals.verdicts import (
    FOUND,
    NO_EMPIRICAL,
    NO_INTERVAL,
    NO_NULL,
    NOT_DISCOVERED,
    THIN,
    TOO_FEW,
    WITHIN_NULL,
)

__all__ = ["THIN", "NO_INTERVAL", "NO_CHANCE", "AT_CHANCE", "WITHIN_NULL", "NOT_DISCOVERED", "NO_NULL", "TOO_FEW",
           "NO_EMPIRICAL", "OLDER_RULE", "no_controls_text", "untrained_beyond_uniform", "findings_note", "why_not",
           "supported", "has_verdicts", "gate_text", "run_gate_text", "recount", "null_text", "control_range",
           "untested_text"]

NO_CHANCE = "no chance level"
AT_CHANCE = "at chance"  # the interval holds the chance level
# a table written before verdicts were recorded in words: beyond its null, yet no finding by the rule of its day
OLDER_RULE = "not a finding by the rule of the headscan that wrote it (sweep again)"
# the interval lies wholly on the other side of chance: "below chance" for a high-striking metric, "above" for low
_WRONG_SIDE = {"high": "below chance", "low": "above chance"}


def _column(rows: pd.DataFrame, name: str) -> pd.Series:
    return rows[name].astype(float) if name in rows.columns else pd.Series(np.nan, index=rows.index)


def why_not(rows: pd.DataFrame, *, striking="high", table: str | None = None) -> pd.Series:
    """Why each row cannot carry a claim, in a few words ("" where it can); several reasons joined by "; ".

    Parameters
    ----------
    rows : DataFrame
        Rows of any table: ``ci_low``, ``ci_high`` and ``chance`` (missing columns count as not recorded),
        ``units`` and ``top_unit_share`` where recorded.
    striking : "high", "low", or a Series of them aligned with `rows`
        Which end of each row's metric is striking.
    table : str, optional
        The table the rows are of. Accepted from callers that name it; it changes nothing: a row's verdict, where
        its table records one, already read its interval calibrated for its family and size
        (`headscan.intervals.calibration`, applied by `headscan.metrics.nulls`).

    >>> rows = pd.DataFrame({"ci_low": [0.5, 0.1, 0.01, 0.5], "ci_high": [0.6, 0.2, 0.05, 0.6],
    ...                      "chance": [0.1, 0.15, 0.1, 0.1], "units": [400.0, 400, 400, 5],
    ...                      "top_unit_share": 0.01})
    >>> why_not(rows).tolist()
    ['', 'at chance', 'below chance', 'thin support']
    >>> why_not(rows.assign(ci_low=[2.0, 1.0, 0.5, 2.0], ci_high=[2.2, 1.2, 0.9, 2.2], chance=1.0),
    ...         striking="low").tolist()
    ['above chance', 'at chance', '', 'thin support; above chance']
    """
    side = striking if isinstance(striking, pd.Series) else pd.Series(striking, index=rows.index)
    low, high, chance = _column(rows, "ci_low"), _column(rows, "ci_high"), _column(rows, "chance")
    thin = tables.thin_rows(rows) if len(rows) else pd.Series(False, index=rows.index)
    verdict = _verdicts(rows, side, thin.to_numpy(dtype=bool), table or ("syntax" if "relation" in rows else "heads"))
    no_interval = low.isna() | high.isna()
    no_chance = chance.isna()
    ranks_high = side == "high"
    beyond = np.where(ranks_high, low > chance, high < chance)
    wrong = np.where(ranks_high, high < chance, low > chance)
    reasons = []
    for i in range(len(rows)):
        said = [THIN] if thin.iloc[i] else []
        if verdict[i] is not None:  # the sweep's own verdict against the row's null
            said += [verdict[i]] if verdict[i] else []
        elif no_interval.iloc[i]:
            said.append(NO_INTERVAL)
        elif no_chance.iloc[i]:
            said.append(NO_CHANCE)
        elif not beyond[i]:
            said.append(_WRONG_SIDE.get(side.iloc[i], "below chance") if wrong[i] else AT_CHANCE)
        reasons.append("; ".join(said))
    return pd.Series(reasons, index=rows.index, dtype=object)


def has_verdicts(rows: pd.DataFrame) -> bool:
    """Whether `rows` record the sweep's verdicts against their null (`headscan.metrics.nulls`): then a claim is
    a finding, else a row beyond chance (a table written before headscan tested rows, or one it does not test)."""
    return "null_kind" in rows.columns and bool(rows["null_kind"].notna().any())


def _verdicts(rows: pd.DataFrame, side: pd.Series, thin: np.ndarray, table: str) -> list:
    """Per row, None where the table records no verdict (old tables, other tables), else the reason the sweep's
    verdict gives ("" for a finding, and for a thin row: its thin support is the reason, said once). A table that
    records ``verdict`` (`headscan.metrics.nulls.VERDICTS`) says it in words; an older one is read from its columns."""
    if "null_kind" not in rows.columns or "finding" not in rows.columns:
        return [None] * len(rows)
    kind = rows["null_kind"].astype(object).where(rows["null_kind"].notna(), None).to_numpy()
    if "verdict" in rows.columns:
        said = rows["verdict"].astype(object).where(rows["verdict"].notna(), None).to_numpy()
        return [None if k is None else "" if v in (FOUND, THIN) or thin[i] else (v or NO_INTERVAL)
                for i, (k, v) in enumerate(zip(kind, said))]
    finding = rows["finding"].astype("boolean").fillna(False).to_numpy(dtype=bool)
    p = _column(rows, "p_value").to_numpy()
    value = _column(rows, "value").to_numpy()
    end = np.where(side.to_numpy() == "high", _column(rows, "null_high"), _column(rows, "null_low"))
    beyond = np.where(side.to_numpy() == "high", value > end, value < end)
    out = []
    for i in range(len(rows)):  # a loop over rows to say why, as `why_not`'s own
        if kind[i] is None:
            out.append(None)
        elif finding[i] or thin[i]:
            out.append("")
        elif kind[i] == "none":
            out.append(NO_NULL)
        elif np.isnan(p[i]):
            out.append(NO_INTERVAL)
        elif not beyond[i]:
            out.append(WITHIN_NULL)
        else:  # beyond its null, but not a finding by the rule of the headscan that wrote it
            out.append(OLDER_RULE)
    return out


def null_text(rows_or_row) -> str:
    """What a row was tested against, as a claim states it: "null: random-init heads at this layer 0.05 to 0.09;
    q 0.001" ("" where the table records no verdict).

    >>> null_text(pd.Series({"null_kind": "controls", "null_low": 0.05, "null_high": 0.088, "q_value": 0.0004}))
    'null: random-init heads of this layer 0.05 to 0.088; q 0.0004'
    >>> null_text(pd.Series({"null_kind": "uniform", "null_low": 0.1, "null_high": 0.1, "q_value": 0.02}))
    'null: uniform attention; q 0.02'
    """
    row = rows_or_row
    kind = row.get("null_kind") if hasattr(row, "get") else None
    if kind is None or pd.isna(kind) or kind == "none":
        return ""
    what = {"uniform": "uniform attention", "baseline": "the best fixed offset on the same words",
            "controls+baseline": "the best fixed offset, and random-init heads of this layer"}.get(
        str(kind), "random-init heads of this layer")
    if str(kind) in ("controls", "controls+baseline"):
        what += f" {row['null_low']:.3g} to {row['null_high']:.3g}"
    q = row.get("q_value")
    return f"null: {what}" + ("" if q is None or pd.isna(q) else f"; q {q:.2g}")


def control_range(rows: pd.DataFrame, frame: pd.DataFrame, keys=("metric",)) -> pd.DataFrame:
    """For each row of a trained model in `rows`, the range of its random-init controls' values in `frame` at the
    same layer and `keys` (``null_low``, ``null_high``, ``controls``: how many control models have one; NaN and 0
    where none does), in `rows`' order: the null `headscan.metrics.nulls` builds, for a table the sweep does not
    test, so that a sentence compares a row with it rather than with uniform attention alone.

    >>> frame = pd.DataFrame({"model": ["m", "m", "m [random init]", "m [random init 2]"], "metric": "x",
    ...                       "layer": [0, 1, 0, 0], "head": [0, 0, 0, 1], "value": [0.9, 0.5, 0.1, 0.3]})
    >>> control_range(frame[frame["model"] == "m"], frame).to_dict("list")
    {'null_low': [0.1, nan], 'null_high': [0.3, nan], 'controls': [2, 0]}
    """
    on = [*keys, "layer"]
    names = frame["model"].astype(str)
    spec = names.map(lambda n: split_control(n)[0])
    untrained = frame[(names.map(lambda n: split_control(n)[1]) == "random-init") & frame["value"].notna()]
    untrained = untrained.assign(spec_=spec[untrained.index])
    sample = untrained.groupby(["spec_", *on], sort=False, dropna=False).agg(
        null_low=("value", "min"), null_high=("value", "max"), controls=("model", "nunique")).reset_index()
    mine = rows[on].assign(spec_=rows["model"].astype(str).map(lambda n: split_control(n)[0]).to_numpy())
    out = mine.merge(sample, on=["spec_", *on], how="left")  # a left merge keeps `rows`' order
    return pd.DataFrame({"null_low": out["null_low"].to_numpy(dtype=float),
                         "null_high": out["null_high"].to_numpy(dtype=float),
                         "controls": out["controls"].fillna(0).astype(int).to_numpy()}, index=rows.index)


def untested_text(metric: str, row=None, *, why: str = "no random-init controls in this run") -> str:
    """What a sentence about a row of a table the sweep does not test says of its null: where `row` carries a
    `control_range` (``controls`` > 0), where it lies against the controls' heads of its layer; else that it
    describes and was not tested, and `why`.

    >>> untested_text("retrieval", why="a retrieval run sweeps no random-init control")
    'describes; not tested: no null for retrieval (a retrieval run sweeps no random-init control)'
    >>> untested_text("reach", pd.Series({"ci_low": 0.5, "ci_high": 0.6, "null_low": 0.1, "null_high": 0.3,
    ...                                   "controls": 5}))
    "beyond its 5 random-init controls' heads of this layer (0.1 to 0.3): a comparison, not a tested finding"
    """
    if row is not None and row.get("controls", 0) and not pd.isna(row.get("null_high")):
        where = ("beyond" if row["ci_low"] > row["null_high"] or row["ci_high"] < row["null_low"] else "overlapping")
        return (f"{where} its {int(row['controls'])} random-init controls' heads of this layer ({row['null_low']:.3g} "
                f"to {row['null_high']:.3g}): a comparison, not a tested finding")
    return f"describes; not tested: no null for {metric} ({why})"


def supported(rows: pd.DataFrame, *, striking="high") -> pd.Series:
    """True where a row may carry a claim (`why_not` is empty).

    >>> supported(pd.DataFrame({"ci_low": [0.5], "ci_high": [0.6], "chance": [0.1]})).tolist()
    [True]
    """
    return why_not(rows, striking=striking) == ""


def run_gate_text(runs) -> str:
    """`gate_text` for each of a report's sweeps ((name, tables) pairs), once where they say the same; a retrieval
    or patching run beside a sweep makes no findings of its own and is not named."""
    runs = [(name, tables) for name, tables in runs if "heads" in tables.frames] or list(runs)
    texts = [gate_text(recount(tables.provenance.extra.get("findings"), tables.frames)) for _, tables in runs]
    if len(set(texts)) <= 1:
        return texts[0] if texts else gate_text()
    return " ".join(f"{name}: {text}" for (name, _), text in zip(runs, texts))


def recount(findings: dict | None, frames) -> dict | None:
    """A run's findings summary (`headscan.metrics.nulls.add_findings`) with its counts taken again from the rows:
    per model and table, ``tested`` the rows with a p-value and ``findings`` those with ``finding`` true, so what a
    report says is what its tables hold, even where the rows were tested again after the summary was written.
    The rule, q, controls and the rows calibration kept (which the rows do not record) stay the summary's.

    >>> rows = pd.DataFrame({"model": ["m", "m", "m"], "p_value": [0.001, 0.2, np.nan],
    ...                      "finding": pd.array([True, False, pd.NA], dtype="boolean")})
    >>> out = recount({"family": {"m": 9}, "findings": {"m": 4}, "by_table": {"m": {"heads": {
    ...     "tested": 9, "findings": 4, "kept_by_calibration": 1}}}}, {"heads": rows})
    >>> out["family"], out["findings"], out["by_table"]["m"]["heads"]
    ({'m': 2}, {'m': 1}, {'tested': 2, 'findings': 1, 'kept_by_calibration': 1})
    """
    if not findings:
        return findings
    out = dict(findings)
    by_table: dict = {}
    for model in findings.get("family", {}):
        by_table[model] = {}
        for table in findings.get("by_table", {}).get(model, {}) or findings.get("tables", []):
            frame = frames.get(table) if hasattr(frames, "get") else None
            if frame is None or "finding" not in frame.columns:
                continue
            mine = frame[frame["model"].astype(str) == model]
            said = findings.get("by_table", {}).get(model, {}).get(table, {})
            by_table[model][table] = {**said, "tested": int(mine["p_value"].notna().sum()),
                                      "findings": int(mine["finding"].astype("boolean").fillna(False).sum())}
    out["by_table"] = by_table
    out["family"] = {m: sum(t["tested"] for t in tables.values()) for m, tables in by_table.items()}
    out["findings"] = {m: sum(t["findings"] for t in tables.values()) for m, tables in by_table.items()}
    return out


def _controls(pool: list[str]) -> str:
    return pool[0] if len(pool) == 1 else f"its {len(pool)} random-init controls"


def gate_text(findings: dict | None = None) -> str:
    """The rule, in one sentence, as reports state it; `findings` (a run's ``provenance.extra["findings"]``,
    `headscan.metrics.nulls.add_findings`) makes it the sweep's tested rule, with its families and counts.

    >>> print(gate_text({"rule": "Benjamini-Hochberg", "q": 0.05, "family": {"m": 120, "m [random init]": 0},
    ...                  "findings": {"m": 7, "m [random init]": 0}, "controls": {"m": ["m [random init]"]},
    ...                  "by_table": {"m": {"heads": {"tested": 100, "findings": 5, "kept_by_calibration": 2},
    ...                                     "syntax": {"tested": 20, "findings": 2, "kept_by_calibration": 0}}}}))
    ... # doctest: +NORMALIZE_WHITESPACE
    A finding is a row of heads, value or syntax that the sweep tested and found: one-sided, on its 95% interval
    widened by what its family needed to hold 95% at its number of units (calibrated on real text; a family never
    measured takes the widest factor; fewer units than any size measured: too few to assess), beyond an empirical
    null (the range of the random-init controls' heads at the same layer, with uniform attention as well where
    the metric is a mean of attention weights; syntax also beyond the best fixed offset on the same words), then
    Benjamini-Hochberg at q = 0.05 over each model's heads and syntax rows, and apart over its value rows
    (value.parquet repeats heads' questions, so it is a family of its own), and not thin. A run without random-init controls tests attention shares against uniform
    attention only, which untrained heads leave too: such rows are "beyond uniform attention only", never
    findings. Findings: m 7 of 120 tested rows (null from m [random init]; heads 5 of 100, 2 more beyond the null
    by the bootstrap's own interval but not by the calibrated one; syntax 2 of 20); m [random init] none tested
    (no other random-init control to hold it against).
    """
    if findings:
        counts = []
        for model, size in findings.get("family", {}).items():
            pool = findings.get("controls", {}).get(model) or []
            kind = split_control(model)[1]
            untrained = kind == "random-init"
            source = ("" if not pool else f"against the other {len(pool)} random-init controls" if untrained
                      else f"null from {_controls(pool)}")
            sources = [source] * bool(source) + [
                "the trained weights over the same words shuffled, so its findings are heads whose pattern needs no "
                "word order, not false findings"] * (kind == "shuffled-words")  # trained weights: real findings
            tables = [f"{name} {t['findings']:,} of {t['tested']:,}" + (
                f", {t['kept_by_calibration']:,} more beyond the null by the bootstrap's own interval but not by the "
                "calibrated one" if t.get("kept_by_calibration") else "")
                for name, t in findings.get("by_table", {}).get(model, {}).items() if t["tested"]]
            detail = "; ".join(sources + tables)
            counts.append(f"{model} {findings['findings'].get(model, 0):,} of {size:,} tested rows"
                          + (f" ({detail})" if detail else "") if size else
                          f"{model} none tested (no other random-init control to hold it against)"
                          if untrained else f"{model} none tested")
        return ("A finding is a row of heads, value or syntax that the sweep tested and found: one-sided, on its 95% "
                "interval widened by what its family needed to hold 95% at its number of units (calibrated on real "
                "text; a family never measured takes the widest factor; fewer units than any size measured: too few "
                "to assess), beyond an empirical null (the range of the random-init controls' heads at the same "
                "layer, with uniform attention as well where the metric is a mean of attention weights; syntax also "
                f"beyond the best fixed offset on the same words), then {findings['rule']} at q = {findings['q']:g} "
                "over each model's heads and syntax rows, and apart over its value rows (value.parquet repeats "
                "heads' questions, so it is a family of its own), and not thin. A run without random-init controls tests attention shares against uniform attention "
                "only, which untrained heads leave too: such rows are \"beyond uniform attention only\", never "
                "findings. Findings: " + "; ".join(counts) + ".")
    return ("A claim about a head (a finding, a role, a place in a top-head list) needs its 95% interval to rest "
            "on enough segments or documents (not thin) and to lie beyond chance, the value of uniform attention "
            "over the keys each query sees, on the metric's striking side: its low end above chance where high "
            "is striking, its high end below chance where low is.")


@functools.cache
def untrained_beyond_uniform() -> pd.DataFrame:
    """How many random-init heads lie beyond uniform attention, per model and metric, in a committed sweep with
    controls (``headscan/data/untrained_vs_uniform.csv``, from ``experiments/untrained_vs_uniform.py``)."""
    text = resources.files("headscan").joinpath("data/untrained_vs_uniform.csv").read_text(encoding="utf-8")
    return pd.read_csv(io.StringIO(text))


def no_controls_text(models) -> str:
    """Why a run without random-init controls makes no finding, with what untrained heads were measured to do
    ("" where every trained model of `models` has controls).

    >>> print(no_controls_text(["minilm"]))  # doctest: +ELLIPSIS
    minilm was swept without random-init controls, so it makes no findings: ... entropy_norm 360 of 360, ...
    """
    models = list(dict.fromkeys(models))
    pool = {split_control(m)[0] for m in models if split_control(m)[1] == "random-init"}
    bare = [m for m in models if split_control(m)[1] is None and m not in pool]
    if not bare:
        return ""
    measured = untrained_beyond_uniform()
    said = []
    for model in bare:
        mine = measured[(measured["model"] == model) & (measured["beyond"] > 0)].sort_values("share", ascending=False)
        if len(mine):
            said.append(f"untrained {model} heads lie beyond it on " + ", ".join(
                f"{r.metric} {r.beyond} of {r.heads}" for r in mine.itertuples()) + f" ({mine['run'].iloc[0]})")
    measured_text = ("; ".join(said) if said else "how often they do was measured for minilm and smollm2 only "
                     "(experiments/untrained_vs_uniform.py)")
    return (f"{', '.join(bare)} {'was' if len(bare) == 1 else 'were'} swept without random-init controls, so "
            f"{'it makes' if len(bare) == 1 else 'they make'} no findings: {'its' if len(bare) == 1 else 'their'} "
            "shares of attention are tested against uniform attention only, which heads that learned nothing leave "
            f"too: {measured_text}. Rows beyond uniform attention are said to be so, never findings; sweep with "
            "--control random-init --control-seeds 5 for a null.")


def findings_note(summary: dict | None, heads: pd.DataFrame | float | None = None) -> str:
    """What a sweep prints of its findings: per model, its findings per table, and why it has none where the run
    cannot make any (no random-init controls; fewer units than any calibration measured). `heads` is the run's
    heads table (or the most units a row rests on).

    >>> print(findings_note({"family": {"m": 10}, "findings": {"m": 2}, "controls": {"m": ["m [random init]"]},
    ...                      "by_table": {"m": {"heads": {"tested": 10, "findings": 2, "too_few_units": 0}}}}, 318))
    findings: m 2 (heads 2 of 10 tested; null from m [random init])
    >>> print(findings_note({"family": {"m": 10}, "findings": {"m": 0}, "controls": {}}, 8))  # doctest: +ELLIPSIS
    findings: m none: its rows rest on at most 8 units, fewer than the 10 ... to assess any (sweep more documents...)
    """
    if not summary:
        return ""
    from ..intervals.calibration import smallest_size

    smallest = smallest_size()
    units = heads if not isinstance(heads, pd.DataFrame) else (
        float(heads["units"].max()) if "units" in heads.columns and heads["units"].notna().any() else None)
    lines = []
    for model in summary.get("family", {}):
        if split_control(model)[1] is not None:
            continue  # a control: its own verdicts are the check of the gate, in run.json and the report
        pool = summary.get("controls", {}).get(model) or []
        tables = summary.get("by_table", {}).get(model, {})
        if units is not None and units < smallest:
            lines.append(f"{model} none: its rows rest on at most {int(units)} units, fewer than the {smallest} at "
                         "which any interval's coverage was measured, too few to assess any (sweep more documents "
                         "or segments)")
        elif not pool:
            lines.append(f"{model} none: swept without random-init controls, so no row has a null untrained heads "
                         "do not also pass (add --control random-init --control-seeds 5)")
        else:
            parts = [f"{name} {t['findings']:,} of {t['tested']:,} tested" for name, t in tables.items() if t["tested"]]
            lines.append(f"{model} {summary['findings'].get(model, 0):,} ({'; '.join(parts)}; null from "
                         f"{_controls(pool)})")
    return "findings: " + "\n          ".join(lines) if lines else ""
