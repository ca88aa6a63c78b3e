"""Head families as a figure: the two-dimensional map of one model's heads (`headscan.analysis.families.head_map`),
coloured by layer or by role, with the clusters numbered.

Like every plot here, a tidy table and keyword-only options in, the Axes drawn on out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import colormaps
from matplotlib.colors import Normalize

from .style import axes_or_current, select

__all__ = ["head_map"]


def head_map(mapped: pd.DataFrame, *, model: str, hue: str = "layer", ax=None, label_clusters: bool = True,
             colours: dict | None = None):
    """Draw one model's heads at their MDS coordinates, coloured by `hue`; each cluster of two or more heads is
    numbered at its centre.

    Parameters
    ----------
    mapped : DataFrame
        `headscan.analysis.families.head_map` rows (columns ``model, layer, label, x, y, cluster,
        cluster_size``, and the `hue` column).
    model : str
        Whose heads to draw.
    hue : str, default "layer"
        ``"layer"`` (a continuous colour scale, with a colour bar) or any column of categories, such as
        ``"role"`` or ``"pattern_type"`` (one colour each, with a legend; "" reads "none").
    ax : matplotlib Axes, optional
        Where to draw; the current Axes by default.
    label_clusters : bool, default True
        Write each cluster's number (of clusters of two or more heads) at its members' mean position.
    colours : dict, optional
        Category -> colour for a categorical `hue`; the colorblind palette by default.

    Returns
    -------
    matplotlib Axes
        ``ax.collections``: one PathCollection (``layer``: its ``get_array()`` are the layers) or one per category
        (labelled by it), ``get_offsets()`` the heads' (x, y); ``ax.texts``: the cluster numbers (``gid``
        "cluster").
    """
    ax = axes_or_current(ax)
    rows = select(mapped, model=model)
    if hue == "layer":
        points = ax.scatter(rows["x"], rows["y"], c=rows["layer"], cmap=colormaps["viridis"], s=16,
                            norm=Normalize(rows["layer"].min(), max(rows["layer"].max(), rows["layer"].min() + 1)),
                            edgecolors="none")
        ax.figure.colorbar(points, ax=ax, label="layer", shrink=0.8)
    else:
        kinds = rows[hue].fillna("").astype(str)
        names = list(dict.fromkeys(sorted(kinds, key=lambda k: (k == "", k))))
        palette = colours or dict(zip(names, sns.color_palette("colorblind", len(names))))
        for name in names:
            part = rows[kinds == name]
            ax.scatter(part["x"], part["y"], s=16, color=palette.get(name, "#999999"), label=name or "none",
                       edgecolors="none")
        ax.legend(fontsize="x-small", frameon=False, loc="best", title=hue.replace("_", " "), title_fontsize="x-small")
    if label_clusters:
        for number, part in rows[rows["cluster_size"] > 1].groupby("cluster"):
            ax.text(float(np.mean(part["x"])), float(np.mean(part["y"])), str(int(number)), fontsize=7,
                    ha="center", va="center", weight="bold", gid="cluster",
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.7, "linewidth": 0})
    ax.set_xlabel("MDS 1 (JS distance)")
    ax.set_ylabel("MDS 2")
    ax.set_title(model)
    ax.set_aspect("equal", adjustable="datalim")
    return ax
