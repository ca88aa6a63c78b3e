"""The section "Which heads feed which": composition scores from the weights (composition.parquet), each model's
strongest pairs per mode against the rotation null, previous-token heads linked to the induction heads whose keys
read them, and why a model of the run was not scored (a post-LayerNorm model, or one with too many heads for
``--composition auto``), from its provenance.
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


def _unscored(comparison: Comparison, scored) -> list[str]:
    """One line per model of the run whose provenance says its composition was not scored, and why."""
    lines = []
    for model in comparison.models:
        note = model.provenance.extra.get("composition")
        if model.name not in scored and isinstance(note, str) and note.startswith("not scored"):
            lines.append(f"{model.name}: {note}.")
    return lines


def composition_section(comparison: Comparison) -> list:
    composition = comparison.frames.get("composition")
    blocks: list = [
        Heading(2, "Which heads feed which"),
        Text("Composition scores from the weights alone (Elhage et al. 2021), as TransformerLens' "
             "all_composition_scores computes them on a model with its default processing: how much a head's output "
             "can move a later head's queries (Q), keys (K) or values (V), the Frobenius norm of the product of the "
             "two heads' circuits over the product of their norms, from 0 to 1. The norm before each attention is "
             "folded into the weights that read the residual stream; where it is a LayerNorm, which removes the "
             "residual's mean, reading and writing weights are centred (an RMSNorm keeps the mean: nothing is "
             "centred). A post-LayerNorm model (BERT) is not scored: a LayerNorm of the whole residual stream sits "
             "between every head and the next layer, so the score of the weights is not defined there. The null "
             "turns the residual basis between a sender and a receiver by a random rotation, keeping each matrix's "
             "singular values: a pair is beyond it above its 99th percentile, so about 1 pair in 100 of random "
             "weights passes, and a count is read against that rate. Trained heads share directions that random "
             "ones do not, so on a trained model many pairs can pass and a pair's rank among the model's own pairs "
             "says more than passing. On a model with rotary position embeddings (Llama, smollm2), K- and "
             "Q-composition read W_Q W_K^T without the rotation between a query's and a key's positions, so they "
             "ignore how that rotation turns what a key reads. K-composition of a previous-token head into an "
             "induction head is the two-head induction circuit (Olsson et al. 2022); a score says the weights "
             "allow it, not that the model uses it (patching says that)."),
    ]
    if composition is None:
        return blocks + [Bullets(_unscored(comparison, ()))]
    summary = composition_summary(composition)
    lines = []
    for model, part in summary.groupby("model", sort=False):
        said = "; ".join(f"{r.mode} {r.beyond:,} of {r.pairs:,} pairs (null mean {r.null_mean:.3f}, 99th percentile "
                         f"{r.null_high:.4f} \u00b1 {r.null_se:.5f}; random weights would pass about "
                         f"{r.pairs / 100:,.0f})" for r in part.itertuples())
        lines.append(f"{model}: beyond the null, {said}.")
    blocks.append(Bullets(lines + _unscored(comparison, set(summary["model"]))))
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


def shown(comparison: Comparison) -> bool:
    """A model was scored, or one was not scored for a reason its provenance gives."""
    return "composition" in comparison.frames or bool(_unscored(comparison, ()))


@register_section("composition", order=75, shown=shown)
def composition(context: Context) -> list:
    return composition_section(context.comparison)
