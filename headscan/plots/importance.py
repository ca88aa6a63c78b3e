"""Does the head matter, as figures: each head's effect against its strongest pattern, and AtP against exact
ablation.

Like every plot here, a tidy table (`headscan.analysis.importance.matter_table`, or the rows of
importance.parquet) and keyword-only options in, the Axes drawn on out.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import MaxNLocator

from ..analysis.importance import PATTERN_METRICS, spearman
from .style import axes_or_current, select

__all__ = ["pattern_colours", "effect_against_pattern", "atp_against_exact"]


def pattern_colours() -> dict[str, tuple]:
    """One colour per pattern metric (`headscan.analysis.importance.PATTERN_METRICS`), the same in every figure."""
    return dict(zip(PATTERN_METRICS, sns.color_palette("colorblind", len(PATTERN_METRICS))))


def effect_against_pattern(table: pd.DataFrame, *, model: str, ax=None, colours: Mapping[str, tuple] | None = None,
                           unit: str = "change of the target", label_flags: int = 8, legend: bool = True):
    """Draw one model's heads: the strongest pattern share (x) against the effect of removing the head (y), with
    the effect's 95% interval, coloured by which pattern is strongest; flagged heads are labelled.

    Parameters
    ----------
    table : DataFrame
        `headscan.analysis.importance.matter_table` (columns ``model, label, pattern, pattern_value, value,
        ci_low, ci_high, exact, flag``).
    model : str
        Whose heads to draw.
    ax : matplotlib Axes, optional
        Where to draw; the current Axes by default.
    colours : mapping of pattern metric to colour, optional
        `pattern_colours` by default.
    unit : str, default "change of the target"
        The y-axis label.
    label_flags : int, default 8
        Write the labels of this many flagged heads beside them, those of largest effect first (0: none); a
        sink-heavy model flags dozens of heads, whose labels would cover each other.
    legend : bool, default True
        A legend of the patterns drawn, and of the estimate marker.

    Returns
    -------
    matplotlib Axes
        ``ax.collections``: one PathCollection per pattern (label the pattern's name; ``get_offsets()`` are
        (pattern share, effect)), exact ablations as dots and AtP estimates as crosses; ``ax.containers`` the
        intervals; ``ax.texts`` the flagged heads' labels (``gid`` "flag"). A line marks an effect of 0.
    """
    ax = axes_or_current(ax)
    rows = select(table, model=model)
    rows = rows[rows["pattern_value"].notna()]
    colours = dict(colours) if colours is not None else pattern_colours()
    below = np.nan_to_num(rows["value"].to_numpy(float) - rows["ci_low"].to_numpy(float))
    above = np.nan_to_num(rows["ci_high"].to_numpy(float) - rows["value"].to_numpy(float))
    ax.errorbar(rows["pattern_value"], rows["value"], yerr=np.vstack([below, above]), fmt="none", ecolor="0.7",
                elinewidth=0.7, zorder=1)
    for pattern in [p for p in PATTERN_METRICS if p in set(rows["pattern"])]:
        part = rows[rows["pattern"] == pattern]
        for exact, marker in ((True, "o"), (False, "x")):
            chosen = part[part["exact"] == exact]
            if len(chosen):
                ax.scatter(chosen["pattern_value"], chosen["value"], s=16, marker=marker, color=colours[pattern],
                           label=pattern if exact or not part["exact"].any() else None, zorder=2)
    ax.axhline(0.0, color="0.4", linewidth=0.7, zorder=0)
    flagged = rows[rows["flag"] != ""]
    flagged = flagged.reindex(flagged["value"].abs().sort_values(ascending=False).index).head(int(label_flags))
    for row in flagged.itertuples():
        ax.annotate(row.label, (row.pattern_value, row.value), xytext=(3, 3), textcoords="offset points",
                    fontsize=6.5, color="0.2", gid="flag")
    ax.set_xlim(0, 1.02)
    ax.set_xlabel("strongest pattern (share of attention)")
    ax.set_ylabel(unit)
    ax.set_title(model)
    if legend and len(rows):
        ax.legend(fontsize="x-small", frameon=False, loc="best", title="strongest pattern", title_fontsize="x-small")
    return ax


def atp_against_exact(importance: pd.DataFrame, *, model: str, estimate: str = "atp_mean",
                      exact: str = "mean_ablation", ax=None, colour=None):
    """Draw, for one model's heads that have both, the AtP estimate (x) against the exact ablation (y), with the
    diagonal; the title gives Spearman's rank correlation.

    Parameters
    ----------
    importance : DataFrame
        Rows of importance.parquet.
    model : str
        Whose heads to draw.
    estimate, exact : str
        The methods compared: ``atp_mean`` and ``mean_ablation`` by default (or ``atp_zero`` and
        ``zero_ablation``).
    ax : matplotlib Axes, optional
        Where to draw; the current Axes by default.
    colour : optional
        The points' colour.

    Returns
    -------
    matplotlib Axes
        ``ax.collections[0]`` the heads (``get_offsets()`` are (estimate, exact)); ``ax.lines[0]`` the diagonal.
    """
    ax = axes_or_current(ax)
    rows = select(importance, model=model)
    wide = rows.pivot_table(index=["layer", "head"], columns="method", values="value", dropna=False)
    both = wide[[estimate, exact]].dropna() if {estimate, exact} <= set(wide.columns) else pd.DataFrame(
        columns=[estimate, exact])
    ax.scatter(both[estimate], both[exact], s=14, color=colour if colour is not None else "#0173b2", zorder=2)
    values = both.to_numpy(float)
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)
    pad = 0.05 * (high - low or 1.0)
    ax.plot([low - pad, high + pad], [low - pad, high + pad], color="0.5", linewidth=0.7, linestyle="--", zorder=1)
    ax.axhline(0.0, color="0.85", linewidth=0.6, zorder=0)
    ax.axvline(0.0, color="0.85", linewidth=0.6, zorder=0)
    rho = spearman(both[estimate], both[exact])
    ax.set_title(f"{model}\nSpearman {rho:.2f}, {len(both)} heads" if len(both) else f"{model}\nno head has both")
    ax.xaxis.set_major_locator(MaxNLocator(4))
    ax.ticklabel_format(axis="both", style="sci", scilimits=(-3, 3))
    ax.set_xlabel(f"{estimate} (first-order estimate)")
    ax.set_ylabel(f"{exact} (exact)")
    return ax
