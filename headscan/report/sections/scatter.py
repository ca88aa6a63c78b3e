"""The sections "Previous against next token" (one point per head) and "Entropy by depth".
"""

from __future__ import annotations

from matplotlib.figure import Figure

from ...analysis.ranking import WIDE_CI
from ...analysis.runs import Comparison
from ...metrics import describe
from ...plots import profiles
from ..document import Figures, Heading, Note
from ..figures import Pngs
from . import Context, register_section

__all__ = ["prev_next_section", "entropy_section"]


def prev_next_section(comparison: Comparison, palette: dict, pngs: Pngs) -> list:
    blocks: list = [Heading(2, "Previous against next token")]
    if not {"prev_token", "next_token"} <= set(comparison.metrics):
        return blocks + [Note("The tables have no prev_token and next_token metrics to compare.")]
    fig = Figure(figsize=(6.4, 6.2), layout="constrained")
    profiles.prev_next_scatter(comparison.heads, ax=fig.subplots(), palette=palette, ci_threshold=WIDE_CI)
    causal = [m.name for m in comparison.models if m.family == "causal"]
    strip = (f" A causal model ({', '.join(causal)}) cannot look ahead: its next-token share is 0 for every head, "
             "so its heads are drawn in the grey strip below the axis, spread up and down at random so that they "
             "can be told apart; only their x position means anything." if causal else "")
    return blocks + [Figures([pngs.add("prev_next_scatter.png", fig)],
                             "One point per head: its previous-token share against its next-token share; the "
                             "strongest head on each axis is labelled. The dashed line x + y = 1 is the most a head "
                             "can put on its two neighbours together: a head on it attends to nothing else."
                             + strip + f" Error bars show 95% intervals wider than {WIDE_CI:g}.")]


def entropy_section(comparison: Comparison, palette: dict, pngs: Pngs) -> list:
    blocks: list = [Heading(2, "Entropy by depth")]
    if "entropy" not in comparison.metrics:
        return blocks + [Note("The tables have no entropy metric.")]
    fig = Figure(figsize=(6.6, 4.6), layout="constrained")
    profiles.entropy_by_depth(comparison.heads, ax=fig.subplots(), palette=palette)
    return blocks + [Figures([pngs.add("entropy_by_depth.png", fig)],
                             f"Attention entropy ({describe('entropy').unit}) of every head by relative depth (layer "
                             "/ (layers - 1): 0 the first layer, 1 the last), so models of different depth compare "
                             "over their whole depth; the line is the mean over a layer's heads. Low entropy is "
                             "focused attention.")]


@register_section("scatter and entropy", order=80)
def scatter(context: Context) -> list:
    return [*prev_next_section(context.comparison, context.palette, context.pngs),
            *entropy_section(context.comparison, context.palette, context.pngs)]
