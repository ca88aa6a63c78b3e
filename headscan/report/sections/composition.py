"""The section "Which heads feed which": composition scores from the weights (composition.parquet), each model's
strongest pairs per mode against the random-matrix null, and previous-token heads linked to the induction heads
whose keys read them.
"""

from __future__ import annotations

import pandas as pd

from ...analysis.composition import composition_links, composition_summary, top_pairs
from ...analysis.roles import head_roles
from ...analysis.runs import Comparison
from ..document import Bullets, Heading, Table, Text
from . import Context, register_section

__all__ = ["composition_section"]

TOP = 5  # pairs per model and mode
_MODES = {"Q": "queries", "K": "keys", "V": "values"}


def composition_section(comparison: Comparison) -> list:
    composition = comparison["composition"]
    blocks: list = [
        Heading(2, "Which heads feed which"),
        Text("Composition scores from the weights alone (Elhage et al. 2021): how much a head's output can move a "
             "later head's queries (Q), keys (K) or values (V), the Frobenius norm of the product of the two heads' "
             "circuits over the product of their norms, from 0 to 1. The null is the same score for random "
             "Gaussian matrices of the same shapes: a pair is beyond it above its 99th percentile, so about 1 pair "
             "in 100 of random weights passes, and a count is read against that rate. Trained heads share "
             "directions that random matrices do not, so on a trained model many pairs pass and a pair's rank among "
             "the model's own pairs says more than passing. K-composition of a "
             "previous-token head into an induction head is the two-head induction circuit (Olsson et al. 2022); "
             "a score says the weights allow it, not that the model uses it (patching says that)."),
    ]
    summary = composition_summary(composition)
    lines = []
    for model, part in summary.groupby("model", sort=False):
        said = "; ".join(f"{r.mode} {r.beyond:,} of {r.pairs:,} pairs (null mean {r.null_mean:.3f}, 99th percentile "
                         f"{r.null_high:.3f}; random weights would pass about {r.pairs / 100:,.0f})"
                         for r in part.itertuples())
        lines.append(f"{model}: beyond the null, {said}.")
    blocks.append(Bullets(lines))
    top = top_pairs(composition, TOP)
    blocks.append(Table(pd.DataFrame({
        "model": top["model"], "mode": top["mode"].map(lambda m: f"{m} ({_MODES[m]})"), "sender": top["source_label"],
        "receiver": top["label"], "score": top["value"].map("{:.3f}".format),
        "null 99%": top["null_high"].map("{:.3f}".format), "beyond": top["beyond"].map({True: "yes", False: "no"})}),
        numeric=("score", "null 99%"), sortable=True,
        note=f"Each model's {TOP} largest pairs per mode (0-indexed labels; the sender is in an earlier layer)."))
    roles = head_roles(comparison.heads, comparison.frames.get("weights"))
    links = composition_links(composition, roles)
    if links.empty:
        blocks.append(Text("No previous-token head and later induction or prefix-matching head are both found in "
                           "the same model here, so no such pair is linked."))
    else:
        blocks += [Text("Previous-token heads and the later induction or prefix-matching heads whose keys read "
                        "them (roles as in the atlas):"),
                   Table(pd.DataFrame({
                       "model": links["model"], "previous-token head": links["sender"],
                       "induction head": links["receiver"], "K-composition": links["value"].map("{:.3f}".format),
                       "rank": [f"{r:,} of {n:,}" for r, n in zip(links["rank"], links["of"])],
                       "beyond": links["beyond"].map({True: "yes", False: "no"})}),
                       numeric=("K-composition",), sortable=True)]
    return blocks


@register_section("composition", order=75, shown=lambda comparison: "composition" in comparison.frames)
def composition(context: Context) -> list:
    return composition_section(context.comparison)
