"""What a report states: sentences generated from the numbers, families side by side, runs against each other.

Every function here takes tables and returns DataFrames or sentences, so tests check them number by number.
What a metric is measured in, which end of it is striking and when it is 0 or undefined by construction all
come from the metric registry (through `headscan.analysis.ranking`); nothing here restates them.

This module draws nothing (see `headscan.plots`), lays out nothing (see `headscan.report`) and loads no model.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from ..metrics import describe
from ..tables import ModelProvenance
from .formats import pct
from .ranking import (WIDE_CI, ZERO, all_zero_or_undefined, bounded, ci_is_wide, structural_reason, thin,
                      top_heads)

__all__ = ["findings", "findings_by_model", "relative_depth", "family_summary", "family_findings", "run_pairs",
           "run_differences"]

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


def _interval(row: pd.Series) -> str:
    if pd.isna(row["ci_low"]) or pd.isna(row["ci_high"]):
        return ""
    return f" (95% interval {pct(row['ci_low'])} to {pct(row['ci_high'])})"


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
            out.append(f"In {model}, {best['label']} puts {pct(best['value'])} of its attention on {_ON[metric]}"
                       f"{_interval(best) if best['wide'] else ''}.")
    for metric in [m for m in _COUNTED if m in metrics]:
        part = rows[rows["metric"] == metric]
        many = int(((part["value"] > threshold) & ~thin(part)).sum())
        if many:
            share = "half" if threshold == 0.5 else pct(threshold)
            out.append(f"{many} of {n_heads} heads in {model} put more than {share} of their attention on "
                       f"{_COUNTED[metric]}.")

    for metric in metrics:
        part = rows[rows["metric"] == metric]
        values = part["value"]
        reason = structural_reason(metric, family, provenance)
        if reason is not None and all_zero_or_undefined(values):
            out.append(f"{model}'s `{metric}`: {reason}.")
        elif reason is not None:
            worst = part.loc[values.abs().fillna(-1).idxmax()]
            out.append(f"Check the sweep: {worst['label']} of {model} scores {worst['value']:.3g} on `{metric}`, "
                       f"yet {reason}.")
        elif values.isna().all():
            out.append(f"{model}'s `{metric}` is undefined for every head: no query of the corpus counts for it.")
        elif bounded(metric) and values.notna().all() and (values.abs() < ZERO).all():
            out.append(f"{model}'s `{metric}` is 0 for every head.")

    if "entropy" in metrics:
        by_layer = rows[rows["metric"] == "entropy"].groupby("layer")["value"].mean().dropna()
        unit = describe("entropy").unit
        if len(by_layer) > 1:
            out.append(f"In {model}, attention is most focused in layer {int(by_layer.idxmin())} (mean entropy "
                       f"{by_layer.min():.2f} {unit}) and broadest in layer {int(by_layer.idxmax())} "
                       f"({by_layer.max():.2f} {unit}).")

    shares = rows[rows["metric"].map(bounded).astype(bool) & rows["value"].notna()]
    wide = int(ci_is_wide(shares).sum())
    if wide:
        out.append(f"{wide} of {len(shares)} 0-1 scores of {model} have a 95% interval wider than {WIDE_CI:g}; "
                   "a larger corpus would narrow them.")
    defined = rows[rows["value"].notna()]
    n_thin = int(thin(defined).sum())  # not `thin`: that name is the function, in the whole of this one
    if n_thin:
        out.append(f"{n_thin} of {len(defined)} scores of {model} rest on thin support (too few segments or "
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
                pair = pair[pair["metric"].map(bounded).astype(bool)]
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
            row[f"{metric}_above"] = (int(((scores["value"] > threshold) & ~thin(scores)).sum())
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
    where = "; ".join(f"{r.model} ({r.family}) {r.prev_token_head}, {pct(r.prev_token)}, at relative depth "
                      f"{r.prev_token_depth:.2f}" for r in summary.itertuples())
    many = ", ".join(f"{int(r.prev_token_above)} of {r.heads} in {r.model}" for r in summary.itertuples())
    share = "half" if threshold == 0.5 else pct(threshold)
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
