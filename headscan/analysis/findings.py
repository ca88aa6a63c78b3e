"""What a report states: ranked heads, wide intervals, structural zeros, and sentences generated from the numbers.

Every function here takes tables and returns DataFrames or sentences, so tests check them number by number.
What a metric is measured in, which end of it is striking (the highest share of attention, but the lowest
entropy) and when it is 0 or undefined by construction all come from the metric registry
(`headscan.metrics.METRICS`); nothing here restates them.

This module draws nothing (see `headscan.figures`), lays out nothing (see `headscan.report`) and loads no model.

>>> heads = pd.DataFrame({"model": "m", "family": "causal", "layer": [0, 0, 1], "head": [0, 1, 0],
...                       "label": ["L0H0", "L0H1", "L1H0"], "metric": "entropy", "value": [2.0, 0.5, 1.0],
...                       "count": 10.0, "ci_low": float("nan"), "ci_high": float("nan")})
>>> top_heads(heads, metric="entropy", n=2)[["rank", "label", "value"]].to_dict("records")
[{'rank': 1, 'label': 'L0H1', 'value': 0.5}, {'rank': 2, 'label': 'L1H0', 'value': 1.0}]
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from .. import tables
from ..metrics.attention import METRICS
from ..tables.provenance import ModelProvenance

__all__ = ["WIDE_CI", "ci_is_wide", "top_heads", "top_rows", "striking_order", "why_structural", "findings",
           "findings_by_model", "fmt_score", "fmt_bucket", "relative_depth", "family_summary", "family_findings",
           "run_pairs", "run_differences"]

WIDE_CI = 0.1  # an interval wider than this (0-1 metrics) or than this fraction of the value (others) is wide

# What a share of attention is on, for the findings' sentences.
_ON = {
    "prev_token": "the previous token",
    "next_token": "the next token",
    "self": "itself",
    "first_token": "the first token",
    "sep": "separator tokens",
    "duplicate_token": "other occurrences of its own token (a duplicate-token head)",
    "induction": "the tokens that follow other occurrences of its own token (an induction head)",
}
_COUNTED = {"prev_token": "the previous token", "induction": "the tokens that follow other occurrences of their own "
                                                               "token (induction heads)"}
_ZERO = 1e-12  # a value this close to 0 is 0
_SUPPORT = ("units", "top_unit_share")  # the columns headscan.tables.thin_support reads


def _bounded(metric: str) -> bool:
    """Whether `metric` lies in [0, 1]; a name the registry does not know (another headscan's run) is taken to."""
    return metric not in METRICS or METRICS[metric].bounded


def striking_order(metric: str) -> str:
    """``"highest"`` or ``"lowest"``: which heads of `metric` come first, from its registry entry.

    >>> striking_order("prev_token"), striking_order("entropy")
    ('highest', 'lowest')
    """
    return "highest" if metric not in METRICS or METRICS[metric].ranks_high() else "lowest"


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
    bounded = rows["metric"].map(_bounded).astype(bool)
    limit = np.where(bounded, threshold, threshold * np.maximum(rows["value"].abs(), 1.0))
    # The 1e-9 keeps an interval of exactly the threshold (0.55 - 0.45 in floating point) from counting as wide.
    return pd.Series((width > limit + 1e-9).fillna(False).to_numpy(dtype=bool), index=rows.index)


def top_heads(heads: pd.DataFrame, *, metric: str, n: int = 10, model: str | None = None) -> pd.DataFrame:
    """The `n` most striking heads of each model on `metric`: `headscan.tables.top_heads`, ranked.

    The highest values come first, or the lowest where the registry marks low as striking (entropy: the
    most focused heads). Undefined (NaN) heads are left out; ties go to the lower layer, then head. A model
    whose heads all score the same has no top heads and is left out too (see `findings` for what it says).

    Returns
    -------
    DataFrame
        Columns ``model, rank, label, layer, head, value, ci_low, ci_high, wide, thin`` (``wide``: see
        `ci_is_wide`; ``thin``: the value rests on thin support, `headscan.tables.thin_support`), one block
        of up to `n` rows per model in the table's order, rank 1 first.

    Raises
    ------
    MetricError
        `metric` is not in the registry, or is not a head score.
    """
    rows = _with_support(heads[heads["metric"] == metric])
    if model is not None:
        rows = rows[rows["model"] == model]
    scores = rows.groupby("model", sort=False)["value"]
    varied = scores.max() > scores.min()  # False where every head scores the same, or none is defined
    top = tables.top_heads(rows[rows["model"].isin(varied.index[varied])], metric, n)
    order = {name: i for i, name in enumerate(varied.index)}
    top = top.sort_values("model", key=lambda names: names.map(order), kind="stable").reset_index(drop=True)
    top["rank"] = top.groupby("model", sort=False).cumcount() + 1
    top["wide"] = ci_is_wide(top.assign(metric=metric))
    columns = ["model", "rank", "label", "layer", "head", "value", "ci_low", "ci_high", "wide", "thin"]
    return top[columns].astype({"model": str, "label": str, "thin": bool})


def _with_support(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` with the support columns, NaN (not recorded: never thin) where a table predates them."""
    return rows.assign(**{c: np.nan for c in _SUPPORT if c not in rows.columns})


def _thin(rows: pd.DataFrame) -> pd.Series:
    return tables.thin_support(_with_support(rows))


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


def _conditions(family: str, provenance: ModelProvenance | None) -> list[str]:
    """The registry's structural conditions (`headscan.metrics.CONDITIONS`) that hold for a model."""
    held = [family]
    if provenance is not None and provenance.special_token_ids and not provenance.has_sep:
        held.append("no_sep")  # only when the run recorded the model's special tokens
    return held


def _reason(metric: str, family: str, provenance: ModelProvenance | None) -> str | None:
    if metric not in METRICS:
        return None
    structural = METRICS[metric].structural
    return next((structural[c] for c in _conditions(family, provenance) if c in structural), None)


def _agrees(values: pd.Series) -> bool:
    """Whether one model's values of a metric are all 0, or all undefined, as a structural one must be."""
    return bool(values.isna().all() or (values.notna().all() and (values.abs() < _ZERO).all()))


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
    reason = _reason(metric, family, provenance)
    return reason if reason is not None and _agrees(rows["value"]) else None


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
    digits = 3 if _bounded(metric) or abs(like) < 1 else 2
    if _bounded(metric):
        while digits < 6 and (f"{like:.{digits}f}" == f"{1:.{digits}f}" and like < 1
                              or f"{like:.{digits}f}" == f"{0:.{digits}f}" and like > 0):
            digits += 1
        digits = digits if digits < 6 else 3
    return f"{value:.{digits}f}"


def fmt_bucket(bucket) -> str:
    """A positions-table bucket as the query positions it covers: bucket b is [b, 2b), bucket 0 position 0 alone.

    >>> [fmt_bucket(b) for b in (0, 1, 2, 64)]
    ['0', '1', '2\u20133', '64\u2013127']
    """
    bucket = int(bucket)
    return str(bucket) if bucket < 2 else f"{bucket}\u2013{2 * bucket - 1}"


def _pct(value: float) -> str:
    text = f"{100 * value:.1f}%"
    # 0.9998 is not all of the attention: keep the digit that says so.
    return f"{100 * value:.2f}%" if text == "100.0%" and value < 1 else text


def _interval(row: pd.Series) -> str:
    if pd.isna(row["ci_low"]) or pd.isna(row["ci_high"]):
        return ""
    return f" (95% interval {_pct(row['ci_low'])} to {_pct(row['ci_high'])})"


def findings(heads: pd.DataFrame, *, threshold: float = 0.5,
             provenance: Mapping[str, ModelProvenance] | None = None) -> list[str]:
    """Sentences that state what the numbers show, generated from `heads` (never written by hand).

    All of `findings_by_model`'s sentences in one list, model by model, then those across runs.

    For each model: its strongest previous-token head (and, in a bidirectional model, next-token head);
    any other head that puts more than `threshold` of its attention on one kind of token; how many heads look
    mostly at the previous token; metrics that are 0 or undefined for every head, and why when the registry
    says so; where attention is most focused and broadest; how many scores have wide intervals, or rest on
    thin support (`headscan.tables.thin_support`), which no other finding rests on. Across runs:
    how far two runs of the same model agree. `provenance` (model name -> its `ModelProvenance`) tells
    which models have no [SEP] token.

    >>> heads = pd.DataFrame({"model": "m", "family": "causal", "layer": 0, "head": [0, 1, 0, 1],
    ...                       "label": ["L0H0", "L0H1"] * 2, "metric": ["prev_token"] * 2 + ["next_token"] * 2,
    ...                       "value": [0.999, 0.1, 0.0, 0.0], "count": 10.0, "ci_low": float("nan"),
    ...                       "ci_high": float("nan")})
    >>> for sentence in findings(heads):
    ...     print(sentence)
    In m, L0H0 puts 99.9% of its attention on the previous token.
    1 of 2 heads in m put more than half of their attention on the previous token.
    m's `next_token`: a causal model's queries cannot see later tokens, so it is 0 for every head.
    """
    by_model = findings_by_model(heads, threshold=threshold, provenance=provenance)
    return [sentence for sentences in by_model.values() for sentence in sentences]


def findings_by_model(heads: pd.DataFrame, *, threshold: float = 0.5,
                      provenance: Mapping[str, ModelProvenance] | None = None) -> dict[str, list[str]]:
    """`findings`, keyed by model (in the table's order), with the sentences across runs under ``""``."""
    by_model: dict[str, list[str]] = {}
    for model in dict.fromkeys(heads["model"]):
        rows = heads[heads["model"] == model]
        by_model[model] = _model_findings(model, rows, threshold, (provenance or {}).get(model))
    agreement = _agreement(heads)
    if agreement:
        by_model[""] = agreement
    return by_model


def _model_findings(model: str, rows: pd.DataFrame, threshold: float, provenance: ModelProvenance | None) -> list[str]:
    out = []
    family = str(rows["family"].iloc[0])
    n_heads = len(rows[["layer", "head"]].drop_duplicates())
    metrics = list(dict.fromkeys(rows["metric"]))

    # The strongest heads: previous token always, next token in a bidirectional model, any other
    # "on what" metric where one head is mostly on it.
    for metric in [m for m in _ON if m in metrics]:
        top = top_heads(rows, metric=metric, n=n_heads)
        top = top[~top["thin"]]
        if top.empty:
            continue
        best = top.iloc[0]
        wanted = metric == "prev_token" or (metric == "next_token" and family == "bidirectional")
        if wanted or best["value"] > threshold:
            out.append(f"In {model}, {best['label']} puts {_pct(best['value'])} of its attention on {_ON[metric]}"
                       f"{_interval(best) if best['wide'] else ''}.")
    for metric in [m for m in _COUNTED if m in metrics]:
        part = rows[rows["metric"] == metric]
        many = int(((part["value"] > threshold) & ~_thin(part)).sum())
        if many:
            share = "half" if threshold == 0.5 else _pct(threshold)
            out.append(f"{many} of {n_heads} heads in {model} put more than {share} of their attention on "
                       f"{_COUNTED[metric]}.")

    for metric in metrics:
        part = rows[rows["metric"] == metric]
        values = part["value"]
        reason = _reason(metric, family, provenance)
        if reason is not None and _agrees(values):
            out.append(f"{model}'s `{metric}`: {reason}.")
        elif reason is not None:
            worst = part.loc[values.abs().fillna(-1).idxmax()]
            out.append(f"Check the sweep: {worst['label']} of {model} scores {worst['value']:.3g} on `{metric}`, "
                       f"yet {reason}.")
        elif values.isna().all():
            out.append(f"{model}'s `{metric}` is undefined for every head: no query of the corpus counts for it.")
        elif _bounded(metric) and values.notna().all() and (values.abs() < _ZERO).all():
            out.append(f"{model}'s `{metric}` is 0 for every head.")

    if "entropy" in metrics:
        by_layer = rows[rows["metric"] == "entropy"].groupby("layer")["value"].mean().dropna()
        unit = METRICS["entropy"].unit if "entropy" in METRICS else ""
        if len(by_layer) > 1:
            out.append(f"In {model}, attention is most focused in layer {int(by_layer.idxmin())} (mean entropy "
                       f"{by_layer.min():.2f} {unit}) and broadest in layer {int(by_layer.idxmax())} "
                       f"({by_layer.max():.2f} {unit}).")

    bounded = rows[rows["metric"].map(_bounded).astype(bool) & rows["value"].notna()]
    wide = int(ci_is_wide(bounded).sum())
    if wide:
        out.append(f"{wide} of {len(bounded)} 0-1 scores of {model} have a 95% interval wider than {WIDE_CI:g}; "
                   "a larger corpus would narrow them.")
    defined = rows[rows["value"].notna()]
    thin = int(_thin(defined).sum())
    if thin:
        out.append(f"{thin} of {len(defined)} scores of {model} rest on thin support (too few segments or "
                   "documents, or one holding much of the sum); no finding here rests on them.")
    return out


def _agreement(heads: pd.DataFrame) -> list[str]:
    """A sentence for each pair of runs of the same model: how far apart their 0-1 scores are."""
    by_model: dict[str, list[str]] = {}
    for name in dict.fromkeys(heads["model"]):
        if ":" in name:
            by_model.setdefault(name.split(":", 1)[1], []).append(name)
    out = []
    for shown in by_model.values():
        for i, first in enumerate(shown):
            for second in shown[i + 1:]:
                keys = ["layer", "head", "label", "metric"]
                pair = heads[heads["model"] == first].merge(heads[heads["model"] == second], on=keys,
                                                            suffixes=("_a", "_b"))
                pair = pair[pair["metric"].map(_bounded).astype(bool)]
                gap = (pair["value_a"] - pair["value_b"]).abs().dropna()
                if gap.empty:
                    continue
                if gap.max() < 5e-4:
                    out.append(f"{first} and {second} give every head the same 0-1 scores, to within 0.0005.")
                    continue
                worst = pair.loc[gap.idxmax()]
                out.append(f"{first} and {second} agree within {gap.max():.3f} on every 0-1 score of every head "
                           f"(the largest gap: `{worst['metric']}` of {worst['label']}).")
    return out


# --- families side by side, runs against each other --------------------------------------------------------


def relative_depth(layer, n_layers):
    """A layer's relative depth: 0 for the first layer, 1 for the last (0 in a one-layer model).

    >>> relative_depth(2, 6), relative_depth(29, 30)
    (0.4, 1.0)
    """
    return layer / (n_layers - 1) if n_layers > 1 else 0 * layer


def family_summary(heads: pd.DataFrame, *, threshold: float = 0.5,
                   metrics: tuple[str, ...] = ("prev_token", "next_token")) -> pd.DataFrame:
    """Per model: its family, shape and, for each of `metrics`, its strongest head (thin support left out),
    that head's value and relative depth, and how many heads score above `threshold`.

    Returns
    -------
    DataFrame
        Columns ``model, family, layers, heads`` then ``{metric}_head, {metric}, {metric}_depth,
        {metric}_above`` per metric; the head is "" and the numbers NaN where the model has no such head
        (all its heads score the same, as a causal model's next_token does).
    """
    rows = []
    for model in dict.fromkeys(heads["model"]):
        part = heads[heads["model"] == model]
        n_layers = int(part["layer"].max()) + 1
        row = {"model": model, "family": str(part["family"].iloc[0]), "layers": n_layers,
               "heads": len(part[["layer", "head"]].drop_duplicates())}
        for metric in metrics:
            scores = part[part["metric"] == metric]
            top = top_heads(scores, metric=metric, n=1) if len(scores) else scores.iloc[:0]
            top = top_heads(scores, metric=metric, n=len(scores)) if len(top) and top["thin"].iloc[0] else top
            top = top[~top["thin"]] if len(top) else top
            best = top.iloc[0] if len(top) else None
            row[f"{metric}_head"] = best["label"] if best is not None else ""
            row[metric] = float(best["value"]) if best is not None else np.nan
            row[f"{metric}_depth"] = relative_depth(int(best["layer"]), n_layers) if best is not None else np.nan
            row[f"{metric}_above"] = (int(((scores["value"] > threshold) & ~_thin(scores)).sum())
                                      if len(scores) else np.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def family_findings(heads: pd.DataFrame, *, threshold: float = 0.5) -> list[str]:
    """Sentences comparing the models' strongest previous-token heads: where they sit by relative depth and
    how many heads look mostly at the previous token, when the report has models of both families."""
    if "prev_token" not in set(heads["metric"]) or heads["family"].nunique() < 2:
        return []
    summary = family_summary(heads, threshold=threshold, metrics=("prev_token",))
    summary = summary[summary["prev_token_head"] != ""]
    if len(summary) < 2:
        return []
    where = "; ".join(f"{r.model} ({r.family}) {r.prev_token_head}, {_pct(r.prev_token)}, at relative depth "
                      f"{r.prev_token_depth:.2f}" for r in summary.itertuples())
    many = ", ".join(f"{int(r.prev_token_above)} of {r.heads} in {r.model}" for r in summary.itertuples())
    share = "half" if threshold == 0.5 else _pct(threshold)
    return [f"The strongest previous-token heads: {where}.",
            f"Heads putting more than {share} of their attention on the previous token: {many}."]


def run_pairs(models: list[str]) -> list[tuple[str, str]]:
    """Pairs of report names that are the same model in two runs (``runA:m`` and ``runB:m``), in order.

    >>> run_pairs(["a:gpt", "bert", "b:gpt", "c:gpt"])
    [('a:gpt', 'b:gpt'), ('a:gpt', 'c:gpt'), ('b:gpt', 'c:gpt')]
    """
    by_model: dict[str, list[str]] = {}
    for name in models:
        if ":" in name:
            by_model.setdefault(name.split(":", 1)[1], []).append(name)
    return [(first, second) for shown in by_model.values() for i, first in enumerate(shown)
            for second in shown[i + 1:]]


def run_differences(heads: pd.DataFrame, first: str, second: str) -> pd.DataFrame:
    """Every head's scores in two runs of one model side by side, with ``difference`` (second - first) and
    ``apart``: both 95% intervals exist and do not overlap.

    Returns
    -------
    DataFrame
        Columns ``metric, layer, head, label, value_a, ci_low_a, ci_high_a, value_b, ci_low_b, ci_high_b,
        difference, apart``, in the table's order.
    """
    keys = ["layer", "head", "label", "metric"]
    columns = [*keys, "value", "ci_low", "ci_high"]
    pair = heads.loc[heads["model"] == first, columns].merge(heads.loc[heads["model"] == second, columns],
                                                              on=keys, suffixes=("_a", "_b"))
    pair["difference"] = pair["value_b"] - pair["value_a"]
    apart = (pair["ci_high_a"] < pair["ci_low_b"]) | (pair["ci_high_b"] < pair["ci_low_a"])
    pair["apart"] = apart.fillna(False).astype(bool)
    order = ["metric", "layer", "head", "label", "value_a", "ci_low_a", "ci_high_a", "value_b", "ci_low_b",
             "ci_high_b", "difference", "apart"]
    return pair[order].astype({"label": str, "metric": str})


def top_heads_text(run: tables.SweepTables, metric: str, n: int = 10) -> str:
    """What ``headscan show`` prints: the `n` most striking heads of each model on `metric`, as a table, with a
    model whose `metric` is 0 or undefined by construction said in one line instead of n rows of zeros.

    >>> heads = pd.DataFrame({"model": ["gpt", "gpt"], "family": "causal", "layer": 0, "head": [0, 1],
    ...     "label": ["L0H0", "L0H1"], "metric": "next_token", "value": 0.0, "ci_low": 0.0, "ci_high": 0.0,
    ...     "count": 5.0, "units": 5.0, "top_unit_share": 0.2})
    >>> print(top_heads_text(tables.SweepTables({"heads": heads}), "next_token"))
    gpt: next_token: a causal model's queries cannot see later tokens, so it is 0 for every head

    ``copying`` (weights.parquet) and ``dla`` / ``dla_positive`` (heads.parquet), which the metric registry does
    not hold, print their highest heads. ``syntax``, for a run with a syntax table, prints each model's best head per relation and direction against
    the fixed-offset baseline (`headscan.syntactic.best_heads`), for the `n` relations with most dependents.
    """
    if metric == "syntax" and "syntax" in run.frames:
        return _syntax_text(run["syntax"], n)
    if metric not in METRICS and metric in _UNREGISTERED and _has(run, *_UNREGISTERED[metric]):
        return _unregistered_text(run, metric, n)
    heads = run.heads
    said, shown = [], []
    for model in dict.fromkeys(heads["model"]):
        rows = heads[(heads["model"] == model) & (heads["metric"] == metric)]
        family = str(heads.loc[heads["model"] == model, "family"].iloc[0])
        provenance = run.provenance.model(model)
        reason = why_structural(rows, metric, family=family, provenance=provenance if provenance.family else None)
        if reason is not None:
            said.append(f"{model}: {metric}: {reason}")
        else:
            shown.append(model)
    top = tables.top_heads(heads[heads["model"].isin(shown)], metric, n)  # checks the metric even if none is shown
    parts = [top.to_string(index=False)] if shown else []
    return "\n".join(parts + said)


# Scores a sweep may write that the metric registry does not hold: metric -> the table it is in.
_UNREGISTERED = {"copying": ("weights", "copying"), "dla": ("heads", "dla"), "dla_positive": ("heads", "dla_positive")}


def _has(run: tables.SweepTables, table: str, metric: str) -> bool:
    return table in run.frames and bool((run.frames[table]["metric"] == metric).any())


def _unregistered_text(run: tables.SweepTables, metric: str, n: int) -> str:
    """`top_heads_text` for ``copying`` (weights.parquet) and ``dla`` / ``dla_positive`` (heads.parquet): the
    highest first, ties to the lower layer, then head."""
    if n < 1:
        raise tables.TablesError(f"top must be at least 1, got {n}")
    table = _UNREGISTERED[metric][0]
    frame = run[table]
    rows = frame[(frame["metric"] == metric) & frame["value"].notna()]
    rows = rows.sort_values(["value", "layer", "head"], ascending=[False, True, True], kind="stable")
    models = {name: i for i, name in enumerate(dict.fromkeys(frame["model"]))}
    rows = rows.groupby("model", sort=False).head(n).sort_values("model", key=lambda c: c.map(models), kind="stable")
    columns = ["model", "label", "layer", "head", "value"] + (["embedding"] if table == "weights" else
                                                               ["ci_low", "ci_high", "count"])
    return rows[columns].to_string(index=False)


def _syntax_text(syntax: pd.DataFrame, n: int) -> str:
    """`top_heads_text` for ``syntax``: the best heads of the `n` relations with most dependents (``all`` first)."""
    from .syntax import best_heads, offset_text, relation_order

    if n < 1:
        raise tables.TablesError(f"top must be at least 1, got {n}")
    best = best_heads(syntax, relations=relation_order(syntax)[:n])
    if best.empty:
        return "syntax: no scored dependent (the sweep scores relations on CoNLL-U treebanks only)"
    models = {name: i for i, name in enumerate(dict.fromkeys(syntax["model"]))}
    best = best.sort_values("model", key=lambda names: names.map(models), kind="stable")  # model by model
    best = best.assign(count=best["count"].astype(int), baseline_offset=best["baseline_offset"].map(offset_text))
    columns = ["model", "relation", "direction", "label", "accuracy", "ci_low", "ci_high", "count", "baseline",
               "baseline_offset", "margin", "beats"]
    return (best[columns].to_string(index=False, float_format=lambda v: f"{v:.3f}")
            + "\nbeats: the 95% interval's low end is above the best fixed-offset baseline (offset d in -3..2)")
