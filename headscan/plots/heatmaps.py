"""Figures of headscan's tables: each function takes a tidy table plus keyword-only options and ``ax=None``,
draws on that Axes and returns it.

Layers are always rows (layer 0 at the top) and heads columns. What a metric's value means comes from the
metric registry (`headscan.metrics.METRICS`): its unit labels the colour bar; a bounded (0-1) metric is drawn
on the one 0-1 colour scale `SHARE_CMAP`, as is every attention matrix, so two such heatmaps compare by colour
alone, while unbounded metrics (entropy in nats, distance in tokens) get their own colour map, so they are
never read against it; and the heads annotated in a heatmap are the metric's striking end (the highest
share of attention, but the lowest entropy: the most focused heads).

This module does not choose what to show (which heads are strongest across a report, which findings to
state): that is `headscan.analysis` and `headscan.report`. It does not save files or pick a backend either;
the report draws on `matplotlib.figure.Figure` objects, which need no pyplot state.

>>> import pandas as pd
>>> heads = pd.DataFrame({"model": "m", "family": "causal", "layer": [0, 0, 1, 1], "head": [0, 1, 0, 1],
...                       "label": ["L0H0", "L0H1", "L1H0", "L1H1"], "metric": "prev_token",
...                       "value": [0.9, 0.1, 0.2, 0.3]})
>>> ax = head_heatmap(heads, model="m", metric="prev_token", annotate_top=1)
>>> [t.get_text() for t in ax.texts]
['0.90']
>>> ax.get_ylabel(), ax.get_xlabel()
('layer', 'head')
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import seaborn as sns

from ..metrics import describe
from .style import (
    DIFFERENCE_CMAP,
    SHARE_CMAP,
    UNBOUNDED_CMAP,
    UNDEFINED_COLOUR,
    axes_or_current,
    layer_by_head,
    select,
    wrapped,
)

__all__ = ["head_heatmap", "attention_matrix", "difference_heatmap", "value_heatmap"]


def _fmt(metric: str, value: float) -> str:
    """A cell's annotation: two decimals, one for unbounded values of 10 or more (distance in tokens)."""
    return f"{value:.1f}" if not describe(metric).bounded and abs(value) >= 10 else f"{value:.2f}"


def head_heatmap(
    heads: pd.DataFrame,
    *,
    model: str,
    metric: str,
    ax=None,
    annotate_top: int = 3,
    vmin: float | None = None,
    vmax: float | None = None,
    cmap: str | None = None,
    cbar: bool = True,
    title: str | None = None,
):
    """Draw one metric of one model as a layer x head heatmap, the strongest heads annotated with their value.

    Parameters
    ----------
    heads : DataFrame
        Rows of ``heads.parquet`` (columns ``model``, ``metric``, ``layer``, ``head``, ``value``); only the
        rows of `model` and `metric` are drawn.
    model, metric : str
        Which model and metric to draw.
    ax : matplotlib Axes, optional
        Where to draw; the current Axes by default.
    annotate_top : int, default 3
        Write the value into the cells of this many of the metric's most striking heads: the highest, or
        the lowest where the registry marks low as striking (entropy: the most focused heads). Ties go to
        the lower layer, then head. Nothing is annotated when every head has the same value: none stands out.
    vmin, vmax : float, optional
        Colour scale limits. Bounded metrics default to 0 and 1 (one scale for all of them); unbounded
        metrics to 0 and their largest value here. Pass the same limits to compare several models.
    cmap : str, optional
        Colour map; `SHARE_CMAP` for bounded metrics, `UNBOUNDED_CMAP` otherwise.
    cbar : bool, default True
        Draw a colour bar labelled with the metric's unit (`headscan.metrics.describe`).
    title : str, optional
        Axes title; ``"{model}: {metric}"`` by default.

    Returns
    -------
    matplotlib Axes
        ``ax.collections[0].get_array()`` holds the (layer, head) grid, NaN where undefined.
    """
    ax = axes_or_current(ax)
    grid = layer_by_head(select(heads, model=model, metric=metric), f"{model}: {metric}")
    share = describe(metric).bounded
    values = grid.to_numpy()
    finite = values[np.isfinite(values)]
    if vmin is None:
        vmin = 0.0
    if vmax is None:
        vmax = 1.0 if share else (float(finite.max()) if finite.size and finite.max() > vmin else vmin + 1.0)
    cmap = cmap or (SHARE_CMAP if share else UNBOUNDED_CMAP)

    ax.set_facecolor(UNDEFINED_COLOUR)
    sns.heatmap(
        grid,
        ax=ax,
        vmin=vmin,
        vmax=vmax,
        cmap=cmap,
        cbar=cbar,
        cbar_kws={"label": wrapped(describe(metric).unit)} if cbar else None,
        linewidths=0.5,
        linecolor="white",
        xticklabels=True,
        yticklabels=True,
    )
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.tick_params(axis="y", rotation=0)
    ax.set_title(title if title is not None else f"{model}: {metric}")

    if annotate_top > 0 and finite.size and finite.max() > finite.min():
        _annotate_striking(ax, grid, metric, annotate_top)
    return ax


def _annotate_striking(ax, grid: pd.DataFrame, metric: str, top: int) -> None:
    """Write the value of the metric's `top` most striking heads into their cells of the heatmap on `ax`."""
    mesh = ax.collections[0]
    # stack() runs layer by layer, head by head, so keep="first" keeps ties for the lower layer, head.
    cells = grid.stack().dropna()
    striking = cells.nlargest if describe(metric).ranks_high() else cells.nsmallest
    for (layer, head), value in striking(top, keep="first").items():
        # Pick the text colour from the cell's own colour so the number stays legible on dark cells.
        r, g, b, _ = mesh.cmap(mesh.norm(value))
        dark = 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.45
        ax.text(
            head + 0.5,
            layer + 0.5,
            _fmt(metric, value),
            ha="center",
            va="center",
            fontsize="small",
            fontweight="bold",
            color="white" if dark else "black",
        )


def attention_matrix(
    tokens: Sequence[str],
    pattern: np.ndarray,
    *,
    title: str | None = None,
    causal: bool = False,
    ax=None,
    cbar: bool = True,
):
    """Draw one head's attention pattern on one sentence, tokens as tick labels.

    Parameters
    ----------
    tokens : sequence of str
        The sentence's tokens, in order, as readable text (`headscan.report.examples.every_layer` decodes
        each one); they are drawn as they are, only a ``$`` escaped.
    pattern : array of shape (q_pos, k_pos)
        Attention weights; row ``q`` is what query ``q`` attends to and sums to 1.
    title : str, optional
        Axes title.
    causal : bool, default False
        Leave the cells above the diagonal (keys after the query, which a causal model cannot see) blank,
        so the triangle reads as a triangle beside a bidirectional model's full square.
    ax : matplotlib Axes, optional
        Where to draw; the current Axes by default.
    cbar : bool, default True
        Draw the shared 0-1 colour bar.

    Returns
    -------
    matplotlib Axes
        Queries are rows (top to bottom), keys columns, on the 0-1 share scale.
    """
    ax = axes_or_current(ax)
    pattern = np.asarray(pattern, dtype=float)
    if pattern.ndim != 2 or pattern.shape[0] != pattern.shape[1] or pattern.shape[0] != len(tokens):
        raise ValueError(
            f"pattern has shape {pattern.shape}, but {len(tokens)} tokens need a square ({len(tokens)}, "
            f"{len(tokens)}) matrix of one head"
        )
    labels = [str(t).replace("$", r"\$") for t in tokens]  # tokens are data: a "$" must not start mathtext
    mask = np.triu(np.ones_like(pattern, dtype=bool), k=1) if causal else None
    ax.set_facecolor("white")
    sns.heatmap(
        pattern,
        ax=ax,
        mask=mask,
        vmin=0.0,
        vmax=1.0,
        cmap=SHARE_CMAP,
        cbar=cbar,
        cbar_kws={"label": "share of attention"} if cbar else None,
        square=True,
        xticklabels=labels,
        yticklabels=labels,
    )
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.tick_params(axis="x", rotation=90)
    ax.tick_params(axis="y", rotation=0)
    if title is not None:
        ax.set_title(title)
    return ax


def difference_heatmap(
    differences: pd.DataFrame,
    *,
    metric: str,
    ax=None,
    limit: float | None = None,
    title: str | None = None,
    cbar: bool = True,
):
    """Draw one metric's difference between two runs of one model (second minus first) as a layer x head
    heatmap on a diverging scale centred on 0, marking with a dot the heads whose 95% intervals do not overlap.

    Parameters
    ----------
    differences : DataFrame
        `headscan.analysis.across.run_differences` of the two runs (columns ``metric, layer, head, difference,
        apart``); only the rows of `metric` are drawn.
    metric : str
        Which metric.
    ax : matplotlib Axes, optional
        Where to draw; the current Axes by default.
    limit : float, optional
        The colour scale runs from -limit to +limit; the largest absolute difference by default.
    title : str, optional
        Axes title; the metric's name by default.
    cbar : bool, default True
        Draw a colour bar labelled with the metric's unit.

    Returns
    -------
    matplotlib Axes
        ``ax.collections[0].get_array()`` holds the (layer, head) differences; ``ax.texts`` the dots.
    """
    ax = axes_or_current(ax)
    rows = select(differences, metric=metric)
    grid = layer_by_head(rows.rename(columns={"difference": "value"}), f"difference of {metric}")
    values = grid.to_numpy()
    finite = np.abs(values[np.isfinite(values)])
    limit = limit if limit is not None else (float(finite.max()) if finite.size and finite.max() > 0 else 1.0)
    ax.set_facecolor(UNDEFINED_COLOUR)
    sns.heatmap(grid, ax=ax, vmin=-limit, vmax=limit, cmap=DIFFERENCE_CMAP, center=0, cbar=cbar,
                cbar_kws={"label": wrapped(f"second - first ({describe(metric).unit})")} if cbar else None,
                linewidths=0.5, linecolor="white", xticklabels=True, yticklabels="auto")
    for row in rows[rows["apart"]].itertuples():
        ax.text(row.head + 0.5, row.layer + 0.5, "\u2022", ha="center", va="center", fontsize="small", color="black")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.tick_params(axis="y", rotation=0)
    ax.set_title(title if title is not None else metric)
    return ax


def value_heatmap(
    rows: pd.DataFrame,
    *,
    model: str,
    label: str,
    ax=None,
    vmin: float = 0.0,
    vmax: float | None = None,
    cmap: str = UNBOUNDED_CMAP,
    center: float | None = None,
    annotate_top: int = 3,
    digits: int = 2,
    cbar: bool = True,
    title: str | None = None,
):
    """Draw any per-head score of one model (a column ``value`` not in the metric registry: an OV copying score,
    a ratio) as a layer x head heatmap, its highest heads annotated.

    Parameters
    ----------
    rows : DataFrame
        One row per head (columns ``model``, ``layer``, ``head``, ``value``); only the rows of `model` are drawn.
    model : str
        Which model.
    label : str
        The colour bar's label: what the value is measured in.
    ax : matplotlib Axes, optional
        Where to draw; the current Axes by default.
    vmin, vmax : float
        Colour scale limits; vmax defaults to the largest value (vmin + 1 when none is larger than vmin).
    cmap : str, default `UNBOUNDED_CMAP`
        Colour map; `SIGNED_CMAP` with ``center=0`` for scores from -1 to 1.
    center : float, optional
        The value at the colour map's centre, for a diverging map.
    annotate_top : int, default 3
        Write the value into the cells of this many of the highest heads (ties to the lower layer, then head);
        none when every head has the same value.
    digits : int, default 2
        Decimals of the annotations.
    cbar : bool, default True
        Draw a colour bar labelled `label`.
    title : str, optional
        Axes title; the model's name by default.

    Returns
    -------
    matplotlib Axes
        ``ax.collections[0].get_array()`` holds the (layer, head) grid, NaN where undefined; ``ax.texts`` the
        annotations, highest first.
    """
    ax = axes_or_current(ax)
    grid = layer_by_head(select(rows, model=model), f"{model}: {label}")
    values = grid.to_numpy()
    finite = values[np.isfinite(values)]
    if vmax is None:
        vmax = float(finite.max()) if finite.size and finite.max() > vmin else vmin + 1.0
    ax.set_facecolor(UNDEFINED_COLOUR)
    sns.heatmap(grid, ax=ax, vmin=vmin, vmax=vmax, cmap=cmap, center=center, cbar=cbar,
                cbar_kws={"label": wrapped(label)} if cbar else None, linewidths=0.5, linecolor="white",
                xticklabels=True, yticklabels="auto")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.tick_params(axis="y", rotation=0)
    ax.set_title(title if title is not None else model)
    if annotate_top > 0 and finite.size and finite.max() > finite.min():
        mesh = ax.collections[0]
        for (layer, head), value in grid.stack().dropna().nlargest(annotate_top, keep="first").items():
            r, g, b, _ = mesh.cmap(mesh.norm(value))
            dark = 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.45
            ax.text(head + 0.5, layer + 0.5, f"{value:.{digits}f}", ha="center", va="center", fontsize="small",
                    fontweight="bold", color="white" if dark else "black")
    return ax
