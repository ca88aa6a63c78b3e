"""Charts of heads across offsets, metrics, depth and relations: offset profiles, previous- against next-token
scores, entropy by relative depth, syntactic heads against the fixed-offset baseline. Like `headscan.figures`
(layer x head matrices, whose helpers these share), each function takes a tidy table plus keyword-only options
and ``ax=None``, draws on that Axes and returns it.

This module does not choose what to show (see `headscan.findings` and `headscan.sections`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import seaborn as sns

from .figures import _axes, _ranks_high, _select, model_palette, unit
from .syntactic import offset_text

__all__ = ["offset_profiles", "prev_next_scatter", "entropy_by_depth", "syntax_best_heads", "syntax_legend_handles"]


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
    ax = _axes(ax)
    rows = _select(offsets, model=model)
    colours = sns.color_palette("colorblind", max(len(heads), 1))
    for label, colour in zip(heads, colours):
        line = _select(rows, label=label).sort_values("offset")
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


def _wide(low: pd.Series, high: pd.Series, threshold: float) -> pd.Series:
    return ((high - low) > threshold).fillna(False)


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
    ax = _axes(ax)
    models = list(dict.fromkeys(heads["model"]))
    palette = dict(palette) if palette is not None else model_palette(models)
    scattered, strip = [], False
    for model in models:
        rows = heads[(heads["model"] == model) & heads["metric"].isin([x, y])]
        if not {x, y} <= set(rows["metric"]):
            continue
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
            strip = True
            ys = -0.085 + np.random.default_rng(0).uniform(-0.035, 0.035, len(ys))
        ax.scatter(
            wide[("value", x)], ys,
            color=palette[model], marker=marker, s=22, alpha=0.8, edgecolors="none",
            label=(f"{model} ({family})" if family else model) + (f", {y} 0 for every head" if flat else ""),
        )
        scattered.append((model, wide, flat))
    # Error bars after every scatter, so collections[i] stays model i's points.
    for model, wide, flat in scattered:
        if ("ci_low", x) not in wide or flat:
            continue
        wide_x = _wide(wide[("ci_low", x)], wide[("ci_high", x)], ci_threshold)
        wide_y = _wide(wide[("ci_low", y)], wide[("ci_high", y)], ci_threshold)
        show = wide_x | wide_y
        if show.any():
            part = wide[show]
            xerr = np.vstack([part[("value", x)] - part[("ci_low", x)], part[("ci_high", x)] - part[("value", x)]])
            yerr = np.vstack([part[("value", y)] - part[("ci_low", y)], part[("ci_high", y)] - part[("value", y)]])
            ax.errorbar(
                part[("value", x)], part[("value", y)],
                xerr=np.where(wide_x[show].to_numpy(), xerr, 0), yerr=np.where(wide_y[show].to_numpy(), yerr, 0),
                fmt="none", ecolor=palette[model], elinewidth=0.8, alpha=0.6,
            )
    if label_top:
        for model, wide, flat in scattered:
            for metric in (x,) if flat else (x, y):
                values = wide[("value", metric)]
                if values.notna().any() and values.max() > values.min():
                    key = values.idxmax() if _ranks_high(metric) else values.idxmin()
                    at_y = -0.085 if flat else wide.loc[key, ("value", y)]
                    ax.annotate(key[2], (wide.loc[key, ("value", x)], at_y), xytext=(4, 4),
                                textcoords="offset points", fontsize="x-small", color=palette[model])
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
    ax.set_xlabel(f"{x} ({unit(x)})")
    ax.set_ylabel(f"{y} ({unit(y)})")
    if scattered:
        ax.legend(fontsize="small", frameon=False, loc="upper right")
    return ax


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
    ax = _axes(ax)
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
    ax.set_xlabel(f"{metric} ({unit(metric)})")
    ax.set_title(f"attention {metric} by relative depth (line: mean over a layer's heads)")
    ax.legend(fontsize="small", frameon=False)
    return ax


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
    interval lies wholly above the baseline and hollow where it reaches down to it. Each point carries its
    head's 0-indexed label (``L7H9``).

    Parameters
    ----------
    best : DataFrame
        `headscan.syntactic.best_heads` (columns ``model, relation, direction, label, accuracy, ci_low,
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
    ax = _axes(ax)
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
    small = 6.5 if len(models) <= 3 else 5.5
    for model, part, x, _ in drawn:
        for xi, row in zip(x, part.itertuples()):
            if not pd.isna(row.baseline):
                ax.text(xi, 0.012, offset_text(row.baseline_offset), ha="center", va="bottom", fontsize=small,
                        color="0.3", gid="offset")
            if label_heads:
                top = row.ci_high if not pd.isna(row.ci_high) else row.accuracy
                ax.text(xi, min(top + 0.015, 1.0), row.label, ha="center", va="bottom", rotation=90, fontsize=small,
                        color=palette[model], gid="head")
    if "all" in where and len(relations) > 1:
        ax.axvline(where["all"] + 0.5, color="0.75", linewidth=0.8, linestyle=":", zorder=0)
    ax.set_xticks(range(len(relations)), relations, rotation=45, ha="right", rotation_mode="anchor")
    ax.set_xlim(-0.6, len(relations) - 0.4)
    ax.set_ylim(0, 1.12 if label_heads else 1.02)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.grid(axis="y", color="0.92", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.set_ylabel("accuracy (share of dependents)")
    ax.set_title(title if title is not None else direction.replace("_", " "))
    if legend and drawn:
        ax.legend(handles=syntax_legend_handles([m for m, *_ in drawn], palette), fontsize="small", frameon=False,
                  loc="upper left", bbox_to_anchor=(1.005, 1.0))
    return ax



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
