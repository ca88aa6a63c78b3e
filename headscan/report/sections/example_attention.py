"""The sections "Looking both ways" and "Induction heads": attention patterns of chosen heads on an example sentence
and on a repeated sequence, computed beforehand by `headscan.report.examples` (this module loads no model).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd
from matplotlib.figure import Figure

from ...analysis.ranking import fmt_score, top_heads
from ...analysis.runs import Comparison
from ...config import split_control
from ...plots import heatmaps
from ..document import Bullets, Figures, Heading, Note, Text
from ..figures import MAX_WIDTH, Pngs
from . import Context, register_section

if TYPE_CHECKING:  # the report only reads what headscan.report.examples computed; it never imports the models
    from ..examples import ExampleAttention, Examples

__all__ = ["examples_section", "induction_section"]


def _attention_figure(panels: list, columns: int = 2) -> Figure:
    """Attention patterns (`ExampleAttention`, or a str: a note in that slot) in a grid of at most `columns` per
    row, one shared 0-1 colour bar; sized to fit the page, so it is never shrunk."""
    drawn = [p for p in panels if not isinstance(p, str)]
    size = max(len(p.tokens) for p in drawn)
    side = min(max(3.6, 0.26 * size + 1.6), (MAX_WIDTH - 1.0) / columns)
    ncols = min(columns, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(side * ncols + 1.0, (side + 0.6) * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, p in zip(axes, panels):
        if isinstance(p, str):
            ax.axis("off")
            ax.text(0.5, 0.5, p, ha="center", va="center", transform=ax.transAxes, color="0.35", wrap=True)
            continue
        heatmaps.attention_matrix(p.tokens, p.pattern, causal=p.family == "causal", ax=ax, cbar=False,
                                 title=f"{p.model} {p.label}: {p.metric} {fmt_score(p.metric, p.value)}\n({p.family}"
                                       + (f"; {p.unsupported}: no finding)" if p.unsupported else ")"))
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    shown = [ax for ax, p in zip(axes, panels) if not isinstance(p, str)]
    fig.colorbar(shown[0].collections[0], ax=shown, shrink=0.5, label="share of attention")
    return fig


def _both_ways(drawn: list[ExampleAttention]) -> list:
    """The panels model by model, a model's previous-token head on the left and its next-token head on the
    right; where a causal model has none, a note says why."""
    panels: list = []
    for model in dict.fromkeys(e.model for e in drawn):
        mine = [e for e in drawn if e.model == model]
        prev = [e for e in mine if e.metric == "prev_token"]
        nxt = [e for e in mine if e.metric != "prev_token"]
        panels += prev or [f"{model}: no previous-token head to show"]
        family = mine[0].family
        panels += nxt or [f"{model} is {family}: its queries cannot see\nlater tokens, so it has no next-token head"
                          if family == "causal" else f"{model}: no next-token head to show"]
    return panels


def _evidence(e: ExampleAttention) -> str:
    """An example head with its score over the corpus, interval and chance, and, where it carries no claim, why.

    >>> import numpy as np
    >>> from headscan.report.examples import ExampleAttention
    >>> e = ExampleAttention("minilm", "bidirectional", "next_token", "L4H11", 4, 11, 0.021, ("a",), np.ones((1, 1)),
    ...                      0.017, 0.026, 0.035, "below chance")
    >>> _evidence(e)
    'minilm L4H11 (next_token 0.021 [0.017, 0.026] over the corpus, chance 0.035: below chance, so no finding; shown to illustrate the metric)'
    """
    score = f"{e.metric} {fmt_score(e.metric, e.value)}"
    if not (pd.isna(e.ci_low) or pd.isna(e.ci_high)):
        score += f" [{fmt_score(e.metric, e.ci_low, e.value)}, {fmt_score(e.metric, e.ci_high, e.value)}]"
    score += " over the corpus" + ("" if pd.isna(e.chance) else f", chance {fmt_score(e.metric, e.chance)}")
    if e.unsupported:
        score += f": {e.unsupported}, so no finding; shown to illustrate the metric"
    return f"{e.model} {e.label} ({score})"


def examples_section(examples: Examples | None, pngs: Pngs) -> list:
    blocks: list = [Heading(2, "Looking both ways")]
    if examples is None:
        return blocks + [Note("The example attention was not drawn: this report was made without loading the "
                              "models (`headscan report --no-models`, or `write_report` without `examples`). "
                              "Everything else here needs only the tables.")]
    stop = "" if examples.text.rstrip()[-1:] in ".!?" else "."
    blocks.append(Text(f"{examples.choice}, on one example sentence: \u201c{examples.text}\u201d{stop} Rows are "
                       "queries, columns the keys they attend to; a causal model cannot see later tokens, so its "
                       "pattern is a triangle (and it has no next-token head to show) beside the bidirectional "
                       "model's full square. The atlas above shows any head on this sentence."))
    # the trained models only: a control's heads are the null, not heads to look at (and 14 models' panels on
    # one page are a figure too large to draw)
    drawn = [e for e in examples.drawn if split_control(e.model)[1] is None]
    if drawn:
        name = pngs.add("looking_both_ways.png", _attention_figure(_both_ways(drawn)))
        blocks.append(Figures([name], "Looking both ways: " + "; ".join(_evidence(e) for e in drawn)
                              + ". One shared 0-1 colour scale; blank cells are keys a causal model cannot see."))
    if examples.failed:
        total = len({e.model for e in drawn}) + len(examples.failed)
        blocks.append(Note(f"The example attention could not be drawn for {len(examples.failed)} of {total} models; "
                           "everything else here needs only the tables. Why:"))
        blocks.append(Bullets(list(examples.failed)))
    return blocks


def _bar(comparison: Comparison) -> str:
    """What a head must pass to be shown as carrying a claim: a finding against its null where the run tested
    its rows (`headscan.metrics.nulls`), else an interval beyond uniform attention, which is no null."""
    return ("a finding against its null, not thin" if comparison.tested else
            "its interval beyond uniform attention and not thin; not tested: this run records no null")


def induction_section(comparison: Comparison, examples: Examples | None, pngs: Pngs) -> list:
    """Induction and duplicate-token heads: their strongest heads, and the induction example where drawn."""
    if "induction" not in comparison.metrics or examples is None or not examples.repeated_text:
        return []
    blocks: list = [
        Heading(2, "Induction heads"),
        Text(f"Each model's strongest head on `induction` that may carry a claim ({_bar(comparison)}), on a repeated "
             f"sequence: \u201c{examples.repeated_text}\u201d. In the second copy a head that matches prefixes "
             "attends to the token that followed the current token in the first copy: a diagonal stripe one step "
             "right of the first copy's diagonal. Attention alone makes it prefix-matching; the role \u201cinduction"
             "\u201d also asks for evidence that it copies what it attends to (see the roles under the atlas). "
             "`induction` and `duplicate_token` need repeated tokens to score; the `repeat-random` corpus gives "
             "them."),
    ]
    shown = [e for e in examples.induction if split_control(e.model)[1] is None]  # trained models: see above
    if shown:
        name = pngs.add("induction_example.png", _attention_figure(shown))
        blocks.append(Figures([name], f"Heads on `induction` ({_bar(comparison)}), on the repeated sequence: " + "; ".join(
            _evidence(e) for e in shown) + "."))
    drawn = {e.model for e in shown}
    missing = [m.name for m in comparison.models if m.name not in drawn and split_control(m.name)[1] is None
               and (comparison.heads["model"] == m.name).any()]
    if missing:
        top = top_heads(comparison.heads[comparison.heads["model"].isin(missing)], metric="induction", n=1)
        said = [f"{row.model}: no head on `induction` may carry a claim ({_bar(comparison)}); the strongest, {row.label} "
                f"{fmt_score('induction', row.value)} (chance {fmt_score('induction', row.chance)}), {row.unsupported}."
                for row in top.itertuples()]
        if said:
            blocks.append(Bullets(said))
    return blocks


@register_section("example attention", order=30)
def example_attention(context: Context) -> list:
    return [*examples_section(context.examples, context.pngs),
            *induction_section(context.comparison, context.examples, context.pngs)]
