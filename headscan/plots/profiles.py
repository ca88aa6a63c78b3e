"""Charts of heads across offsets, metrics, depth and positions: offset profiles, previous- against next-token
scores, entropy by relative depth, a metric along the context layer by layer, attention- against value-weighted
shares. Like `headscan.plots.heatmaps` (layer x head matrices), each function takes a tidy table plus
keyword-only options and ``ax=None``, draws on that Axes and returns it.

This module does not choose what to show (see `headscan.analysis` and `headscan.report`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import seaborn as sns

from ..metrics import describe
from .style import DEPTH_CMAP, axes_or_current, model_palette, select

__all__ = ["offset_profiles", "prev_next_scatter", "entropy_by_depth", "position_profiles", "value_weighting_by_depth",
           "value_weighting_scatter"]


def offset_profiles(
    offsets: pd.DataFrame,
    *,
    model: str,
    heads: Sequence[str],
    ax=None,
    title: str | None = None,
    intervals: bool = True,
):
    """Draw mean attention against relative offset for a few heads of one model.

    Parameters
    ----------
    offsets : DataFrame
        Rows of ``offsets.parquet`` (columns ``model``, ``label``, ``offset``, ``value`` and, for the
        intervals, ``ci_low`` and ``ci_high``).
    model : str
        Which model.
    heads : sequence of str
        Head labels (``"L0H2"``) to draw, one line each, in this order.
    ax : matplotlib Axes, optional
        Where to draw; the current Axes by default.
    title : str, optional
        Axes title; the model's name by default.
    intervals : bool, default True
        Shade each line's 95% interval where the table has one.

    Returns
    -------
    matplotlib Axes
        ``ax.lines[i]`` is head ``heads[i]``: x the offset d (key = query + d), y its mean attention.
    """
    ax = axes_or_current(ax)
    rows = select(offsets, model=model)
    colours = sns.color_palette("colorblind", max(len(heads), 1))
    for label, colour in zip(heads, colours):
        line = select(rows, label=label).sort_values("offset")
        ax.plot(line["offset"], line["value"], marker="o", markersize=3, color=colour, label=label)
        if intervals and {"ci_low", "ci_high"} <= set(line.columns) and line["ci_low"].notna().any():
            ax.fill_between(line["offset"], line["ci_low"], line["ci_high"], color=colour, alpha=0.3, linewidth=0.6,
                            edgecolor=colour)
    span = rows["offset"].abs().max()
    ax.set_xlim(-span - 0.5, span + 0.5)
    ax.set_xticks(range(-span, span + 1, 2 if span > 6 else 1))
    ax.set_ylim(0, 1.02)
    ax.axvline(0, color="0.7", linewidth=0.8, zorder=0)
    ax.grid(axis="y", color="0.92", linewidth=0.6)
    ax.set_xlabel("offset d (key = query + d)")
    ax.set_ylabel("mean attention")
    ax.set_title(title if title is not None else model)
    if heads:
        ax.legend(fontsize="small", frameon=False)
    return ax


def prev_next_scatter(
    heads: pd.DataFrame,
    *,
    ax=None,
    x: str = "prev_token",
    y: str = "next_token",
    palette: Mapping[str, tuple] | None = None,
    ci_threshold: float = 0.1,
    label_top: bool = True,
):
    """Draw each head's previous-token share against its next-token share, one colour per model.

    A causal model cannot look ahead: its heads' next-token shares are all 0, so they are drawn in a strip
    below the axis rather than piled on it; a bidirectional model's heads spread over both axes. The dashed
    line x + y = 1 is the most a head can put on its two neighbours together.

    Parameters
    ----------
    heads : DataFrame
        Rows of ``heads.parquet`` with metrics `x` and `y` for every model to draw.
    ax : matplotlib Axes, optional
        Where to draw; the current Axes by default.
    x, y : str, default "prev_token", "next_token"
        The metrics on each axis.
    palette : mapping of model to colour, optional
        Colours by model; `model_palette` of the table's models by default.
    ci_threshold : float, default 0.1
        Draw a head's 95% interval as an error bar where it is wider than this.
    label_top : bool, default True
        Write the label of each model's most striking head on each axis beside its point.

    Returns
    -------
    matplotlib Axes
        One scatter collection per model, in the table's order: ``ax.collections[i].get_offsets()`` are the
        (x, y) scores of model i's heads, ordered by layer then head. A model whose `y` is 0 for every head
        (a causal model's next_token) is drawn in a strip below the axis, y jittered, instead of on it.
    """
    ax = axes_or_current(ax)
    models = list(dict.fromkeys(heads["model"]))
    palette = dict(palette) if palette is not None else model_palette(models)
    scattered = [drawn for model in models
                 if (drawn := _scatter_model(ax, heads, model, x, y, palette[model])) is not None]
    strip = any(flat for _, _, flat in scattered)
    # Error bars after every scatter, so collections[i] stays model i's points.
    for model, wide, flat in scattered:
        if ("ci_low", x) in wide and not flat:
            _error_bars(ax, wide, x, y, ci_threshold, palette[model])
    if label_top:
        for model, wide, flat in scattered:
            _label_striking(ax, wide, x, y, flat, palette[model])
    if {x, y} == {"prev_token", "next_token"}:
        # No head can put more than all of its attention on its two neighbours: x + y <= 1.
        ax.plot([0, 1], [1, 0], color="0.6", linewidth=0.8, linestyle="--", zorder=0,
                label="x + y = 1: all attention on the two neighbours\n(no head can lie above it)")
    bottom = -0.14 if strip else -0.02
    if strip:
        ax.axhspan(bottom, -0.03, color="0.95", zorder=-1, linewidth=0)
        ax.axhline(0, color="0.8", linewidth=0.6, zorder=0)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(bottom, 1.02)
    ax.set_aspect("equal")
    ax.set_xlabel(f"{x} ({describe(x).unit})")
    ax.set_ylabel(f"{y} ({describe(y).unit})")
    if scattered:
        ax.legend(fontsize="small", frameon=False, loc="upper right")
    return ax


def _scatter_model(ax, heads: pd.DataFrame, model: str, x: str, y: str, colour) -> tuple | None:
    """Scatter `model`'s heads, `x` against `y`: (model, wide table, drawn in the strip?); None if a metric lacks."""
    rows = heads[(heads["model"] == model) & heads["metric"].isin([x, y])]
    if not {x, y} <= set(rows["metric"]):
        return None
    wide = rows.pivot(index=["layer", "head", "label"], columns="metric",
                      values=["value", "ci_low", "ci_high"] if "ci_low" in rows else ["value"])
    wide = wide.sort_index()
    family = rows["family"].iloc[0] if "family" in rows else ""
    marker = "^" if family == "bidirectional" else "o"
    ys = wide[("value", y)].to_numpy(dtype=float)
    # A model whose y is 0 for every head (a causal model's next_token) would pile every point on the x axis:
    # it goes to a strip below the axis instead, jittered (seeded) so that its points can be told apart.
    flat = len(ys) > 1 and not np.nan_to_num(ys).any()
    if flat:
        ys = -0.085 + np.random.default_rng(0).uniform(-0.035, 0.035, len(ys))
    label = (f"{model} ({family})" if family else model) + (f", {y} 0 for every head" if flat else "")
    ax.scatter(wide[("value", x)], ys, color=colour, marker=marker, s=22, alpha=0.8, edgecolors="none", label=label)
    return model, wide, flat


def _error_bars(ax, wide: pd.DataFrame, x: str, y: str, ci_threshold: float, colour) -> None:
    """Error bars for the heads whose interval on either axis is wider than `ci_threshold`."""
    wide_x, wide_y = (((wide[("ci_high", m)] - wide[("ci_low", m)]) > ci_threshold).fillna(False) for m in (x, y))
    show = wide_x | wide_y
    if show.any():
        part = wide[show]
        xerr = np.vstack([part[("value", x)] - part[("ci_low", x)], part[("ci_high", x)] - part[("value", x)]])
        yerr = np.vstack([part[("value", y)] - part[("ci_low", y)], part[("ci_high", y)] - part[("value", y)]])
        ax.errorbar(part[("value", x)], part[("value", y)], xerr=np.where(wide_x[show].to_numpy(), xerr, 0),
                    yerr=np.where(wide_y[show].to_numpy(), yerr, 0), fmt="none", ecolor=colour, elinewidth=0.8,
                    alpha=0.6)


def _label_striking(ax, wide: pd.DataFrame, x: str, y: str, flat: bool, colour) -> None:
    """The label of the model's most striking head on each axis (on `x` only for a model in the strip)."""
    for metric in (x,) if flat else (x, y):
        values = wide[("value", metric)]
        if values.notna().any() and values.max() > values.min():
            key = values.idxmax() if describe(metric).ranks_high() else values.idxmin()
            at_y = -0.085 if flat else wide.loc[key, ("value", y)]
            ax.annotate(key[2], (wide.loc[key, ("value", x)], at_y), xytext=(4, 4),
                        textcoords="offset points", fontsize="x-small", color=colour)


def entropy_by_depth(
    heads: pd.DataFrame,
    *,
    ax=None,
    metric: str = "entropy",
    palette: Mapping[str, tuple] | None = None,
):
    """Draw each model's attention entropy by relative depth: every head as a dot, the layer mean as a line.

    Relative depth is layer / (layers - 1): 0 for the first layer, 1 for the last, so a 6-layer model is
    compared with a 30-layer one over its whole depth, not with its first 6 layers. Depth runs down the y
    axis (the first layer at the top), as in the heatmaps.

    Parameters
    ----------
    heads : DataFrame
        Rows of ``heads.parquet`` with `metric` for every model to draw.
    ax : matplotlib Axes, optional
        Where to draw; the current Axes by default.
    metric : str, default "entropy"
        ``"entropy"`` (nats) or ``"entropy_norm"`` (divided by the entropy of uniform attention, 0-1).
    palette : mapping of model to colour, optional
        Colours by model; `model_palette` of the table's models by default.

    Returns
    -------
    matplotlib Axes
        ``ax.lines[i]`` is model i's mean over heads: x the mean entropy, y the layer's relative depth.
    """
    ax = axes_or_current(ax)
    rows = heads[heads["metric"] == metric]
    if rows.empty:
        raise ValueError(f"no rows with metric={metric!r}; the table has {sorted(heads['metric'].unique())}")
    models = list(dict.fromkeys(rows["model"]))
    palette = dict(palette) if palette is not None else model_palette(models)

    def depth(part):
        n_layers = int(heads.loc[heads["model"] == part["model"].iloc[0], "layer"].max()) + 1
        return part["layer"] / max(n_layers - 1, 1)

    for model in models:
        part = rows[rows["model"] == model]
        means = part.groupby("layer")["value"].mean()
        n_layers = int(heads.loc[heads["model"] == model, "layer"].max()) + 1
        ax.plot(means.to_numpy(), means.index.to_numpy() / max(n_layers - 1, 1), marker="o", markersize=3.5,
                color=palette[model], label=f"{model} ({n_layers} layers)")
    # Individual heads after the lines, so ax.lines stays one line per model.
    for model in models:
        part = rows[rows["model"] == model]
        ax.scatter(part["value"], depth(part), color=palette[model], s=8, alpha=0.35, edgecolors="none")
    ax.set_ylim(1.04, -0.04)  # the first layer at the top, as in the heatmaps
    ax.set_ylabel("relative depth (0 first layer, 1 last)")
    ax.set_xlabel(f"{metric} ({describe(metric).unit})")
    ax.set_title(f"attention {metric} by relative depth (line: mean over a layer's heads)")
    ax.legend(fontsize="small", frameon=False)
    return ax


def position_profiles(
    profiles: pd.DataFrame,
    *,
    model: str,
    ax=None,
    ylabel: str = "value",
    title: str | None = None,
    cmap: str = DEPTH_CMAP,
    colorbar: bool = True,
    share: bool = False,
    chance: pd.DataFrame | None = None,
):
    """Draw a metric against query position for one model, one line per layer (the mean over its heads),
    coloured by depth, on a log2 axis of position buckets, with the metric's chance level beside them.

    Parameters
    ----------
    profiles : DataFrame
        `headscan.analysis.positions.layer_profiles` of one metric (columns ``model, layer, layers, bucket, value``).
        Bucket 0 (position 0 alone) has no place on a log axis and is left out.
    model : str
        Which model.
    ax : matplotlib Axes, optional
        Where to draw; the current Axes by default.
    ylabel : str, default "value"
        The y axis label: what the metric is measured in.
    title : str, optional
        Axes title; the model's name by default.
    cmap : str, default `DEPTH_CMAP`
        Colour map of depth: layer 0 at its low end, the last layer at its high end.
    colorbar : bool, default True
        A colour bar of layers beside the Axes.
    share : bool, default False
        The metric is a share of attention: the y axis runs from 0 to 1.
    chance : DataFrame, optional
        `headscan.analysis.positions.chance_profile` of the metric (columns ``model, bucket, chance``): drawn as
        a dashed black line labelled "chance (uniform attention)" after the layers' lines.

    Returns
    -------
    matplotlib Axes
        ``ax.lines[i]`` is layer i (in the table's order of layers): x the bucket's first position, y the mean;
        the chance line, where drawn, comes last.
    """
    import matplotlib as mpl

    ax = axes_or_current(ax)
    rows = select(profiles, model=model)
    rows = rows[rows["bucket"] >= 1]
    n_layers = int(rows["layers"].max()) if len(rows) else 1
    colours = mpl.colormaps[cmap]
    norm = mpl.colors.Normalize(0, max(n_layers - 1, 1))
    for layer, line in rows.groupby("layer", sort=True):
        line = line.sort_values("bucket")
        ax.plot(line["bucket"], line["value"], color=colours(norm(layer)), linewidth=1.1, marker="o", markersize=2.2,
                label=f"layer {layer}")
    if chance is not None and (chance["model"] == model).any():  # tables written before chance have none
        line = select(chance, model=model)
        line = line[line["bucket"] >= 1].sort_values("bucket")
        if len(line):
            ax.plot(line["bucket"], line["chance"], color="black", linestyle="--", linewidth=1.0,
                    label="chance (uniform attention)")
    ax.set_xscale("log", base=2)
    if len(rows):
        ticks = sorted(rows["bucket"].unique())
        ax.set_xticks(ticks, [str(int(t)) for t in ticks])
        ax.minorticks_off()
    if share:
        ax.set_ylim(0, 1.02)
    else:
        ax.set_ylim(bottom=0)
    ax.grid(axis="y", color="0.92", linewidth=0.6)
    ax.set_xlabel("query position (bucket b: positions b to 2b - 1)")
    ax.set_ylabel(ylabel)
    ax.set_title(title if title is not None else model)
    if colorbar:
        bar = ax.figure.colorbar(mpl.cm.ScalarMappable(norm=norm, cmap=colours), ax=ax, pad=0.02, fraction=0.05)
        bar.set_label("layer")
        bar.ax.invert_yaxis()  # layer 0 at the top, as in the heatmaps
    return ax


def _share_limit(values: pd.DataFrame) -> float:
    """The top of a share axis: 1 (the whole 0-1 scale) unless every value is below 0.5, then a little above the
    largest, so that a small sink ([SEP] at a few percent) is not drawn as a flat line on the floor."""
    largest = float(np.nanmax(values.to_numpy(float))) if values.size and np.isfinite(values.to_numpy(float)).any() \
        else 1.0
    return 1.02 if largest >= 0.5 else max(largest * 1.15, 0.01)


def value_weighting_by_depth(
    pairs: pd.DataFrame,
    *,
    ax=None,
    palette: Mapping[str, tuple] | None = None,
    metric: str = "first_token",
    title: str | None = None,
):
    """Draw each model's share on a sink by relative depth, attention-weighted (solid) and value-weighted
    (dashed): how much of the sink survives once each key counts by the norm of what it moves.

    Parameters
    ----------
    pairs : DataFrame
        `headscan.analysis.movement.layer_pairs` (columns ``model, layer, depth, attention, value_weighted``).
    ax : matplotlib Axes, optional
        Where to draw; the current Axes by default.
    palette : mapping of model to colour, optional
        Colours by model; `model_palette` of the table's models by default.
    metric : str, default "first_token"
        The metric the pairs are of, for the axis label and title.
    title : str, optional
        Axes title; one naming the metric by default.

    Returns
    -------
    matplotlib Axes
        For model i (in table order), ``ax.lines[2 * i]`` is its attention-weighted layer means and
        ``ax.lines[2 * i + 1]`` its value-weighted ones: x relative depth, y the mean share.
    """
    ax = axes_or_current(ax)
    models = list(dict.fromkeys(pairs["model"]))
    palette = dict(palette) if palette is not None else model_palette(models)
    for model in models:
        part = pairs[pairs["model"] == model].sort_values("layer")
        ax.plot(part["depth"], part["attention"], color=palette[model], marker="o", markersize=3, linewidth=1.3,
                label=f"{model}: attention-weighted")
        ax.plot(part["depth"], part["value_weighted"], color=palette[model], marker="s", markersize=3,
                linewidth=1.3, linestyle="--", label=f"{model}: value-weighted")
    ax.set_xlim(-0.03, 1.03)
    ax.set_ylim(0, _share_limit(pairs[["attention", "value_weighted"]]))
    ax.grid(axis="y", color="0.92", linewidth=0.6)
    ax.set_xlabel("relative depth (layer / (layers - 1): 0 first layer, 1 last)")
    ax.set_ylabel(f"{metric}: mean share over the layer's heads")
    ax.set_title(title if title is not None else f"{metric}: attention-weighted against value-weighted")
    if models:
        ax.legend(fontsize="small", frameon=False, loc="upper right")
    return ax


def value_weighting_scatter(
    both: pd.DataFrame,
    *,
    ax=None,
    palette: Mapping[str, tuple] | None = None,
    metric: str = "first_token",
    label_top: int = 1,
):
    """Draw each head's attention-weighted share against its value-weighted share, one colour per model, with
    the diagonal (no change) dashed; a sink that moves little lies far below it.

    Parameters
    ----------
    both : DataFrame
        `headscan.analysis.movement.paired` (columns ``model, family, label, attention, value_weighted``).
    ax : matplotlib Axes, optional
        Where to draw; the current Axes by default.
    palette : mapping of model to colour, optional
        Colours by model; `model_palette` of the table's models by default.
    metric : str, default "first_token"
        The metric, for the axis labels.
    label_top : int, default 1
        Label each model's this many heads that fall most (attention-weighted minus value-weighted).

    Returns
    -------
    matplotlib Axes
        ``ax.collections[i].get_offsets()`` are model i's (attention, value-weighted) points, by layer then
        head; ``ax.texts`` the labels of the heads that fall most.
    """
    ax = axes_or_current(ax)
    models = list(dict.fromkeys(both["model"]))
    palette = dict(palette) if palette is not None else model_palette(models)
    for model in models:
        part = both[both["model"] == model]
        family = str(part["family"].iloc[0]) if "family" in part else ""
        ax.scatter(part["attention"], part["value_weighted"], color=palette[model], s=14, alpha=0.75,
                   edgecolors="none", marker="^" if family == "bidirectional" else "o",
                   label=f"{model} ({family})" if family else model)
    top = _share_limit(both[["attention", "value_weighted"]])
    for model in models:
        part = both[both["model"] == model]
        fall = (part["attention"] - part["value_weighted"]).nlargest(label_top, keep="first")
        for i in fall.index[fall > 0]:
            right = part.loc[i, "attention"] > 0.8 * top  # near the right edge: the label goes left of its point
            ax.annotate(part.loc[i, "label"], (part.loc[i, "attention"], part.loc[i, "value_weighted"]),
                        xytext=(-3 if right else 3, 3), textcoords="offset points", fontsize="x-small",
                        ha="right" if right else "left", color=palette[model])
    ax.plot([0, top], [0, top], color="0.6", linewidth=0.8, linestyle="--", zorder=0, label="no change")
    ax.set_xlim(-0.02 * top, top)
    ax.set_ylim(-0.02 * top, top)
    ax.set_aspect("equal")
    ax.set_xlabel(f"{metric}, attention-weighted")
    ax.set_ylabel(f"{metric}, value-weighted")
    if models:
        ax.legend(fontsize="small", frameon=False, loc="upper left")
    return ax
