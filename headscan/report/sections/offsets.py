"""The section "Offset profiles": mean attention by relative offset of each model's strongest previous-token, self
and next-token heads.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from ...analysis.ranking import top_heads
from ...analysis.runs import Comparison
from ...plots import profiles
from ..document import Figures, Heading, Note, Text
from ..figures import Pngs, structural
from . import Context, register_section

__all__ = ["offsets_section"]

OFFSET_METRICS = ("prev_token", "self", "next_token")  # the metrics an offset profile explains: d = -1, 0, +1
OFFSET_TOP = 3  # heads drawn in each offset profile


def offsets_section(comparison: Comparison, pngs: Pngs) -> list:
    blocks: list = [
        Heading(2, "Offset profiles"),
        Text(f"Mean attention on the key at query + d, for d from -K to K, of each model's {OFFSET_TOP} strongest "
             "heads on the three metrics the profile explains: a previous-token head peaks at d = -1, a self head "
             "at 0, a next-token head at +1. The other metrics (sinks, entropy, distance, induction) are not about "
             "one offset, so their profiles say little; the atlas shows any head's profile."),
    ]
    if "offsets" not in comparison.frames:
        return blocks + [Note("The runs have no offsets table.")]
    offsets = comparison.offsets
    metrics = [m for m in OFFSET_METRICS if m in comparison.metrics]
    models = [m for m in comparison.models if (offsets["model"] == m.name).any()]
    if not metrics or not models:
        return blocks + [Note("The runs have no prev_token, self or next_token scores to choose heads by.")]
    fig = Figure(figsize=(3.5 * len(metrics), 2.6 * len(models) + 0.2), layout="constrained")
    axes = fig.subplots(len(models), len(metrics), squeeze=False, sharex=True, sharey=True)
    widest = 0.0
    for row, m in zip(axes, models):
        part = offsets[offsets["model"] == m.name]
        for ax, metric in zip(row, metrics):
            title = f"{m.name}: {metric}"
            top = top_heads(comparison.heads, metric=metric, n=OFFSET_TOP, model=m.name)
            reason = structural(comparison, m.name, metric)
            if top.empty:
                ax.set_title(title)
                ax.text(0.5, 0.5, "0 for every head:\na causal model cannot look ahead" if reason else
                        "every head scores the same", ha="center", va="center", transform=ax.transAxes,
                        fontsize="small", color="0.35")
                ax.set_xlim(-8.5, 8.5)
                ax.set_ylim(0, 1.02)
                continue
            profiles.offset_profiles(part, model=m.name, heads=list(top["label"]), ax=ax, title=title)
            drawn = part[part["label"].isin(top["label"])]
            widest = max(widest, float((drawn["ci_high"] - drawn["ci_low"]).max(skipna=True) or 0.0))
        for ax in row:
            ax.label_outer()
    name = pngs.add("offset_profiles.png", fig)
    band = (f"the widest drawn is {widest:.3f}, so most bands are thinner than their line" if widest < 0.02
            else f"the widest drawn is {widest:.3f}")
    return blocks + [Figures([name], "Mean attention by relative offset, one row per model, one column per metric; "
                                     f"the shaded band around each line is its 95% interval ({band}).")]


@register_section("offset profiles", order=70)
def offsets(context: Context) -> list:
    return offsets_section(context.comparison, context.pngs)
