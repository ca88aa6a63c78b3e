"""The section "Differences between runs": for each model in two runs, heatmaps of second minus first and the heads
whose intervals do not overlap.
"""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure

from ...analysis.across import run_differences, run_pairs
from ...analysis.runs import Comparison
from ...metrics import describe
from ...plots import heatmaps
from ..document import Figures, Heading, Note, Table, Text
from ..figures import MAX_WIDTH, Pngs, fmt_cell, model_shape, name_part
from . import Context, register_section

__all__ = ["differences_section"]

DIFFERENCE_METRICS = 4  # at most this many metrics drawn per pair of runs: those that differ most
DIFFERENCE_ROWS = 20  # rows of the table of heads whose intervals do not overlap


def differences_section(comparison: Comparison, pngs: Pngs) -> list:
    """For each model in two runs: the heatmaps of second - first and the heads whose intervals do not overlap."""
    pairs = run_pairs([m.name for m in comparison.models])
    if not pairs:
        return []
    blocks: list = [
        Heading(2, "Differences between runs"),
        Text("Where one model appears in two runs: each 0-1 metric's difference, second run minus first, for the "
             f"{DIFFERENCE_METRICS} metrics that differ most (a dot marks a head whose two 95% intervals do not "
             "overlap), and the heads that differ most among those whose intervals do not overlap."),
    ]
    for first, second in pairs:
        diff = run_differences(comparison.heads, first, second)
        bounded = diff[diff["metric"].map(lambda m: describe(m).bounded).astype(bool) & diff["difference"].notna()]
        blocks.append(Heading(3, f"{second} \u2212 {first}"))
        if bounded.empty:
            blocks.append(Note("No 0-1 metric is defined in both runs."))
            continue
        largest = bounded.assign(gap=bounded["difference"].abs()).groupby("metric", sort=False)["gap"].max()
        chosen = [m for m in largest.sort_values(ascending=False, kind="stable").index[:DIFFERENCE_METRICS]
                  if largest[m] > 0]
        apart = bounded[bounded["apart"]]
        worst = bounded.loc[bounded["difference"].abs().idxmax()]
        blocks.append(Text(
            f"{len(apart)} of {len(bounded)} 0-1 head scores have 95% intervals that do not overlap; the largest "
            f"difference is `{worst['metric']}` of {worst['label']}: {worst['value_a']:.3f} in {first}, "
            f"{worst['value_b']:.3f} in {second}."))
        if chosen:
            n_layers, n_heads = model_shape(comparison, first)
            ncols = min(2, len(chosen))
            nrows = math.ceil(len(chosen) / ncols)
            width = min(MAX_WIDTH, ncols * min(max(3.4, 0.36 * n_heads + 1.9), 6.0))
            height = min(max(2.4, 0.16 * n_layers + 1.3), 5.2)
            fig = Figure(figsize=(width, height * nrows), layout="constrained")
            axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
            for ax, metric in zip(axes, chosen):
                heatmaps.difference_heatmap(diff, metric=metric, ax=ax)
            for ax in axes[len(chosen):]:
                ax.set_visible(False)
            fig.suptitle(f"{second} \u2212 {first}")
            name = pngs.add(f"difference_{name_part(second)}_{name_part(first)}.png", fig)
            blocks.append(Figures([name], f"{second} minus {first}, head by head; blue: lower in {second}, red: "
                                          "higher; each panel has its own symmetric scale; \u2022: intervals do not "
                                          "overlap."))
        if len(apart):
            top = apart.reindex(apart["difference"].abs().sort_values(ascending=False, kind="stable").index)
            top = top.head(DIFFERENCE_ROWS)
            frame = pd.DataFrame({
                "metric": top["metric"], "head": top["label"],
                first: top["value_a"].map(fmt_cell), f"{first} low": top["ci_low_a"].map(fmt_cell),
                f"{first} high": top["ci_high_a"].map(fmt_cell),
                second: top["value_b"].map(fmt_cell), f"{second} low": top["ci_low_b"].map(fmt_cell),
                f"{second} high": top["ci_high_b"].map(fmt_cell),
                "difference": top["difference"].map(lambda v: f"{v:+.3f}"),
            })
            numeric = tuple(c for c in frame.columns if c not in ("metric", "head"))
            blocks.append(Table(frame.reset_index(drop=True), numeric=numeric, sortable=True,
                                note=(f"All {len(apart)} head scores" if len(frame) == len(apart) else
                                      f"The {len(frame)} largest differences of the {len(apart)} head scores")
                                + " whose 95% intervals do not overlap; low and high are the interval's ends. Click a "
                                  "heading to sort."))
    return blocks


@register_section("differences between runs", order=40)
def differences(context: Context) -> list:
    return differences_section(context.comparison, context.pngs)
