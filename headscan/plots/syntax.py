"""Syntactic heads as a figure: per relation, each model's best head against the best fixed offset.

Like every plot here, a tidy table (`headscan.analysis.syntax.best_heads`) and keyword-only options in, the
Axes drawn on out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from ..analysis.syntax import offset_text
from .style import axes_or_current, model_palette

__all__ = ["syntax_best_heads", "syntax_legend_handles"]


def syntax_best_heads(
    best: pd.DataFrame,
    *,
    direction: str = "dependent_to_head",
    relations: Sequence[str] | None = None,
    ax=None,
    palette: Mapping[str, tuple] | None = None,
    title: str | None = None,
    label_heads: bool = True,
    legend: bool = True,
):
    """Draw, per relation, each model's best head's accuracy with its 95% interval against the best fixed offset.

    Clark et al. (2019)'s comparison as a figure: relations along x, one slot per model within a relation. A
    light bar in the model's colour is the baseline (the best fixed offset's accuracy, its offset written at
    the bar's foot); the point with its error bar is the best head's accuracy and interval, filled where the
    head beats the baseline (``beats``: the paired difference's interval, cross-fitted where the table records
    it, lies above 0) and hollow where it does not. Each point carries its head's 0-indexed label (``L7H9``).

    Parameters
    ----------
    best : DataFrame
        `headscan.analysis.syntax.best_heads` (columns ``model, relation, direction, label, accuracy, ci_low,
        ci_high, baseline, baseline_offset, beats``); only the rows of `direction` are drawn.
    direction : str, default "dependent_to_head"
        Which direction: ``"dependent_to_head"`` or ``"head_to_dependent"``.
    relations : sequence of str, optional
        The relations along x, in this order; those of `best` in its order by default. A relation a model has
        no row for leaves its slot empty.
    ax : matplotlib Axes, optional
        Where to draw; the current Axes by default.
    palette : mapping of model to colour, optional
        Colours by model; `model_palette` of the table's models by default.
    title : str, optional
        Axes title; the direction by default.
    label_heads : bool, default True
        Write each point's head label above its interval.
    legend : bool, default True
        A legend to the right of the Axes: the models, and how to read a bar, a filled and a hollow point.

    Returns
    -------
    matplotlib Axes
        Per model, in the table's order: ``ax.containers`` holds its baseline bars (a BarContainer whose
        ``datavalues`` are the baselines; label ``"{model} baseline"``), then its intervals (an
        ErrorbarContainer), and ``ax.collections`` one PathCollection labelled with the model's name whose
        ``get_offsets()`` are (x, accuracy), left to right, and whose face is transparent where the head does
        not beat the baseline. Relation i is centred on x = i. ``ax.texts`` are the head labels (``gid`` "head") and the
        baseline offsets (``gid`` "offset").
    """
    ax = axes_or_current(ax)
    rows = best[best["direction"] == direction]
    relations = list(relations) if relations is not None else list(dict.fromkeys(rows["relation"]))
    models = list(dict.fromkeys(best["model"]))
    palette = dict(palette) if palette is not None else model_palette(models)
    slot = 0.8 / max(len(models), 1)
    where = {r: i for i, r in enumerate(relations)}
    rows = rows[rows["relation"].isin(where)]
    rows = rows.iloc[np.argsort(rows["relation"].map(where).to_numpy(), kind="stable")]  # left to right
    drawn = []
    for k, model in enumerate(models):
        part = rows[rows["model"] == model]
        x = part["relation"].map(where).to_numpy(float) - 0.4 + slot * (k + 0.5)
        bars = ax.bar(x, part["baseline"].fillna(0.0).to_numpy(float), width=slot * 0.9,
                      color=palette[model], alpha=0.25, linewidth=0, label=f"{model} baseline")
        drawn.append((model, part, x, bars))
    _intervals_and_points(ax, drawn, palette)
    small = 6.5 if len(models) <= 3 else 5.5
    for model, part, x, _ in drawn:
        _write_offsets_and_labels(ax, part, x, palette[model], fontsize=small, label_heads=label_heads)
    _frame(ax, relations, label_heads=label_heads)
    ax.set_title(title if title is not None else direction.replace("_", " "))
    if legend and drawn:
        ax.legend(handles=syntax_legend_handles([m for m, *_ in drawn], palette), fontsize="small", frameon=False,
                  loc="upper left", bbox_to_anchor=(1.005, 1.0))
    return ax


def _intervals_and_points(ax, drawn: list, palette: Mapping[str, tuple]) -> None:
    """Every model's intervals, then every model's points (filled where the head beats the baseline), so that
    the Axes' containers and collections come model by model."""
    for model, part, x, _ in drawn:
        accuracy = part["accuracy"].to_numpy(float)
        low = np.nan_to_num(accuracy - part["ci_low"].to_numpy(float))
        high = np.nan_to_num(part["ci_high"].to_numpy(float) - accuracy)
        ax.errorbar(x, accuracy, yerr=np.vstack([low, high]), fmt="none", ecolor=palette[model], elinewidth=1.0,
                    capsize=2.0, capthick=1.0)
    for model, part, x, _ in drawn:
        beats = part["beats"].to_numpy(bool)
        faces = [palette[model] if b else "none" for b in beats]
        ax.scatter(x, part["accuracy"].to_numpy(float), s=22, marker="o", facecolors=faces,
                   edgecolors=[palette[model]] * len(x), linewidths=1.1, zorder=3, label=model)


def _write_offsets_and_labels(ax, part: pd.DataFrame, x, colour, *, fontsize: float, label_heads: bool) -> None:
    """The best offset at the foot of each baseline bar and, with `label_heads`, each head's label above its
    interval."""
    for xi, row in zip(x, part.itertuples()):
        if not pd.isna(row.baseline):
            ax.text(xi, 0.012, offset_text(row.baseline_offset), ha="center", va="bottom", fontsize=fontsize,
                    color="0.3", gid="offset")
        if label_heads:
            top = row.ci_high if not pd.isna(row.ci_high) else row.accuracy
            ax.text(xi, min(top + 0.015, 1.0), row.label, ha="center", va="bottom", rotation=90, fontsize=fontsize,
                    color=colour, gid="head")


def _frame(ax, relations: list[str], *, label_heads: bool) -> None:
    """Ticks, limits, grid and y label; a dotted line before "all", the relations pooled."""
    if "all" in relations and len(relations) > 1:
        ax.axvline(relations.index("all") + 0.5, color="0.75", linewidth=0.8, linestyle=":", zorder=0)
    ax.set_xticks(range(len(relations)), relations, rotation=45, ha="right", rotation_mode="anchor")
    ax.set_xlim(-0.6, len(relations) - 0.4)
    ax.set_ylim(0, 1.12 if label_heads else 1.02)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.grid(axis="y", color="0.92", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.set_ylabel("accuracy (share of dependents)")



def syntax_legend_handles(models: Sequence[str], palette: Mapping[str, tuple]) -> list:
    """The legend entries of `syntax_best_heads`: one per model, then how to read a bar, a filled and a hollow
    point; for a figure-level legend over several panels."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Line2D([], [], color=palette[m], marker="o", linestyle="none", markersize=5, label=f"{m}: best head")
               for m in models]
    return handles + [
        Patch(facecolor="0.5", alpha=0.3, label="best fixed offset (offset d at its foot)"),
        Line2D([], [], color="0.3", marker="o", linestyle="none", markersize=5, label="interval above the baseline"),
        Line2D([], [], color="0.3", marker="o", markerfacecolor="none", linestyle="none", markersize=5,
               label="interval reaches the baseline"),
    ]
