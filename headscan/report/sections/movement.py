"""The report's section on what heads move, not only where they look: value-weighted attention
(value.parquet), OV copying scores (weights.parquet) and direct logit attribution (dla, heads.parquet).

It takes the runs side by side, draws its PNGs (sized as in `headscan.report.sections`) and returns document
blocks, each part only where its data is present. It chooses no finding (see `headscan.analysis.movement`)
and loads no model.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from ...analysis import movement
from ...analysis.claims import NO_NULL, null_text, untested_text
from ...analysis.runs import Comparison
from ...config import split_control
from ...plots import heatmaps, profiles
from ...plots.style import SIGNED_CMAP, model_palette
from ..document import Bullets, Figures, Heading, Table, Text
from ..figures import ANNOTATE_TOP, MAX_WIDTH, Pngs, fmt_cell, heatmap_rows
from . import Context, register_section

__all__ = ["movement_section"]

COPYING_TOP = 3  # copying heads named per model
DLA_TOP = 5  # heads per model in the direct logit attribution table


def _value_part(comparison: Comparison, palette: dict, pngs: Pngs) -> list:
    if "value" not in comparison.frames:
        return []
    heads, value = comparison.heads, comparison["value"]
    means = movement.value_means(heads, value)
    if means.empty:
        return []
    blocks: list = [
        Heading(3, "Value-weighted attention"),
        Text("A head that attends to a key whose value vector is small moves almost nothing from it. Value "
             "weighting (Kobayashi et al. 2020) counts each key by the norm of what the head moves from it: "
             "A[q, k] ||f(x_k)||, with f(x_k) = (x_k W_V + b_V) W_O for the head, renormalised over each query's "
             "keys so that it reads like attention. The heads metrics computed on it say how much of each sink's "
             "share survives once values count: a share that falls is attention that moves little; one that rises "
             "is a sink whose value vectors are large."),
    ]
    sinks = movement.sink_summary(heads, value)
    items = []
    for row in sinks.itertuples():
        what = "[SEP]" if row.metric == "sep" else ("[CLS]" if comparison.model(row.model).family ==
                                                     "bidirectional" else "BOS (first-token)")
        way = ("falls" if row.value_weighted < row.attention else "rises") + f" from {row.attention:.2f} to " \
            f"{row.value_weighted:.2f}"
        items.append(f"{row.model}: the mean {what} share {way} once values count, over {row.heads} heads "
                     f"(`{row.metric}`, attention-weighted to value-weighted); the largest fall: {row.drop_label}, "
                     f"{row.drop_attention:.2f} to {row.drop_value:.2f}.")
    if items:
        blocks.append(Bullets(items))
    shown = [metric for metric in movement.SINKS if (sinks["metric"] == metric).any()]
    if shown:
        heights = [4.6 if metric == "first_token" else 3.4 for metric in shown]
        fig = Figure(figsize=(MAX_WIDTH - 1.2, sum(heights)), layout="constrained")
        axes = fig.subplots(len(shown), 2, squeeze=False, width_ratios=[1.45, 1.0], height_ratios=heights)
        for (left, right), metric in zip(axes, shown):
            pairs = movement.layer_pairs(heads, value, metric=metric)
            colours = {**model_palette(list(dict.fromkeys(pairs["model"]))), **palette}
            profiles.value_weighting_by_depth(pairs, ax=left, palette=colours, metric=metric)
            profiles.value_weighting_scatter(movement.paired(heads, value, metric=metric), ax=right, palette=colours,
                                           metric=metric)
            right.set_title(f"{metric}: one point per head")
        name = pngs.add("value_weighted_sinks.png", fig)
        blocks.append(Figures([name], "Left: per model, the mean share of a layer's heads on the sink, attention-"
                                      "weighted (solid) and value-weighted (dashed), by relative depth. Right: every "
                                      "head, attention-weighted against value-weighted; points below the dashed "
                                      "diagonal lose share once values count, and the head of each model that loses "
                                      "most is labelled. A panel whose shares all lie below 0.5 is drawn to its "
                                      "largest, not to 1."))
    frame = pd.DataFrame({"model": means["model"], "metric": means["metric"],
                          "attention-weighted": means["attention"].map(fmt_cell),
                          "value-weighted": means["value_weighted"].map(fmt_cell),
                          "change": means["change"].map(lambda v: f"{v:+.3f}")})
    if len(comparison.models) == 1:
        frame = frame.drop(columns="model")
    blocks.append(Table(frame, numeric=("attention-weighted", "value-weighted", "change"), sortable=True,
                        note="Every metric both tables have: its mean over a model's heads, attention-weighted "
                             "(heads.parquet) and value-weighted (value.parquet); change = value-weighted minus "
                             "attention-weighted (entropy and distance in their own units). Per-head values are in "
                             "the atlas. Click a heading to sort."))
    return blocks


def _copying_part(comparison: Comparison, pngs: Pngs) -> list:
    if "weights" not in comparison.frames:
        return []
    weights = comparison["weights"]
    rows = weights[(weights["metric"] == movement.COPYING) & weights["value"].notna()]
    unscored = [m for m in comparison.models if (weights["model"] == m.name).any()
                and not (rows["model"] == m.name).any()]
    why = [f"{m.name}: no copying score: {_weights_note(m)}." for m in unscored]
    if rows.empty:
        return [Heading(3, "Copying heads"), Bullets(why)] if why else []
    counts = movement.copying_counts(weights)
    top = movement.copying_heads(weights, n=COPYING_TOP)
    blocks: list = [
        Heading(3, "Copying heads"),
        Text("Each head's OV copying score (Olsson et al. 2022), read off the weights alone, with no corpus: the "
             "sum of the real parts of the eigenvalues of the head's full OV circuit W_E W_V W_O W_U over the sum "
             "of their absolute values, from \u22121 through 0 to 1. It summarises the weights, not what the head "
             "does on text: a positive score says the circuit as a whole maps tokens towards their own logits, on "
             "average over the vocabulary, and a head can score below 0 yet raise the next token's logit on a "
             "corpus, or the reverse (compare its direct logit attribution below). Its chance is 0: weights drawn "
             "with either sign equally likely score 0 on average. Counted as copying: a score above "
             f"{movement.COPYING_HIGH:g}."),
    ]
    items = []
    for row in counts.itertuples():
        mine = top[top["model"] == row.model]
        embedding = mine["embedding"].dropna()
        named = ", ".join(f"{r.label} {r.value:.2f}" for r in mine.itertuples())
        items.append(f"{row.model}: {row.high} of {row.heads} heads score above {movement.COPYING_HIGH:g} "
                     f"({row.positive} above 0, mean {row.mean:.2f}); the highest: {named}"
                     + (f" (embedding {embedding.iloc[0]})" if len(embedding) else "") + "."
                     + (f" {null}" if (null := _copying_null(row.model, counts)) else ""))
    blocks.append(Bullets(items + why))
    drawable = [(m.name, rows[rows["model"] == m.name]) for m in comparison.models if (rows["model"] == m.name).any()]

    def draw(part, model, ax, cbar):
        heatmaps.value_heatmap(part, model=model, ax=ax, vmin=-1.0, vmax=1.0, cmap=SIGNED_CMAP, center=0.0,
                              label="OV copying score", annotate_top=ANNOTATE_TOP, cbar=cbar,
                              title=f"{model} ({comparison.model(model).family})")

    files = heatmap_rows(drawable, pngs, "copying", draw)
    blocks.append(Figures(files, "OV copying score by layer and head, one scale from \u22121 (blue: lowers the "
                                 "attended token's logit) through 0 (white) to 1 (red: copies it); annotated: each "
                                 f"model's {ANNOTATE_TOP} highest."))
    return blocks


def _weights_note(m) -> str:
    """Why a model's weights table has no copying score, from its provenance (``weights``)."""
    note = str(m.provenance.extra.get("weights") or "not recorded")
    return note.removeprefix("not scored: ").removeprefix("not read: ")


def _dla_part(comparison: Comparison) -> list:
    top = movement.dla_heads(comparison.heads, n=DLA_TOP)
    if top.empty:
        return []
    blocks: list = [
        Heading(3, "Direct logit attribution"),
        Text("How much each head of a causal model writes, directly, towards the token that actually comes next "
             "(Elhage et al. 2021): its output at a query dotted with that token's logit direction (the "
             "unembedding with the final norm folded in, centred over the vocabulary), in logits, averaged over the "
             "corpus; and the share of queries where it is positive. Direct only: what later layers make of the "
             "head's output is not counted."),
    ]
    items = []
    for model, part in top.groupby("model", sort=False):
        claimed = part[part["unsupported"] == ""]
        if claimed.empty:
            first = part.iloc[0]
            numbers = (f"{first['label']} {first['dla']:+.2f} [{first['ci_low']:+.2f}, {first['ci_high']:+.2f}] "
                       "logits")
            if NO_NULL in str(first["unsupported"]).split("; "):  # never tested: say so, claim nothing either way
                items.append(f"{model}: not tested, `dla` has no null in a run without random-init controls "
                             f"(sweep with --control random-init); the largest, {numbers}, is a description only.")
            else:
                items.append(f"{model}: no head's attribution is a finding; the largest, {numbers}, "
                             f"{first['unsupported']}.")
            continue
        best = claimed.iloc[0]
        share = "" if pd.isna(best["positive"]) else f", positive at {best['positive']:.0%} of queries"
        items.append(f"{model}: {best['label']} adds {best['dla']:+.2f} "
                     f"[{best['ci_low']:+.2f}, {best['ci_high']:+.2f}] "
                     f"logits to the next token on average (chance {best['chance']:+.2f}: the same head attending "
                     f"uniformly{'; ' + null_text(best) if null_text(best) else ''}){share}, "
                     + ("a finding." if null_text(best) else "beyond chance; " + untested_text(
                         "dla", why="the table records no verdicts; sweep again with --control random-init") + "."))
    blocks.append(Bullets(items))
    signed = lambda v: "–" if pd.isna(v) else f"{v:+.3f}"  # noqa: E731
    frame = pd.DataFrame({
        "model": top["model"], "head": top["label"], "logits": top["dla"].map(signed),
        "95% low": top["ci_low"].map(signed), "95% high": top["ci_high"].map(signed),
        "chance": top["chance"].map(signed), "positive share": top["positive"].map(fmt_cell),
        "no claim": top["unsupported"],
    })
    if top["model"].nunique() == 1 and len(comparison.models) == 1:
        frame = frame.drop(columns="model")
    blocks.append(Table(frame, numeric=("logits", "95% low", "95% high", "chance", "positive share"), sortable=True,
                        note=f"Each causal model's {DLA_TOP} heads with the largest mean direct logit attribution to "
                             "the next token (heads.parquet `dla`), its 95% interval and the share of queries where "
                             "it is positive (`dla_positive`). Click a heading to sort."))
    return blocks


def movement_section(comparison: Comparison, palette: dict, pngs: Pngs) -> list:
    """What heads move, not only where they look: how much of the sinks survives value weighting, OV copying
    scores, and direct logit attribution; each part only where its data is present, nothing when none is."""
    parts = [*_value_part(comparison, palette, pngs), *_copying_part(comparison, pngs), *_dla_part(comparison)]
    if not parts:
        return []
    return [Heading(2, "What heads move"),
            Text("Attention says where a head looks; these say what it moves: value-weighted attention, the OV "
                 "circuit's copying score and the head's direct effect on the next token's logit. Heads are 0-indexed "
                 "L{layer}H{head}."),
            *parts]


def _moves(comparison: Comparison) -> bool:
    return bool({"value", "weights"} & set(comparison.frames)) or "dla" in comparison.metrics


@register_section("what heads move", order=120, shown=_moves)
def what_heads_move(context: Context) -> list:
    return movement_section(context.comparison, context.palette, context.pngs)



def _copying_null(model: str, counts: pd.DataFrame) -> str:
    """What the copying counts are measured against: the model's random-init controls where the run has them
    (their counts above the same threshold), else nothing, which the sentence says."""
    if split_control(model)[1] is not None:  # a control is itself the null
        return ""
    untrained = counts[counts["model"].map(lambda m: split_control(m) == (model, "random-init"))]
    if untrained.empty:
        return ("A description of the weights; " + untested_text("copying", why="a sweep with --control "
                "random-init counts its untrained copies' heads the same way").removeprefix("describes; ") + ".")
    return ("Against its untrained copies, counted the same way (a comparison, not a tested finding): "
            + ", ".join(f"{r.model} {r.high} of {r.heads}" for r in untrained.itertuples())
            + f" above {movement.COPYING_HIGH:g}.")
