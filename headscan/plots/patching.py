"""Contrastive patching as a figure: one model's heads, layer by head, coloured by the fraction of the logit
difference each restores. A tidy table (rows of patching.parquet) and keyword-only options in, the Axes out."""

from __future__ import annotations

import pandas as pd
import seaborn as sns

from .style import axes_or_current, select

__all__ = ["patching_heatmap"]


def patching_heatmap(patching: pd.DataFrame, *, model: str, method: str = "denoise", ax=None, annotate_top: int = 3,
                     cbar: bool = True):
    """Draw `model`'s fraction of the logit difference restored (`method` ``denoise``) or destroyed (``noise``)
    per head, every position at once, on a scale centred on 0; the `annotate_top` largest are written in.

    >>> import pandas as pd
    >>> from matplotlib.figure import Figure
    >>> rows = pd.DataFrame({"model": "m", "method": "denoise", "target": "fraction", "position": pd.NA,
    ...                      "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "value": [0.9, 0.0, 0.1, -0.2]})
    >>> ax = patching_heatmap(rows, model="m", ax=Figure().subplots())
    >>> ax.get_ylabel(), [t.get_text() for t in ax.texts]
    ('layer', ['0.90', '0.10', '0.00'])
    """
    ax = axes_or_current(ax)
    rows = select(patching, model=model, method=method, target="fraction")
    rows = rows[rows["position"].isna()]
    grid = rows.pivot(index="layer", columns="head", values="value").astype(float)  # (layer, head)
    limit = max(float(grid.abs().max().max()), 1e-12)
    sns.heatmap(grid, ax=ax, cmap="RdBu_r", vmin=-limit, vmax=limit, cbar=cbar,
                cbar_kws={"label": f"fraction {'restored' if method == 'denoise' else 'destroyed'}"} if cbar else None)
    top = rows.sort_values(["value", "layer", "head"], ascending=[False, True, True], kind="stable").head(annotate_top)
    for row in top.itertuples():
        ax.text(list(grid.columns).index(row.head) + 0.5, list(grid.index).index(row.layer) + 0.5, f"{row.value:.2f}",
                ha="center", va="center", fontsize=7, color="white" if abs(row.value) > 0.6 * limit else "black")
    ax.set(xlabel="head", ylabel="layer", title=f"{model}: {method}")
    return ax
