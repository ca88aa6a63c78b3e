"""Ranking heads: the most striking heads of a metric, which end is striking, wide intervals, the numbers as a
report prints them, metrics that are 0 or undefined by construction, and a run's notes (its unit, its controls).

A metric's striking end, unit and bounds come from the registry through `headscan.metrics.describe`: the
highest share of attention, but the lowest entropy (the most focused head). `top_heads` is the one ranking of
heads on a metric; what ``headscan show`` prints from it is `headscan.analysis.show`.

This module draws nothing and loads no model.

>>> heads = pd.DataFrame({"model": "m", "family": "causal", "layer": [0, 0, 1], "head": [0, 1, 0],
...                       "label": ["L0H0", "L0H1", "L1H0"], "metric": "entropy", "value": [2.0, 0.5, 1.0],
...                       "count": 10.0, "ci_low": float("nan"), "ci_high": float("nan")})
>>> top_heads(heads, metric="entropy", n=2)[["rank", "label", "value"]].to_dict("records")
[{'rank': 1, 'label': 'L0H1', 'value': 0.5}, {'rank': 2, 'label': 'L1H0', 'value': 1.0}]
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import TablesError
from ..metrics import METRICS, describe, get_metric
from ..tables import TABLES, ModelProvenance, RunProvenance, thin_rows
from .claims import why_not
from .formats import fmt_bucket, pct  # noqa: F401  (re-exported)

__all__ = ["WIDE_CI", "bounded", "striking_order", "striking_of", "ci_is_wide", "top_heads", "thin_passed", "thin_note", "thin",
           "top_rows",
           "fmt_score", "fmt_bucket", "pct", "structural_reason", "why_structural", "unit_note", "controls_note"]

WIDE_CI = 0.1  # an interval wider than this (0-1 metrics) or than this fraction of the value (others) is wide
_SUPPORT = ("units", "top_unit_share")  # the columns headscan.tables.thin_rows reads
ZERO = 1e-12  # a value this close to 0 is 0


def bounded(metric: str) -> bool:
    """Whether `metric` lies in [0, 1] (`describe`); a name the registry does not know is taken to."""
    return describe(metric).bounded


def striking_order(metric: str) -> str:
    """``"highest"`` or ``"lowest"``: which heads of `metric` come first, in words (`describe`'s striking end).

    >>> striking_order("prev_token"), striking_order("entropy")
    ('highest', 'lowest')
    """
    return "highest" if describe(metric).ranks_high() else "lowest"


def striking_of(rows: pd.DataFrame) -> pd.Series:
    """Each row's striking end, "high" or "low", from its ``metric`` (`describe`; "high" for a table without one).

    >>> striking_of(pd.DataFrame({"metric": ["prev_token", "entropy"]})).tolist()
    ['high', 'low']
    """
    if "metric" not in rows.columns:
        return pd.Series("high", index=rows.index, dtype=object)
    ends = {m: describe(str(m)).striking for m in rows["metric"].unique()}
    return rows["metric"].map(ends).astype(object)


def ci_is_wide(rows: pd.DataFrame, *, threshold: float = WIDE_CI) -> pd.Series:
    """Whether each row's 95% interval is wide enough to show.

    Wide means ``ci_high - ci_low > threshold`` for 0-1 metrics, and for unbounded ones (entropy in nats,
    distance in tokens) more than ``threshold`` times the value, or than ``threshold`` units for values below
    1 (so that 0.002 [0.001, 0.003] nats, a head on one key, is not called wide). Rows without an interval are
    not wide.

    >>> rows = pd.DataFrame({"metric": ["prev_token", "prev_token", "entropy", "entropy"],
    ...                      "value": [0.5, 0.5, 2.0, 0.002], "ci_low": [0.3, 0.45, 1.9, 0.001],
    ...                      "ci_high": [0.7, 0.55, 2.1, 0.003]})
    >>> ci_is_wide(rows).tolist()
    [True, False, False, False]
    """
    width = rows["ci_high"] - rows["ci_low"]
    share = rows["metric"].map(bounded).astype(bool)
    limit = np.where(share, threshold, threshold * np.maximum(rows["value"].abs(), 1.0))
    # The 1e-9 keeps an interval of exactly the threshold (0.55 - 0.45 in floating point) from counting as wide.
    return pd.Series((width > limit + 1e-9).fillna(False).to_numpy(dtype=bool), index=rows.index)


def top_heads(heads: pd.DataFrame, metric: str, n: int = 10, *, model: str | None = None,
              keep_flat: bool = False, thin_last: bool = False) -> pd.DataFrame:
    """The `n` most striking heads of each model on `metric`, ranked, with their 95% intervals and support.

    `heads` holds the rows of the metric's table (heads.parquet, or retrieval.parquet for ``retrieval``).

    The highest values come first, or the lowest where the registry marks low as striking (entropy: the
    most focused heads). Undefined (NaN) heads are left out; ties go to the lower layer, then head. A model
    whose heads all score the same has no top heads and is left out too, unless `keep_flat` (``headscan
    show`` keeps it; the report says why instead, see `headscan.analysis.findings`). With `thin_last` (the
    report's "Top heads" and ``headscan show``), the heads on thin support rank after every supported head, so
    that a value no interval can be trusted for never ranks first above one that can; `thin_passed` names the
    ones that their value alone would have put among the `n`.

    Returns
    -------
    DataFrame
        Columns ``model, rank, label, layer, head, value, ci_low, ci_high, chance, count, units, wide, thin,
        unsupported``, then the sweep's verdict columns where the table has them (``null_kind`` ... ``finding``,
        `headscan.metrics.nulls`) and ``joint_low``, ``joint_high``, the interval over all heads at once that a
        head picked as the top may claim (``wide``: see `ci_is_wide`; ``thin``: the value rests on thin support,
        `headscan.tables.thin_rows`: read it as unsure whatever its interval says; ``unsupported``: why the
        row cannot carry a claim, `headscan.analysis.claims.why_not`, "" where it can: "at chance", "thin
        support", ...), one block of up to `n` rows per model in the table's order, rank 1 first. The list
        keeps the striking heads that fail the claim gate, marked, so that a reader sees why they are not
        findings.

    Raises
    ------
    MetricError
        `metric` is not in the registry ("did you mean").
    TablesError
        `metric` is not a head score, or `n` is below 1.
    """
    # a name the table holds but this process does not register (a user's metric whose module is not loaded) is
    # ranked as `describe` reads it; any other unknown name gets "did you mean"
    entry = describe(metric) if metric not in METRICS and (heads["metric"] == metric).any() else get_metric(metric)
    if list(TABLES[entry.table].keys) != ["metric"]:
        raise TablesError(f"{metric!r} is a profile in {entry.table}.parquet, not a head score; "
                          f"pick a metric of heads.parquet")
    if n < 1:
        raise TablesError(f"top must be at least 1, got {n}")
    rows = _with_support(heads[heads["metric"] == metric])
    if model is not None:
        rows = rows[rows["model"] == model]
    order = {name: i for i, name in enumerate(dict.fromkeys(rows["model"]))}
    if not keep_flat:
        scores = rows.groupby("model", sort=False)["value"]
        varied = scores.max() > scores.min()  # False where every head scores the same, or none is defined
        rows = rows[rows["model"].isin(varied.index[varied])]
    rows = rows[rows["value"].notna()]
    rows = rows.assign(thin=thin_rows(rows))
    order_by = ["thin"] * thin_last + ["value", "layer", "head"]
    rows = rows.sort_values(order_by, ascending=[True] * thin_last + [not entry.ranks_high(), True, True], kind="stable")
    top = rows.groupby("model", sort=False).head(n)
    top = top.assign(chance=top["chance"] if "chance" in top.columns else np.nan)
    top = top.assign(unsupported=why_not(top, striking=entry.striking) if len(top) else pd.Series(dtype=object))
    top = top.sort_values("model", key=lambda names: names.map(order), kind="stable").reset_index(drop=True)
    top["rank"] = top.groupby("model", sort=False).cumcount() + 1
    top["wide"] = ci_is_wide(top.assign(metric=metric))
    columns = ["model", "rank", "label", "layer", "head", "value", "ci_low", "ci_high", "chance", "count", "units",
               "wide", "thin", "unsupported"]
    columns += [c for c in ("null_kind", "null_low", "null_high", "p_value", "q_value", "finding", "joint_low",
                            "joint_high", "cal_low", "cal_high", "cal_factor", "cal_basis", "verdict") if c in top.columns]
    return top[columns].astype({"model": str, "label": str, "thin": bool, "unsupported": object})


def thin_passed(heads: pd.DataFrame, metric: str, n: int = 10) -> dict[str, pd.DataFrame]:
    """Per model, the heads on thin support that their value alone ranks among the `n` most striking: those that
    `top_heads` with `thin_last` ranks after the supported heads (or leaves out of the `n`). Models without such a
    head are left out. Rows as `top_heads` gives them, ``rank`` their rank on value alone.

    >>> heads = pd.DataFrame({"model": "m", "family": "causal", "layer": 0, "head": [0, 1, 2],
    ...     "label": ["L0H0", "L0H1", "L0H2"], "metric": "entropy", "value": [0.009, 0.5, 1.0], "count": 10.0,
    ...     "ci_low": [0.0, 0.4, 0.9], "ci_high": [4.85, 0.6, 1.1], "thin": [True, False, False]})
    >>> top_heads(heads, "entropy", 2, thin_last=True)["label"].tolist(), top_heads(heads, "entropy", 2)["label"].tolist()
    (['L0H1', 'L0H2'], ['L0H0', 'L0H1'])
    >>> {model: rows["label"].tolist() for model, rows in thin_passed(heads, "entropy", 2).items()}
    {'m': ['L0H0']}
    """
    plain = top_heads(heads, metric, n)
    thin = plain[plain["thin"]]
    return {model: part for model, part in thin.groupby("model", sort=False)}


def thin_note(model: str, metric: str, thin: pd.DataFrame) -> str:
    """One line: the heads of `model` on thin support that their value alone would rank among the top, ranked
    after the supported heads instead (`headscan.analysis.ranking.thin_passed`).

    >>> thin = pd.DataFrame({"label": ["L18H8"], "value": [0.009], "rank": [1]})
    >>> thin_note("smollm2", "entropy", thin)
    'smollm2: L18H8 (0.009, 1st on its value alone) rests on thin support, so it ranks after every supported head.'
    """
    heads = ", ".join(f"{row.label} ({fmt_score(metric, row.value)}, {_ordinal(int(row.rank))} on its value alone)"
                      for row in thin.itertuples())
    verb = "rests" if len(thin) == 1 else "rest"
    return f"{model}: {heads} {verb} on thin support, so {'it ranks' if len(thin) == 1 else 'they rank'} " \
           f"after every supported head."


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def _with_support(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with the support columns, NaN (not recorded: never thin) where a table predates them."""
    return rows.assign(**{c: np.nan for c in _SUPPORT if c not in rows.columns})


def thin(rows: pd.DataFrame) -> pd.Series:
    """`headscan.tables.thin_rows` of `rows`, also for rows of a table that predates the support columns."""
    return thin_rows(_with_support(rows))


def top_rows(frame: pd.DataFrame, *, keys: list[str], n: int = 10) -> pd.DataFrame:
    """The `n` most striking rows of any table per model (and per metric, where ``metric`` is among `keys`).

    For a table the report has no section of its own for: rows come in the metric's striking order (highest
    first unless the registry marks low as striking), undefined rows left out, ties to the lower layer, head.
    Where every head of a model has the same value for one combination of keys (a causal model's first_token at
    position 0: 1 for every head), those rows rank nothing and are left out.

    >>> rows = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 1, 2], "label": ["L0H0", "L0H1", "L0H2"],
    ...                      "metric": "entropy", "value": [2.0, float("nan"), 1.0]})
    >>> top_rows(rows, keys=["metric"], n=5)["label"].tolist()
    ['L0H2', 'L0H0']
    """
    rows = frame[frame["value"].notna()]
    by = ["model", "metric"] if "metric" in keys else ["model"]
    if len(rows):  # keep the rows of key combinations on which the model's heads differ
        groups = ["model", *(k for k in keys if k in rows.columns)]
        grouped = rows.groupby(groups, sort=False, observed=True, dropna=False)["value"]
        rows = rows[(grouped.transform("nunique") > 1) | (grouped.transform("size") == 1)]
    parts = []
    for _, part in rows.groupby(by, sort=False):
        high = "metric" not in by or striking_order(str(part["metric"].iloc[0])) == "highest"
        part = part.sort_values(["value", "layer", "head"], ascending=[not high, True, True], kind="stable")
        parts.append(part.head(n))
    return pd.concat(parts, ignore_index=True) if parts else rows.iloc[:0]


def fmt_score(metric: str, value: float, like: float | None = None) -> str:
    """A score as the report prints it: three decimals for 0-1 metrics and values below 1 (0.002 nats is not
    0.00), two above; more where three would round a share that is not all (or none) of the attention to 1.000
    (or 0.000); "–" for NaN. An interval's ends take the decimals of their value, `like`.

    >>> fmt_score("prev_token", 0.99957), fmt_score("prev_token", 0.5), fmt_score("entropy", 2.345)
    ('0.9996', '0.500', '2.35')
    >>> fmt_score("prev_token", 0.99951, like=0.99957), fmt_score("entropy", 0.99, like=2.3)
    ('0.9995', '0.99')
    """
    if pd.isna(value):
        return "–"
    like = value if like is None else like
    digits = 3 if bounded(metric) or abs(like) < 1 else 2
    if bounded(metric):
        while digits < 6 and (f"{like:.{digits}f}" == f"{1:.{digits}f}" and like < 1
                              or f"{like:.{digits}f}" == f"{0:.{digits}f}" and like > 0):
            digits += 1
        digits = digits if digits < 6 else 3
    return f"{value:.{digits}f}"


# --- zero or undefined by construction ---------------------------------------------------------------------


def _conditions(family: str, provenance: ModelProvenance | None) -> list[str]:
    """The registry's structural conditions (`headscan.metrics.CONDITIONS`) that hold for a model."""
    held = [family]
    if provenance is not None and provenance.special_token_ids and not provenance.has_sep:
        held.append("no_sep")  # only when the run recorded the model's special tokens
    return held


def structural_reason(metric: str, family: str, provenance: ModelProvenance | None) -> str | None:
    """The registry's reason why `metric` is 0 or undefined for every head of such a model, or None."""
    structural = describe(metric).structural
    return next((structural[c] for c in _conditions(family, provenance) if c in structural), None)


def all_zero_or_undefined(values: pd.Series) -> bool:
    """Whether one model's values of a metric are all 0, or all undefined, as a structural one must be."""
    return bool(values.isna().all() or (values.notna().all() and (values.abs() < ZERO).all()))


def why_structural(rows: pd.DataFrame, metric: str, *, family: str,
                   provenance: ModelProvenance | None = None) -> str | None:
    """Why one model's `metric` is 0 or undefined for every head by construction, or None.

    The reason is the registry's (``METRICS[metric].structural``) for a condition that holds for the model
    (its family; ``no_sep`` when its recorded special tokens have no [SEP]), and only when `rows` (that
    model's heads rows of `metric`) agree: all 0 or all NaN. Rows that disagree get a "check the sweep"
    finding instead.

    >>> rows = pd.DataFrame({"value": [0.0, 0.0]})
    >>> why_structural(rows, "next_token", family="causal")
    "a causal model's queries cannot see later tokens, so it is 0 for every head"
    >>> why_structural(rows, "next_token", family="bidirectional") is None
    True
    """
    reason = structural_reason(metric, family, provenance)
    return reason if reason is not None and all_zero_or_undefined(rows["value"]) else None


def unit_note(run: RunProvenance) -> str:
    """One line: which unit a run's intervals resampled, and why (`headscan.scan.plan.resolve_unit`; a retrieval
    run's trials, `headscan.scan.trials.TRIAL_UNIT`), the unit said once.

    >>> unit_note(RunProvenance(config={"bootstrap_unit": "document"}, extra={"bootstrap_unit": "auto: documents, "
    ...     "since the corpus has 318 documents of 2,001 segments (conllu # newdoc lines), whose segments are not "
    ...     "independent"}))
    'intervals resample documents (auto), since the corpus has 318 documents of 2,001 segments (conllu # newdoc lines), whose segments are not independent'
    >>> unit_note(RunProvenance(config={"bootstrap_unit": "segment"}, extra={"bootstrap_unit": "segment, as asked"}))
    'intervals resample segments, as asked'
    >>> unit_note(RunProvenance(config={}, extra={"bootstrap_unit": "trial: each trial is one unit"}))
    'intervals resample trials: each trial is one unit'
    >>> unit_note(RunProvenance(config={}, extra={"bootstrap_unit": "pair: each prompt pair is one unit"}))
    'intervals resample pairs: each prompt pair is one unit'
    >>> unit_note(RunProvenance(config={"bootstrap_unit": "segment"}))  # a run from before "auto"
    'intervals resample segments'
    """
    why = run.extra.get("bootstrap_unit") or ""
    unit = run.config.get("bootstrap_unit") or next((u for u in ("trial", "pair") if why.startswith(f"{u}:")),
                                                    "segment")
    said = f"intervals resample {unit}s"
    for prefix, joint in ((f"auto: {unit}s, ", " (auto), "), (f"{unit}, ", ", "), (f"{unit}: ", ": ")):
        if why.startswith(prefix):
            return said + joint + why.removeprefix(prefix)
    return said + (f" ({why})" if why else "")


CONTROL_MEANING = {"random-init": "the same architecture and tokenizer, weights drawn from the config's initialiser",
                   "shuffled-words": "the same model over the corpus with each segment's words permuted"}


def controls_note(run: RunProvenance) -> list[str]:
    """One line per control model of a run: which model it controls, what it is, and its seed.

    >>> controls_note(RunProvenance(models=(ModelProvenance("minilm"), ModelProvenance("minilm [random init]",
    ...     control="random-init", control_of="minilm", extra={"control_seed": 0}))))
    ["minilm [random init]: control of minilm, the same architecture and tokenizer, weights drawn from the config's initialiser (seed 0)"]
    """
    return [f"{m.name}: control of {m.control_of}, {CONTROL_MEANING.get(m.control, m.control)} "
            f"(seed {m.extra.get('control_seed')})" for m in run.models if m.control]
