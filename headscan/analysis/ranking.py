"""Ranking heads: the most striking heads of a metric, which end is striking, wide intervals, and the numbers
as a report or ``headscan show`` prints them.

A metric's striking end, unit and bounds come from the registry through `headscan.metrics.describe`: the
highest share of attention, but the lowest entropy (the most focused head). `top_heads` is the one ranking of
heads on a metric; `top_heads_text` is what ``headscan show`` prints.

This module draws nothing and loads no model.

>>> heads = pd.DataFrame({"model": "m", "family": "causal", "layer": [0, 0, 1], "head": [0, 1, 0],
...                       "label": ["L0H0", "L0H1", "L1H0"], "metric": "entropy", "value": [2.0, 0.5, 1.0],
...                       "count": 10.0, "ci_low": float("nan"), "ci_high": float("nan")})
>>> top_heads(heads, metric="entropy", n=2)[["rank", "label", "value"]].to_dict("records")
[{'rank': 1, 'label': 'L0H1', 'value': 0.5}, {'rank': 2, 'label': 'L1H0', 'value': 1.0}]
"""

from __future__ import annotations

import difflib

import numpy as np
import pandas as pd

from ..errors import MetricError, TablesError
from ..metrics import METRICS, describe, get_metric
from ..tables import TABLES, ModelProvenance, RunProvenance, SweepTables, thin_support
from .claims import why_not
from .formats import fmt_bucket, pct  # noqa: F401  (re-exported)
from .importance import effects
from .syntax import best_heads, offset_text, relation_order

__all__ = ["WIDE_CI", "bounded", "striking_order", "striking_of", "ci_is_wide", "top_heads", "thin", "top_rows",
           "fmt_score", "fmt_bucket", "pct", "structural_reason", "why_structural", "top_heads_text", "unit_note",
           "controls_note", "show_metrics"]

WIDE_CI = 0.1  # an interval wider than this (0-1 metrics) or than this fraction of the value (others) is wide
_SUPPORT = ("units", "top_unit_share")  # the columns headscan.tables.thin_support reads
ZERO = 1e-12  # a value this close to 0 is 0
# The columns `headscan show` prints; ``unsupported`` (why a row carries no claim) under the reports' own word.
SHOWN = ["model", "label", "layer", "head", "value", "ci_low", "ci_high", "chance", "count", "units", "unsupported"]
NO_CLAIM = {"unsupported": "no claim"}


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
              keep_flat: bool = False) -> pd.DataFrame:
    """The `n` most striking heads of each model on `metric`, ranked, with their 95% intervals and support.

    `heads` holds the rows of the metric's table (heads.parquet, or retrieval.parquet for ``retrieval``).

    The highest values come first, or the lowest where the registry marks low as striking (entropy: the
    most focused heads). Undefined (NaN) heads are left out; ties go to the lower layer, then head. A model
    whose heads all score the same has no top heads and is left out too, unless `keep_flat` (``headscan
    show`` keeps it; the report says why instead, see `headscan.analysis.findings`).

    Returns
    -------
    DataFrame
        Columns ``model, rank, label, layer, head, value, ci_low, ci_high, chance, count, units, wide, thin,
        unsupported`` (``wide``: see `ci_is_wide`; ``thin``: the value rests on thin support,
        `headscan.tables.thin_support`: read it as unsure whatever its interval says; ``unsupported``: why the
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
    entry = get_metric(metric)  # an unknown name gets "did you mean"
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
    rows = rows.sort_values(["value", "layer", "head"], ascending=[not entry.ranks_high(), True, True], kind="stable")
    rows = rows.assign(thin=thin_support(rows))
    top = rows.groupby("model", sort=False).head(n)
    top = top.assign(chance=top["chance"] if "chance" in top.columns else np.nan)
    top = top.assign(unsupported=why_not(top, striking=entry.striking) if len(top) else pd.Series(dtype=object))
    top = top.sort_values("model", key=lambda names: names.map(order), kind="stable").reset_index(drop=True)
    top["rank"] = top.groupby("model", sort=False).cumcount() + 1
    top["wide"] = ci_is_wide(top.assign(metric=metric))
    columns = ["model", "rank", "label", "layer", "head", "value", "ci_low", "ci_high", "chance", "count", "units",
               "wide", "thin", "unsupported"]
    return top[columns].astype({"model": str, "label": str, "thin": bool, "unsupported": object})


def _with_support(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with the support columns, NaN (not recorded: never thin) where a table predates them."""
    return rows.assign(**{c: np.nan for c in _SUPPORT if c not in rows.columns})


def thin(rows: pd.DataFrame) -> pd.Series:
    """`headscan.tables.thin_support` of `rows`, also for rows of a table that predates the support columns."""
    return thin_support(_with_support(rows))


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


# --- what headscan show prints ----------------------------------------------------------------------------


def top_heads_text(run: SweepTables, metric: str | None = None, n: int = 10) -> str:
    """What ``headscan show`` prints: the `n` most striking heads of each model on `metric`, as a table, with a
    model whose `metric` is 0 or undefined by construction said in one line instead of n rows of zeros.

    >>> heads = pd.DataFrame({"model": ["gpt", "gpt"], "family": "causal", "layer": 0, "head": [0, 1],
    ...     "label": ["L0H0", "L0H1"], "metric": "next_token", "value": 0.0, "ci_low": 0.0, "ci_high": 0.0,
    ...     "count": 5.0, "units": 5.0, "top_unit_share": 0.2})
    >>> print(top_heads_text(SweepTables({"heads": heads}), "next_token"))
    gpt: next_token: a causal model's queries cannot see later tokens, so it is 0 for every head

    A model whose `metric` is undefined for every head in this run (streaming on segments shorter than the sink
    and window, dla without values, retrieval when no answer passed the gate) gets one line saying why, too.
    ``copying`` (weights.parquet), which the metric registry does not hold, prints its highest heads; a profile
    (offsets, positions) each head at its peak (`_profile_text`); ``importance`` (importance.parquet) the heads
    whose removal changes the target most, either way (`headscan.analysis.importance.effects`). ``syntax``, for
    a run with a syntax table, prints each model's best head per relation and direction against the fixed-offset
    baseline (`headscan.analysis.syntax.best_heads`), for the `n` relations with most dependents.

    Raises
    ------
    MetricError
        `metric` is none of `show_metrics` ("did you mean").
    TablesError
        The run has no table of `metric` (the message says how to get one), or `n` is below 1.
    """
    if metric is None:  # a sweep's previous-token heads, a retrieval run's retrieval heads
        metric = "prev_token" if "heads" in run.frames else "retrieval"
    if n < 1:
        raise TablesError(f"top must be at least 1, got {n}")
    table = _table_of(metric)  # an unknown name gets "did you mean", among every metric show takes
    if table not in run.frames:
        how = _HOW_TO_GET.get(table, "sweep a corpus with headscan sweep to get one")
        raise TablesError(f"this run has no {table}.parquet, so no {metric!r}; {how}")
    if metric == "syntax":
        return _syntax_text(run["syntax"], n)
    if metric == "importance":
        return _importance_text(run["importance"], n)
    if metric not in METRICS:
        return _unregistered_text(run, metric, n)
    if list(TABLES[table].keys) != ["metric"]:
        return _profile_text(run[table], metric, n)
    heads = run[table]
    said, shown = [], []
    for model in dict.fromkeys(heads["model"]):
        rows = heads[(heads["model"] == model) & (heads["metric"] == metric)]
        family = str(heads.loc[heads["model"] == model, "family"].iloc[0])
        provenance = run.provenance.model(model)
        reason = why_structural(rows, metric, family=family, provenance=provenance if provenance.family else None)
        if reason is None and rows["value"].isna().all():
            reason = _why_undefined_here(run, model, metric)
        if reason is not None:
            said.append(f"{model}: {metric}: {reason}")
        else:
            shown.append(model)
    top = top_heads(heads[heads["model"].isin(shown)], metric, n, keep_flat=True)  # checks `n` even if none is shown
    parts = [top[SHOWN].rename(columns=NO_CLAIM).to_string(index=False)] if shown else []
    return "\n".join(parts + said)


def show_metrics() -> list[str]:
    """Every metric `top_heads_text` (``headscan show --metric``) takes: the registry's, then the scores a sweep
    writes that the registry does not hold (``copying``)."""
    return [*METRICS, *(name for name in _UNREGISTERED if name not in METRICS)]


def _table_of(metric: str) -> str:
    """The table `metric` lives in; an unknown name gets "did you mean", among `show_metrics`."""
    if metric in METRICS:
        return METRICS[metric].table
    if metric in _UNREGISTERED:
        return _UNREGISTERED[metric][0]
    close = difflib.get_close_matches(metric, show_metrics(), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise MetricError(f"unknown metric {metric!r}.{hint} Available: {', '.join(show_metrics())}")


def _why_undefined_here(run: SweepTables, model: str, metric: str) -> str:
    """Why `model`'s `metric` is undefined (NaN, or no row) for every head of this run, where the registry gives no
    structural reason: not scored (what the sweep recorded), or no query of the corpus counts for it."""
    config = run.provenance.config
    recorded = run.provenance.model(model).extra.get("dla")
    if metric.startswith("dla") and recorded and not recorded.startswith("captured"):
        return f"undefined for every head: dla {recorded}" + ("; headscan sweep --values scores it"
                                                                  if "values=False" in recorded else "")
    if metric == "streaming" and {"sink", "recent"} <= set(config):
        return (f"undefined for every head: no query lies at or past position sink + recent ({config['sink']} + "
                f"{config['recent']}); give headscan sweep longer segments, or a smaller --sink and --recent")
    if metric == "retrieval":
        return "undefined for every head: no trial's answer passed the gate (retrieval_ungated scores every trial)"
    return "undefined for every head: no query of the corpus counts for it"


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
    >>> unit_note(RunProvenance(config={"bootstrap_unit": "segment"}))  # a run from before "auto"
    'intervals resample segments'
    """
    why = run.extra.get("bootstrap_unit") or ""
    unit = run.config.get("bootstrap_unit") or ("trial" if why.startswith("trial:") else "segment")
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


# Scores a sweep may write that the metric registry does not hold: metric -> the table it is in.
# What to run for a table a run lacks, said when `headscan show` is asked for one of its metrics.
_HOW_TO_GET = {
    "heads": "sweep a corpus with headscan sweep to get one (this is not a sweep's output)",
    "syntax": "sweep a CoNLL-U treebank (headscan sweep --corpus FILE.conllu) to get one",
    "importance": "sweep with headscan sweep --importance atp (or ablate) to get one",
    "value": "sweep with headscan sweep --values to get one",
    "retrieval": "run headscan retrieval to get one",
}


def _profile_text(frame: pd.DataFrame, metric: str, n: int) -> str:
    """`top_heads_text` for a profile (offsets, positions): each head at the point of its axis where it is most
    striking, then the `n` most striking heads per model. Points where every head of a model scores the same (a
    causal model's first_token at position 0) rank nothing and are left out.

    >>> offsets = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 0, 1, 1], "label": ["L0H0", "L0H0", "L0H1",
    ...     "L0H1"], "offset": [-1, 0, -1, 0], "value": [0.9, 0.1, 0.2, 0.7], "ci_low": float("nan"),
    ...     "ci_high": float("nan"), "count": 8, "units": 4})
    >>> print(_profile_text(offsets, "offsets", 5))
    offsets: each head at the offset where it is highest
    model label  layer  head  offset  value  ci_low  ci_high  count  units    no claim
        m  L0H0      0     0      -1    0.9     NaN      NaN      8      4 no interval
        m  L0H1      0     1       0    0.7     NaN      NaN      8      4 no interval

    For offsets that is the offset each head attends to most (-1: a previous-token head), the heads that put the
    most attention there first.
    """
    rows = frame[frame["metric"] == metric] if "metric" in frame.columns else frame
    axis = [c for c in TABLES[_table_of(metric)].keys if c != "metric"]
    rows = rows[rows["value"].notna()]
    if len(rows):
        at_point = rows.groupby(["model", *axis], sort=False, observed=True)["value"]
        rows = rows[(at_point.transform("nunique") > 1) | (at_point.transform("size") == 1)]
    high = describe(metric).ranks_high()
    rows = rows.sort_values(["value", "layer", "head", *axis], ascending=[not high, True, True, *[True] * len(axis)],
                            kind="stable")
    peaks = rows.drop_duplicates(["model", "layer", "head"])
    models = {name: i for i, name in enumerate(dict.fromkeys(frame["model"]))}
    top = peaks.groupby("model", sort=False).head(n).sort_values("model", key=lambda c: c.map(models), kind="stable")
    columns = [c for c in ["model", "label", "layer", "head", *axis, "value", "ci_low", "ci_high", "chance", "count",
                           "units"] if c in top.columns]
    head = f"{metric}: each head at the {', '.join(axis)} where it is {'highest' if high else 'lowest'}"
    if top.empty:
        return f"{head}: no head differs from the others of its model at any point"
    top = top.assign(unsupported=why_not(top, striking=describe(metric).striking))
    return head + "\n" + top[[*columns, "unsupported"]].rename(columns=NO_CLAIM).to_string(index=False)


_UNREGISTERED = {"copying": ("weights", "copying"), "dla": ("heads", "dla"), "dla_positive": ("heads", "dla_positive")}


def _unregistered_text(run: SweepTables, metric: str, n: int) -> str:
    """`top_heads_text` for ``copying`` (weights.parquet) and ``dla`` / ``dla_positive`` (heads.parquet): the
    highest first, ties to the lower layer, then head."""
    if n < 1:
        raise TablesError(f"top must be at least 1, got {n}")
    table = _UNREGISTERED[metric][0]
    frame = run[table]
    rows = frame[(frame["metric"] == metric) & frame["value"].notna()]
    rows = rows.sort_values(["value", "layer", "head"], ascending=[False, True, True], kind="stable")
    models = {name: i for i, name in enumerate(dict.fromkeys(frame["model"]))}
    rows = rows.groupby("model", sort=False).head(n).sort_values("model", key=lambda c: c.map(models), kind="stable")
    columns = ["model", "label", "layer", "head", "value"] + (["embedding"] if table == "weights" else
                                                               ["ci_low", "ci_high", "count"])
    said = [f"{model}: {metric}: {_why_undefined(run, model, metric)}" for model in models
            if not (rows["model"] == model).any()]
    return "\n".join(([rows[columns].to_string(index=False)] if len(rows) else []) + said)


def _why_undefined(run: SweepTables, model: str, metric: str) -> str:
    """Why `model` has no value of an unregistered score: the registry's structural reason, else what the
    sweep recorded of it (the provenance's ``weights`` or ``dla``: "not scored: ...")."""
    provenance = run.provenance.model(model)
    frame = run[_UNREGISTERED[metric][0]]
    family = str(frame.loc[frame["model"] == model, "family"].iloc[0])
    reason = structural_reason(metric, family, provenance if provenance.family else None)
    recorded = provenance.extra.get("weights" if metric == "copying" else "dla")
    return reason or recorded or "undefined (NaN) for every head"


def _importance_text(importance: pd.DataFrame, n: int) -> str:
    """`top_heads_text` for ``importance``: each model's `n` heads of largest |effect| (exact mean ablation where
    the sweep ran it, else AtP's estimate)."""
    if n < 1:
        raise TablesError(f"top must be at least 1, got {n}")
    rows = effects(importance)
    if rows.empty:
        return "importance: no head has a value (hidden_change has no AtP rows; sweep with --importance ablate)"
    models = {name: i for i, name in enumerate(dict.fromkeys(importance["model"]))}
    rows = rows.reindex(rows["value"].abs().sort_values(ascending=False, kind="stable").index)
    rows = rows.groupby("model", sort=False).head(n).sort_values("model", key=lambda c: c.map(models), kind="stable")
    rows = rows.assign(units=rows["units"].astype("Int64"))
    columns = ["model", "label", "layer", "head", "target", "method", "value", "ci_low", "ci_high", "units", "thin"]
    return (rows[columns].to_string(index=False, float_format=lambda v: f"{v:+.4g}")
            + "\nvalue: the target's change when the head's output is replaced by its mean (ablated minus clean); "
              "0 is no effect")


def _syntax_text(syntax: pd.DataFrame, n: int) -> str:
    """`top_heads_text` for ``syntax``: the best heads of the `n` relations with most dependents (``all`` first)."""
    if n < 1:
        raise TablesError(f"top must be at least 1, got {n}")
    best = best_heads(syntax, relations=relation_order(syntax)[:n])
    if best.empty:
        return "syntax: no scored dependent (the sweep scores relations on CoNLL-U treebanks only)"
    models = {name: i for i, name in enumerate(dict.fromkeys(syntax["model"]))}
    best = best.sort_values("model", key=lambda names: names.map(models), kind="stable")  # model by model
    best = best.assign(count=best["count"].astype(int), baseline_offset=best["baseline_offset"].map(offset_text))
    columns = ["model", "relation", "direction", "label", "accuracy", "ci_low", "ci_high", "count", "baseline",
               "baseline_offset", "margin", "beats", "unsupported"]
    return (best[columns].rename(columns=NO_CLAIM).to_string(index=False, float_format=lambda v: f"{v:.3f}")
            + "\nbeats: the 95% interval's low end is above the best fixed-offset baseline (offset d in -3..2)")
