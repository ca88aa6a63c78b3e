"""Figures of which heads need the whole context: the key/value budget curve, and per-head scores against each
other (retrieval against streaming, induction, copying).

Each function takes a tidy table (`headscan.analysis.whole_context`'s) and keyword-only options with ``ax=None``,
draws on that Axes and returns it. The retrieval and streaming heatmaps are `headscan.plots.heatmaps.head_heatmap`.

>>> import pandas as pd
>>> budget = pd.DataFrame({"model": "m", "k": [0, 1, 2], "full_share": [0.0, 0.5, 1.0], "kept": [0.8, 0.95, 1.0],
...                        "kept_low": [0.7, 0.9, 1.0], "kept_high": [0.85, 0.97, 1.0], "memory": [0.2, 0.6, 1.0]})
>>> ax = kv_budget_curve(budget)
>>> ax.lines[0].get_ydata().tolist(), ax.get_xlabel()
([0.8, 0.95, 1.0], 'share of key/value heads keeping the whole context')
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .style import axes_or_current

__all__ = ["kv_budget_curve", "score_scatter"]


def kv_budget_curve(budget: pd.DataFrame, *, palette: dict | None = None, ax=None, memory: bool = True,
                    title: str | None = None):
    """The share of attention mass kept (y) as a growing share of key/value heads keeps the whole context (x),
    one line per model with its conservative band; with `memory`, each model's cache memory as a dashed line.

    Returns the Axes; ``ax.lines`` holds the mass lines first (one per model), then the memory lines.
    """
    ax = axes_or_current(ax)
    models = list(dict.fromkeys(budget["model"]))
    colours = palette or {}
    for model in models:
        part = budget[budget["model"] == model]
        colour = colours.get(model)
        line, = ax.plot(part["full_share"], part["kept"], label=f"{model}: attention kept", color=colour)
        ax.fill_between(part["full_share"], part["kept_low"], part["kept_high"], color=line.get_color(), alpha=0.2,
                        linewidth=0)
    if memory:
        for line, model in zip(list(ax.lines), models):
            part = budget[budget["model"] == model]
            ax.plot(part["full_share"], part["memory"], linestyle="--", color=line.get_color(),
                    label=f"{model}: cache memory")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("share of key/value heads keeping the whole context")
    ax.set_ylabel("share of attention mass kept; of a full cache")
    ax.legend(loc="lower right", fontsize="small")
    ax.set_title(title or "Key/value budget: heads by streaming mass")
    return ax


def score_scatter(wide: pd.DataFrame, *, x: str, y: str, model: str, ax=None, label_top: int = 3,
                  title: str | None = None):
    """One model's heads as points, score `x` against score `y` (columns of `wide`, one row per head with a
    ``label``), the `label_top` highest on `y` labelled.

    Returns the Axes; ``ax.collections[0].get_offsets()`` holds the points.
    """
    ax = axes_or_current(ax)
    part = wide[wide["model"] == model].dropna(subset=[x, y])
    ax.scatter(part[x], part[y], s=12, alpha=0.7)
    for row in part.nlargest(label_top, y).itertuples():
        ax.annotate(row.label, (getattr(row, x), getattr(row, y)), fontsize="x-small", xytext=(3, 3),
                    textcoords="offset points")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if len(part) and np.isfinite(part[y]).any():
        ax.set_ylim(bottom=min(0.0, float(part[y].min())))
    ax.set_title(title or f"{model}: {y} against {x}")
    return ax
