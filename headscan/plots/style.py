"""What every figure shares: colour maps, one colour per model, the Axes to draw on, and the rows to draw.

What a metric's value means (its unit, its bounds, its striking end) comes from the registry through
`headscan.metrics.describe`; the colour maps here put every bounded (0-1) metric on one scale.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import numpy as np
import pandas as pd
import seaborn as sns

__all__ = ["SHARE_CMAP", "UNBOUNDED_CMAP", "UNDEFINED_COLOUR", "DIFFERENCE_CMAP", "SIGNED_CMAP", "DEPTH_CMAP",
           "model_palette", "axes_or_current", "select", "layer_by_head", "wrapped"]

SHARE_CMAP = "rocket_r"  # light = little attention, dark = all of it: reads in print and in grey
UNBOUNDED_CMAP = "mako_r"  # a different hue, so nats or tokens are never read against the share scale
UNDEFINED_COLOUR = "#d9d9d9"  # cells where a metric is undefined (NaN) show the axes background
DIFFERENCE_CMAP = "vlag"  # blue below 0, red above: run B minus run A
SIGNED_CMAP = "vlag"  # scores from -1 to 1 (OV copying): blue below 0, white at 0, red above
DEPTH_CMAP = "viridis"  # layers coloured by depth: dark the first layer, yellow the last


def wrapped(label: str, width: int = 24) -> str:
    """A colour-bar label broken into lines of about `width` characters, so it fits beside a short heatmap."""
    return textwrap.fill(label, width)


def model_palette(models: Sequence[str]) -> dict[str, tuple]:
    """One colour per model, in order, from seaborn's colour-blind-safe palette.

    Pass the same palette to every figure of a report so that a model keeps its colour throughout.
    """
    models = list(dict.fromkeys(models))
    colours = sns.color_palette("colorblind", max(len(models), 1))
    return dict(zip(models, colours))


def axes_or_current(ax):
    if ax is None:
        import matplotlib.pyplot as plt  # only when the caller gave no Axes, as seaborn does

        ax = plt.gca()
    return ax


def select(frame: pd.DataFrame, **conditions) -> pd.DataFrame:
    """Rows of `frame` matching every column == value; an empty result names what was available."""
    mask = np.ones(len(frame), dtype=bool)
    for column, value in conditions.items():
        mask &= (frame[column] == value).to_numpy()
    rows = frame[mask]
    if rows.empty:
        available = {column: sorted(map(str, frame[column].unique())) for column in conditions}
        asked = ", ".join(f"{column}={value!r}" for column, value in conditions.items())
        raise ValueError(f"no rows with {asked}; the table has {available}")
    return rows


def layer_by_head(rows: pd.DataFrame, what: str) -> pd.DataFrame:
    if rows.duplicated(["layer", "head"]).any():
        raise ValueError(
            f"{what}: several rows per (layer, head); pass one run's table, or rename the models of each "
            "run apart (headscan.analysis.runs.compare_runs does this as 'run:model')"
        )
    grid = rows.pivot(index="layer", columns="head", values="value")
    # Every layer and head gets a cell, even one with no row, so the grid shows the model's real shape.
    return grid.reindex(
        index=range(int(rows["layer"].max()) + 1), columns=range(int(rows["head"].max()) + 1)
    ).astype(float)
