"""Findings a network that learned nothing cannot make: each row's null, p-value, q-value and verdict.

A row of ``heads``, ``value`` or ``syntax`` claims that a head does something. `add_findings` tests each row
against what heads that learned nothing score, and corrects over every row tested, so that a count of findings
is a count with a stated false-discovery rate:

- **The null.** Where the run holds random-init controls of the row's model (`SweepConfig.control_seeds` of
  them, `headscan.scan.controls`), the null is the range of their heads at the same layer on the same metric and
  keys (``null_kind`` "controls", ``null_low`` and ``null_high`` that range); a metric whose registry null is
  "uniform" (a mean of attention weights) takes the row's chance into the range as well. A row must lie beyond
  that range *and* be unlikely as one more draw from the controls' heads (a Student prediction test on their
  mean and SD, the row's SE added, with k - 1 degrees of freedom for k control seeds: a seed's heads move
  together, so the seed is the unit; one seed alone: its m heads, m - 1): the range alone lets about one head
  in m + 1 of a fresh control past it, so a metric with few true findings would carry an untrained network's. A random-init control
  is tested against the *other* controls (with one control alone it is not tested at all: no draw is held out,
  and uniform attention is the null an untrained network fails), so its findings are the check that an
  untrained network passes the gate no more often than the rate allows.
  Without controls, a "uniform" metric is tested against its chance (``null_kind`` "uniform") and any other
  is not tested (``null_kind`` "none"): the registry's ``null_why`` says why, metric by metric.
- **Syntax** must also beat the best fixed offset on the same words (``vs_baseline``, a paired interval): the
  p-value is the larger of the two tests (an intersection-union test), ``null_kind`` "controls+baseline",
  or "baseline" without controls.
- **The test.** One-sided, by the row's SE (from its interval) and its bootstrap degrees of freedom, beyond the
  null's end on the metric's striking side (`headscan.intervals.t_p_value`): beyond every untrained head; with
  controls, the larger of that p-value and the prediction test's (an intersection-union test).
- **The calibrated interval.** The test reads the row's interval widened by what its metric's family needed to
  hold 95% at its number of units on real text (`headscan.intervals.calibration`: ``cal_low``, ``cal_high``,
  ``cal_factor``; a family never measured takes the widest factor measured at that size, ``cal_basis`` "widest
  measured"). A row on fewer units than the smallest size measured (10) is "too few units to assess": no
  p-value, ``finding`` <NA>, never "within its null".
- **The correction.** Benjamini-Hochberg (or Benjamini-Yekutieli) over two families per model (`FAMILIES`): its
  heads and syntax rows with a p-value, and apart its value rows (value.parquet asks heads' questions again).
  ``finding`` is q-value <= q, the row beyond its null's end and not thin (a thin row's interval cannot be
  assessed; it stays in the family); <NA> where no empirical null was tested (no controls, too few units).

This module runs no model and imports no torch: it takes a run's tables.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..config import split_control
from ..intervals import interval_se, q_values, t_p_value
from ..intervals.calibration import BASES, calibrate, calibrated_interval, calibration_rule, zero_width_floor
from ..intervals.verdicts import (
    FOUND,
    NO_EMPIRICAL,
    NO_INTERVAL,
    NO_NULL,
    NOT_DISCOVERED,
    THIN,
    TOO_FEW,
    VERDICTS,
    WITHIN_NULL,
)
from ..tables import FINDING_EXTRA, TABLES
from .registry import METRICS, describe

# the normal's 97.5% point: a floor half-width read as an SE, as interval_se reads an interval of unbounded df
_Z = 1.959963984540054

__all__ = ["FINDING_TABLES", "FINDING_COLUMNS", "CALIBRATION_COLUMNS", "VERDICTS", "add_findings",
           "control_pool"]

FINDING_TABLES = ("heads", "value", "syntax")
FINDING_COLUMNS = ("null_kind", "null_low", "null_high", "p_value", "q_value", "finding")
# the calibrated interval the test used (headscan.intervals.calibration) and the verdict in words
CALIBRATION_COLUMNS = ("cal_low", "cal_high", "cal_factor", "cal_basis", "verdict")
# The false-discovery families of a model: heads and syntax together (different questions of the same heads), value
# apart (value.parquet asks heads' questions again on value-weighted attention: one family would count each twice)
FAMILIES = (("heads", "syntax"), ("value",))
FAMILY_RULE = ("one false-discovery family per model for heads and syntax, and one for value: value.parquet asks "
               "heads' questions again on value-weighted attention and would count each one twice in a shared family")


def control_pool(models) -> dict[str, list[str]]:
    """For each model of a run, the random-init controls its null is built from: its spec's random-init
    controls, less itself (a control is held out from its own null).

    >>> control_pool(["m", "m [random init]", "m [random init 2]", "m [shuffled words]", "g"])["m [random init]"]
    ['m [random init 2]']
    >>> control_pool(["m", "m [random init]", "m [random init 2]", "m [shuffled words]", "g"])["m [shuffled words]"]
    ['m [random init]', 'm [random init 2]']
    """
    models = list(dict.fromkeys(models))
    untrained: dict[str, list[str]] = {}
    for name in models:
        spec, control = split_control(name)
        if control == "random-init":
            untrained.setdefault(spec, []).append(name)
    return {name: [c for c in untrained.get(split_control(name)[0], []) if c != name] for name in models}


def _column(rows: pd.DataFrame, name: str) -> np.ndarray:
    """A column as float64, NaN where the table does not record it (a row without it is not a test)."""
    return rows[name].to_numpy(dtype=np.float64) if name in rows.columns else np.full(len(rows), np.nan)


def _metric_of(table: str, rows: pd.DataFrame) -> np.ndarray:
    if "metric" in rows.columns:
        return rows["metric"].astype(object).to_numpy()
    own = [m.name for m in METRICS.values() if m.table == table]
    return np.full(len(rows), own[0] if own else table, dtype=object)


def _control_sample(rows: pd.DataFrame, controls: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The control values at each row's layer and keys: their smallest, largest, mean, SD and number (NaN where no
    control has one), in `rows`' order."""
    on = [*keys, "layer"]
    measured = controls[controls["value"].notna()]
    sample = measured.groupby(on, sort=False, dropna=False).agg(
        min=("value", "min"), max=("value", "max"), mean=("value", "mean"), std=("value", "std"),
        count=("value", "count"), seeds=("model", "nunique")).reset_index()
    return rows[on].merge(sample, on=on, how="left")  # a left merge keeps `rows`' order


def _tested(table: str, rows: pd.DataFrame, controls: pd.DataFrame | None, *, untrained: bool = False) -> pd.DataFrame:
    """`rows` (one model's, one table's) with their null and p-value, before any correction; an `untrained`
    model (a random-init control) is tested against its fellow controls alone, never against uniform attention."""
    n = len(rows)
    metric = _metric_of(table, rows)
    names = pd.Series(metric)
    side = names.map({m: describe(m).striking for m in set(metric)}).to_numpy(dtype=object)
    uniform = names.map({m: describe(m).null == "uniform" and not untrained for m in set(metric)}).to_numpy(dtype=bool)
    chance = _column(rows, "chance")
    kind = np.where(uniform, "uniform", "none").astype(object)
    low, high = np.where(uniform, chance, np.nan), np.where(uniform, chance, np.nan)
    value = rows["value"].to_numpy(dtype=np.float64)
    ci_low, ci_high = _column(rows, "ci_low"), _column(rows, "ci_high")
    df = _column(rows, "variance_df")
    df = np.where(np.isnan(df), np.inf, df)  # an interval without a recorded df: the normal's quantile
    # the interval widened by what its family needed to hold 95% at this many units (headscan.intervals.calibration);
    # the test reads the widened one, the row keeps both
    units = _column(rows, "units")
    factor, basis = calibrate(table, metric, units)
    bounds = [names.map({m: describe(m).bounds()[end] for m in set(metric)}).to_numpy(dtype=np.float64)
              for end in (0, 1)]
    cal_low, cal_high = calibrated_interval(value, ci_low, ci_high, factor, bounds, units)
    raw_se = interval_se(value, ci_low, ci_high, df)
    # a zero-width interval (every unit agrees) has no SE for a factor to widen: the rule of three stands in
    se = np.fmax(raw_se * factor, zero_width_floor(ci_low, ci_high, units, bounds) / _Z)
    predictive = np.full(n, np.nan)
    if controls is not None and len(controls):
        sample = _control_sample(rows, controls, list(TABLES[table].keys))
        has = sample["count"].notna().to_numpy()
        c_low, c_high = sample["min"].to_numpy(dtype=np.float64), sample["max"].to_numpy(dtype=np.float64)
        # a "uniform" metric's null takes its chance in too: beyond every untrained head and beyond uniform
        low = np.where(has, np.where(uniform, np.fmin(c_low, chance), c_low), low)
        high = np.where(has, np.where(uniform, np.fmax(c_high, chance), c_high), high)
        kind = np.where(has, "controls", kind)
        # and unlikely as one more draw of an untrained head: the sample's range alone lets about one head in
        # m + 1 of a fresh control past it (Student's prediction interval, the row's own SE added). The unit is
        # the seed, not the head: a seed's heads share its draw of every weight before them and move together
        # (one seed's layer can sit apart from the others'), so the SD over every head of the other seeds is
        # read with k - 1 degrees of freedom for k seeds, and the mean's own error as one seed's in k. One seed
        # alone gives no spread between seeds: its m heads stand in (m - 1 df), which a seed apart from the rest
        # can pass, so --control-seeds 5 is what the gate is checked with
        k, m = sample["seeds"].to_numpy(dtype=np.float64), sample["count"].to_numpy(dtype=np.float64)
        units = np.where(k > 1, k, m)
        spread = np.sqrt(sample["std"].to_numpy(dtype=np.float64) ** 2 * (1 + 1 / units) + se ** 2)
        mean = sample["mean"].to_numpy(dtype=np.float64)
        predictive = np.where(has & (units > 1), t_p_value(value, spread, units - 1, mean, side=side), np.nan)
    p = np.fmax(t_p_value(value, se, df, low, high, side=side), predictive)  # fmax: NaN where there is no sample
    # an interval clipped at both ends of the metric's range spans all it can be: its half-width no longer says how
    # wide it was, so it is no evidence either way (p = 1), never a small p read off a clipped half
    whole_range = (ci_low <= bounds[0]) & (ci_high >= bounds[1])
    p = np.where(whole_range & ~np.isnan(p), 1.0, p)
    # the same test on the interval as the bootstrap gave it: how many rows calibration keeps from being findings
    raw = np.where(whole_range & ~np.isnan(p), 1.0, np.fmax(t_p_value(value, raw_se, df, low, high, side=side), predictive))
    if table == "syntax":  # and beyond the best fixed offset on the same words (a paired interval)
        delta, d_low, d_high = (_column(rows, c) for c in ("vs_baseline", "vs_baseline_low", "vs_baseline_high"))
        # a paired difference's coverage was never measured: the widest family's factor at this size
        paired, _ = calibrate("heads", np.full(n, "vs_baseline", dtype=object), _column(rows, "units"))
        base_se = interval_se(delta, d_low, d_high, np.inf)
        p_base = t_p_value(delta, base_se * paired, np.inf, 0.0, side="high")
        raw_base = t_p_value(delta, base_se, np.inf, 0.0, side="high")
        if "vs_baseline_in_sample" in rows.columns:
            # the held-out offset errs low where the halves chose differently: beat the in-sample best offset too,
            # the null most favourable to the offsets (an intersection-union test: the larger p-value)
            own = [_column(rows, f"vs_baseline_in_sample{end}") for end in ("", "_low", "_high")]
            own_se = interval_se(own[0], own[1], own[2], np.inf)
            p_base = np.fmax(p_base, t_p_value(own[0], own_se * paired, np.inf, 0.0, side="high"))
            raw_base = np.fmax(raw_base, t_p_value(own[0], own_se, np.inf, 0.0, side="high"))
        p = np.where(kind == "controls", np.fmax(p, p_base), p_base)  # NaN where either is not a test
        raw = np.where(kind == "controls", np.fmax(raw, raw_base), raw_base)
        kind = np.where(kind == "controls", "controls+baseline", "baseline")
    untested = (kind == "none") | (basis == BASES[2])  # no null, or too few units to assess
    return rows.assign(null_kind=pd.array(kind, dtype="string"), null_low=np.where(kind == "none", np.nan, low),
                       null_high=np.where(kind == "none", np.nan, high), p_value=np.where(untested, np.nan, p),
                       cal_low=cal_low, cal_high=cal_high, cal_factor=factor,
                       cal_basis=pd.array(basis, dtype="string"), _p_default=np.where(untested, np.nan, raw))


def _verdicts(part: pd.DataFrame, q_value: np.ndarray, q: float) -> tuple[np.ndarray, pd.arrays.BooleanArray]:
    """Each row's verdict (`VERDICTS`) and ``finding``: True or False where the row was tested against an empirical
    null (random-init controls, or syntax's best fixed offset), <NA> where it could not be (no such null in the
    run, or too few units): the row is then neither a finding nor shown not to be one."""
    n = len(part)
    kind = part["null_kind"].astype(object).to_numpy()
    thin = (part["thin"].astype("boolean").fillna(False).to_numpy(dtype=bool) if "thin" in part.columns
            else np.zeros(n, dtype=bool))
    too_few = part["cal_basis"].astype(object).to_numpy() == BASES[2]
    value, p = part["value"].to_numpy(dtype=np.float64), part["p_value"].to_numpy(dtype=np.float64)
    metric = pd.Series(_metric_of("heads", part)) if "metric" in part.columns else pd.Series("", index=range(n))
    side = metric.map({m: describe(m).striking if m else "high" for m in set(metric)}).to_numpy(dtype=object)
    end = np.where(side == "high", part["null_high"].to_numpy(dtype=np.float64),
                   part["null_low"].to_numpy(dtype=np.float64))
    beyond = np.where(side == "high", value > end, value < end)
    discovered = q_value <= q
    verdict = np.select(
        [thin, too_few, kind == "none", np.isnan(p), ~beyond, ~discovered, kind == "uniform"],
        [THIN, TOO_FEW, NO_NULL, NO_INTERVAL, WITHIN_NULL, NOT_DISCOVERED, NO_EMPIRICAL], default=FOUND)
    finding = pd.array(verdict == FOUND, dtype="boolean")
    finding[np.isin(verdict, (TOO_FEW, NO_NULL, NO_INTERVAL, NO_EMPIRICAL))] = pd.NA
    return verdict.astype(object), finding


def add_findings(frames: dict[str, pd.DataFrame], *, q: float = 0.05, method: str = "bh"
                 ) -> tuple[dict[str, pd.DataFrame], dict]:
    """A run's tables with `FINDING_COLUMNS` filled in ``heads``, ``value`` and ``syntax`` (the module's rules),
    and a summary of the rule, its q, each model's family size and findings, for the run's provenance.

    Examples
    --------
    Four heads of a model and of its random-init control; the control's heads at layer 0 range over [0.10, 0.12]
    on ``entropy_norm``'s striking (low) side, so only the trained head far below them is a finding:

    >>> rows = pd.DataFrame({"model": ["m"] * 4 + ["m [random init]"] * 4, "layer": 0, "head": [0, 1, 2, 3] * 2,
    ...                      "metric": "entropy_norm", "value": [0.02, 0.11, 0.115, 0.105, 0.10, 0.11, 0.12, 0.11]})
    >>> rows = rows.assign(ci_low=rows["value"] - 0.005, ci_high=rows["value"] + 0.005, variance_df=50.0,
    ...                    chance=1.0, thin=False)
    >>> out, summary = add_findings({"heads": rows})
    >>> print(out["heads"][["model", "head", "null_kind", "null_low", "null_high", "finding"]].head(5).to_string(index=False))
              model  head null_kind  null_low  null_high  finding
                  m     0  controls       0.1       0.12     True
                  m     1  controls       0.1       0.12    False
                  m     2  controls       0.1       0.12    False
                  m     3  controls       0.1       0.12    False
    m [random init]     0      none       NaN        NaN     <NA>
    >>> summary["findings"], summary["family"]
    ({'m': 1, 'm [random init]': 0}, {'m': 4, 'm [random init]': 0})
    """
    out = dict(frames)
    tables = [t for t in FINDING_TABLES if t in frames and len(frames[t])]
    # each table's model names as strings once (not once per model), and the models in order of first appearance
    names = {t: frames[t]["model"].astype(str) for t in tables}
    models = list(dict.fromkeys(m for t in tables for m in pd.unique(names[t].to_numpy(dtype=object))))
    pool = control_pool(models)
    tested = {t: [] for t in tables}
    family, found, by_table = {}, {}, {}
    for model in models:  # a loop over the run's models and families
        by_table[model] = {}
        parts = {}
        for table in tables:
            frame = frames[table]
            rows = frame[names[table] == model]
            controls = frame[names[table].isin(pool[model])] if pool[model] else None
            parts[table] = _tested(table, rows, controls, untrained=split_control(model)[1] == "random-init")
        for members in FAMILIES:
            mine = [t for t in members if t in parts]
            if not mine:
                continue
            p = np.concatenate([parts[t]["p_value"].to_numpy(dtype=np.float64) for t in mine])
            default = np.concatenate([parts[t].pop("_p_default").to_numpy(dtype=np.float64) for t in mine])
            qs, by_default = q_values(p, method=method), q_values(default, method=method)
            start = 0
            for table in mine:
                part = parts[table]
                end = start + len(part)
                verdict, finding = _verdicts(part, qs[start:end], q)
                # beyond an empirical null and a discovery by the bootstrap's own interval, not by the calibrated one
                kept = ((by_default[start:end] <= q) & (verdict == NOT_DISCOVERED)
                        & (part["null_kind"].to_numpy(dtype=object) != "uniform"))
                tested[table].append(part.assign(q_value=qs[start:end], finding=finding,
                                                 verdict=pd.array(verdict, dtype="string")))
                by_table[model][table] = {"tested": int(np.isfinite(p[start:end]).sum()),
                                          "findings": int((verdict == FOUND).sum()),
                                          "kept_by_calibration": int(kept.sum()),
                                          "too_few_units": int((verdict == TOO_FEW).sum())}
                start = end
        family[model] = sum(t["tested"] for t in by_table[model].values())
        found[model] = sum(t["findings"] for t in by_table[model].values())
    for table in tables:
        whole = pd.concat(tested[table]).loc[frames[table].index] if tested[table] else frames[table]
        out[table] = whole.astype({c: FINDING_EXTRA[c] for c in (*FINDING_COLUMNS, *CALIBRATION_COLUMNS)})
    rule = {"bh": "Benjamini-Hochberg", "by": "Benjamini-Yekutieli"}[method]
    summary = {"rule": rule, "q": float(q), "tables": list(tables), "family": family, "findings": found,
               "by_table": by_table, "families": FAMILY_RULE, "calibration": calibration_rule(),
               "controls": {m: c for m, c in pool.items() if c},
               "nulls": {name: metric.null for name, metric in METRICS.items() if metric.table in FINDING_TABLES}}
    return out, summary
