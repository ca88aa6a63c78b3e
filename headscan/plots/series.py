"""Figures of heads over training: one metric's trajectory per head across the checkpoints of a series.

Takes the tidy rows `headscan.analysis.series.with_steps` gives (and, optionally, `formation`'s table) and
keyword-only options with ``ax=None``; draws on that Axes and returns it.

>>> import pandas as pd
>>> rows = pd.DataFrame({"series": "s", "layer": [0, 0, 1, 1], "head": 0, "label": ["L0H0", "L0H0", "L1H0", "L1H0"],
...                      "metric": "prev_token", "step": [0, 10, 0, 10], "value": [0.1, 0.9, 0.1, 0.2],
...                      "ci_low": [0.05, 0.85, 0.05, 0.1], "ci_high": [0.2, 0.95, 0.2, 0.3], "chance": 0.1})
>>> import matplotlib.pyplot as plt
>>> fig, ax = plt.subplots()
>>> ax = trajectories(rows, metric="prev_token", ax=ax)
>>> [line.get_label() for line in ax.lines[:2]], ax.lines[0].get_ydata().tolist()
(['L0H0', 'L1H0'], [0.1, 0.9])
>>> plt.close(fig)
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns

from .style import DEPTH_CMAP, axes_or_current, select

__all__ = ["trajectories"]


def trajectories(rows: pd.DataFrame, *, metric: str, series: str | None = None, formed: pd.DataFrame | None = None,
                 threshold: float | None = None, ax=None, title: str | None = None, legend: bool = True):
    """Each head's `metric` against the training step, with its 95% interval as a band, coloured by layer
    (dark the first, yellow the last).

    Parameters
    ----------
    rows : DataFrame
        Rows with ``series, layer, head, label, metric, step, value, ci_low, ci_high`` and, where recorded,
        ``chance`` (`headscan.analysis.series.with_steps`).
    metric : str
        The metric to draw.
    series : str, optional
        The series to draw; default the only one in `rows` (several is a ValueError).
    formed : DataFrame, optional
        `headscan.analysis.series.formation`'s table: each head that forms gets a filled marker at its step,
        on its line.
    threshold : float, optional
        The role's threshold, drawn as a dashed line.
    ax : matplotlib Axes, optional
        Where to draw; the current Axes by default.

    Returns
    -------
    Axes
        ``ax.lines`` holds one line per head (label order by layer, then head), then the mean chance (dotted,
        labelled "chance") and the threshold (dashed) where drawn; the formation markers are the last
        collection, ``ax.collections[-1]``, with one point per formed head.
    """
    ax = axes_or_current(ax)
    part = select(rows, metric=metric)
    names = list(dict.fromkeys(part["series"]))
    if series is None and len(names) > 1:
        raise ValueError(f"trajectories: rows hold several series {names}; pass series=")
    series = names[0] if series is None else series
    part = select(part, series=series).sort_values(["layer", "head", "step"], kind="stable")
    layers = sorted(part["layer"].unique())
    colours = dict(zip(layers, sns.color_palette(DEPTH_CMAP, len(layers))))
    for (layer, _), head in part.groupby(["layer", "head"], sort=True):
        colour = colours[layer]
        ax.plot(head["step"], head["value"], color=colour, label=head["label"].iloc[0], linewidth=1.2)
        ax.fill_between(head["step"].to_numpy(float), head["ci_low"].to_numpy(float), head["ci_high"].to_numpy(float),
                        color=colour, alpha=0.15, linewidth=0)
    if "chance" in part and part["chance"].notna().any():
        chance = part.groupby("step")["chance"].mean()
        ax.plot(chance.index, chance.to_numpy(), color="0.4", linestyle=":", label="chance")
    if threshold is not None:
        ax.axhline(threshold, color="0.3", linestyle="--", linewidth=0.8, label=f"threshold {threshold:g}")
    if formed is not None:
        mine = formed[(formed["series"] == series) & (formed["metric"] == metric) & formed["step"].notna()]
        colour = [colours.get(layer, "k") for layer in mine["layer"]]
        ax.scatter(mine["step"].to_numpy(float), mine["value"].to_numpy(float), s=36, c=colour or None,
                   edgecolors="black", zorder=5, label="forms")
    ax.set_xlabel("training step")
    ax.set_ylabel(metric)
    ax.set_title(title or f"{series}: {metric} over training")
    if legend:
        ax.legend(fontsize="x-small", ncol=int(np.ceil(len(ax.lines) / 12)) or 1, loc="best")
    return ax
