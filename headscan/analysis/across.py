"""What holds across models and runs: families side by side, and runs of one model against each other.

Every function here takes tables and returns DataFrames or sentences. This module draws nothing and loads no
model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .claims import has_verdicts, supported
from .formats import pct
from .ranking import bounded, top_heads
from .roles import role_for

__all__ = ["agreement_sentences", "relative_depth", "family_summary", "family_findings", "run_pairs",
           "run_differences"]


def agreement_sentences(heads: pd.DataFrame) -> list[str]:
    """A sentence for each pair of runs of the same model (`run_pairs`): how far apart their 0-1 scores are."""
    out = []
    for first, second in run_pairs(list(dict.fromkeys(heads["model"]))):
        keys = ["layer", "head", "label", "metric"]
        pair = heads[heads["model"] == first].merge(heads[heads["model"] == second], on=keys, suffixes=("_a", "_b"))
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


def relative_depth(layer, n_layers):
    """A layer's relative depth: 0 for the first layer, 1 for the last (0 in a one-layer model).

    >>> relative_depth(2, 6), relative_depth(29, 30)
    (0.4, 1.0)
    """
    return layer / (n_layers - 1) if n_layers > 1 else 0 * layer


def family_summary(heads: pd.DataFrame, *, metrics: tuple[str, ...] = ("prev_token", "next_token")) -> pd.DataFrame:
    """Per model: its family, shape and, for each of `metrics`, its strongest head among the rows that may carry
    a claim (`headscan.analysis.claims`), that head's value, chance and relative depth, and how many heads reach
    the metric's role threshold beyond chance (`headscan.analysis.roles.role_for`).

    Returns
    -------
    DataFrame
        Columns ``model, family, layers, heads`` then ``{metric}_head, {metric}, {metric}_chance,
        {metric}_depth, {metric}_above`` per metric; the head is "" and the numbers NaN where the model has no
        such head (all its heads score the same, as a causal model's next_token does, or none is beyond chance).
    """
    rows = []
    for model in dict.fromkeys(heads["model"]):
        part = heads[heads["model"] == model]
        n_layers = int(part["layer"].max()) + 1
        row = {"model": model, "family": str(part["family"].iloc[0]), "layers": n_layers,
               "heads": len(part[["layer", "head"]].drop_duplicates())}
        for metric in metrics:
            scores = part[part["metric"] == metric]
            top = top_heads(scores, metric=metric, n=len(scores)) if len(scores) else scores.iloc[:0]
            top = top[top["unsupported"] == ""] if len(top) else top
            best = top.iloc[0] if len(top) else None
            row[f"{metric}_head"] = best["label"] if best is not None else ""
            row[metric] = float(best["value"]) if best is not None else np.nan
            row[f"{metric}_chance"] = float(best["chance"]) if best is not None else np.nan
            row[f"{metric}_depth"] = relative_depth(int(best["layer"]), n_layers) if best is not None else np.nan
            threshold = role_for(metric).threshold
            row[f"{metric}_above"] = (int(((scores["value"] >= threshold) & supported(scores)).sum())
                                      if len(scores) else np.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def family_findings(heads: pd.DataFrame) -> list[str]:
    """Sentences comparing the models' strongest previous-token heads (beyond chance, not thin): where they sit
    by relative depth and how many previous-token heads each model has, when the report has models of both
    families."""
    if "prev_token" not in set(heads["metric"]) or heads["family"].nunique() < 2:
        return []
    summary = family_summary(heads, metrics=("prev_token",))
    summary = summary[summary["prev_token_head"] != ""]
    if len(summary) < 2:
        return []
    where = "; ".join(f"{r.model} ({r.family}) {r.prev_token_head}, {pct(r.prev_token)} (chance "
                      f"{pct(r.prev_token_chance)}), at relative depth {r.prev_token_depth:.2f}"
                      for r in summary.itertuples())
    many = ", ".join(f"{int(r.prev_token_above)} of {r.heads} in {r.model}" for r in summary.itertuples())
    return [f"The strongest previous-token heads: {where}.",
            f"Previous-token heads ({role_for('prev_token').rule(has_verdicts(heads))}): {many}."]


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
