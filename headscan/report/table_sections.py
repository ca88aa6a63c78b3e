"""The report's sections on the tables beyond heads and offsets: syntactic heads (syntax.parquet) and attention
along the context (positions.parquet); what heads move (value.parquet, weights.parquet, dla) is in
`headscan.report.moves`.

Each section takes the runs side by side, draws its PNGs (sized as in `headscan.report.sections`) and returns
document blocks, or nothing when its table is absent or too short to draw.

This module chooses no finding (see `headscan.analysis`) and loads no model.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..analysis import movement
from ..analysis import positions as context
from ..analysis.runs import Comparison
from ..analysis.formats import code
from ..analysis.syntax import DIRECTIONS, MIN_SHARE, best_heads, direction_text, syntax_display, syntax_findings
from ..plots import heatmaps as figures
from ..plots import profiles as charts
from ..plots import syntax as syntax_plots
from ..plots.style import model_palette
from .document import Bullets, Figures, Heading, Note, Table, Text
from .moves import movement_section  # noqa: F401  (re-exported: what heads move has a module of its own)
from .sections import ANNOTATE_TOP, MAX_WIDTH, Pngs, fmt_cell, heatmap_rows

__all__ = ["syntax_section", "context_section", "movement_section", "shown_elsewhere"]

CONTEXT_TOP = 3  # sink heads named per model in "Attention along the context"
CONTEXT_ROWS = 5  # heads per model and ranking in its table (largest sink share, longest reach)


# --- syntactic heads -----------------------------------------------------------------------------------------

_SYNTAX_TITLES = {
    "dependent_to_head": "dependent \u2192 head: is the word the dependent attends to most its head?",
    "head_to_dependent": "head \u2192 dependent: is the word attending most to the dependent its head?",
}


def _syntax_slot(models: int) -> float:
    """Inches per relation in the syntactic-heads figure: room for each model's point and rotated head label."""
    return max(0.36, 0.17 * models + 0.06)


def _balanced(n: int, per_row: int) -> list[list[int]]:
    """Indices 0..n-1 in as few rows of at most `per_row` as can be, the rows as even as can be."""
    rows = max(1, math.ceil(n / max(per_row, 1)))
    size = math.ceil(n / rows)
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


def syntax_section(comparison: Comparison, palette: dict, pngs: Pngs) -> list:
    """Syntactic heads (Clark et al. 2019): per relation, each model's best head against the best fixed offset,
    as a figure, findings and a sortable table; nothing when no run has a syntax table."""
    if "syntax" not in comparison.frames:
        return []
    syntax = comparison["syntax"]
    n_heads = {m.name: len(comparison.heads.loc[comparison.heads["model"] == m.name, ["layer", "head"]]
                           .drop_duplicates()) for m in comparison.models}
    blocks: list = [
        Heading(2, "Syntactic heads"),
        Text("Does a head attend from a word to its syntactic head? As Clark et al. (2019): attention between words "
             "(to a word, the sum over its tokens; from a word, the mean over its tokens), with special tokens and "
             "the word itself left out, and the most-attended word (argmax) as the prediction. In the direction "
             "dependent \u2192 head a dependent is counted right when the word it attends to most is its gold head; "
             "in head \u2192 dependent, when the word that attends most to it is its head. Accuracy is the share "
             "of a relation's dependents counted right (UD relations, subtypes folded into their base, so "
             "`nmod:poss` is `nmod`; `all` is every word, root words counted as misses as Clark et al. count them, "
             "and `all_nonroot` every word but the root). The baseline is the best fixed offset d in -3..2 for "
             "that relation and direction on the same words, among the offsets the model's queries can see (a "
             "causal model's words see only earlier words: d \u2264 0); d = -1 is the previous word, whose "
             "accuracy is what a perfect positional head would score. Chance is a uniformly random choice among "
             "the words the dependent could pick. Heads are 0-indexed L{layer}H{head}: Clark et al.'s 1-indexed "
             "BERT \u201chead 8-10\u201d is L7H9 here."),
    ]
    best = best_heads(syntax)
    if best.empty:
        return blocks + [Note("The syntax table has no scored dependent: the corpus gave no gold syntax (the sweep "
                              "scores relations on CoNLL-U treebanks only).")]
    models = [m.name for m in comparison.models if (best["model"] == m.name).any()]
    best = best[best["model"].isin(models)]
    palette = {**model_palette(models), **palette}
    relations = list(dict.fromkeys(best["relation"]))
    slot = _syntax_slot(len(models))
    rows = _balanced(len(relations), int((MAX_WIDTH - 1.0) // slot))
    across = max(len(r) for r in rows)
    panels = [(d, [relations[i] for i in row]) for d in DIRECTIONS if (best["direction"] == d).any() for row in rows]
    fig = Figure(figsize=(min(MAX_WIDTH, across * slot + 1.0), 2.9 * len(panels) + 0.4), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (direction, shown) in zip(axes, panels):
        first = shown[0] == relations[0]
        title = _SYNTAX_TITLES[direction] if first else f"{direction_text(direction)} (continued)"
        syntax_plots.syntax_best_heads(best, direction=direction, relations=shown, ax=ax, palette=palette, legend=False,
                                 title=title)
        ax.set_xlim(-0.6, across - 0.4)  # every row of panels at the same scale
    fig.legend(handles=syntax_plots.syntax_legend_handles(models, palette), loc="outside upper center",
               ncols=len(models) + 3, frameon=False, fontsize="small")
    name = pngs.add("syntactic_heads.png", fig)
    beats = best[best["beats"]]  # as the table's "beats" column counts them
    found = beats[beats["unsupported"] == ""]
    choice = ", ".join(f"{n_heads[m]} in {m}" for m in models)
    blocks.append(Figures([name], "Per relation (most dependents first, `all` left of the dotted line), each "
                                  "model's most accurate head with its 95% interval, against the best fixed offset "
                                  "(the light bar, its offset d written at its foot), one panel per direction. A "
                                  "filled point's interval lies wholly above the baseline; a hollow one's reaches "
                                  "down to it. Each point is labelled with its head."))
    blocks.append(Text(f"{len(beats)} of {len(best)} best heads {'beats' if len(beats) == 1 else 'beat'} the best "
                       "fixed offset beyond their 95% interval "
                       f"(the interval's lower end above the baseline); {len(found)} of these "
                       + ("is a finding, which also needs" if len(found) == 1 else "are findings, which also need")
                       + " the interval above chance and support that is not thin. Read them with two cautions: the "
                       "best head is "
                       f"the most accurate of a model's heads ({choice}) on the same words, so its accuracy is a "
                       "little optimistic and its interval is that head's own, not widened for the choice; and the "
                       "baseline is itself the best of six offsets on these words."))
    sentences = syntax_findings(best)
    items = [sentence for model in models for sentence in sentences.get(model, [])]
    if items:
        blocks.append(Bullets(items))
    counts = syntax[syntax["count"] > 0].groupby("relation")["count"].max()
    left = sorted((r for r in counts.index if r not in relations), key=lambda r: (-counts[r], r))
    note = ("One row per model, relation and direction: the most accurate head (ties to the head whose interval "
            "starts higher, then the lower layer and head), its accuracy and 95% interval, the relation's "
            "dependents, the best fixed offset's accuracy and offset d, and margin = interval's low end minus "
            "baseline; beats: the margin is above 0. Click a heading to sort.")
    if best["thin"].any():
        note += " \u2021: resting on thin support; no finding rests on it."
    if left:
        note += (f" Left out, each under {MIN_SHARE:.0%} of all dependents: "
                 + ", ".join(f"{code(r)} ({int(counts[r]):,})" for r in left) + "; syntax.parquet has them.")
    frame = syntax_display(best, with_model=len(models) > 1)
    numeric = ("accuracy", "95% low", "95% high", "dependents", "baseline", "offset", "margin")
    blocks.append(Table(frame, numeric=numeric, note=note, sortable=True))
    return blocks


# --- attention along the context -------------------------------------------------------------------------------


def _positions(bucket: int) -> str:
    return "position 0" if bucket == 0 else ("position 1" if bucket == 1 else
                                             f"positions {bucket}\u2013{2 * bucket - 1}")


def context_section(comparison: Comparison, pngs: Pngs) -> list:
    """How the first-token (sink) share and the distance attended over change with the query's position: per
    model, one line per layer; the heads with the largest sink share late in the context; each head's reach;
    a sortable table. Nothing unless some model's positions table has at least `context.MIN_BUCKETS`
    non-empty buckets (a corpus of short sentences would draw a meaningless section)."""
    if "positions" not in comparison.frames:
        return []
    positions = comparison["positions"]
    long = context.long_models(positions)
    if not long:
        return []
    filled = context.filled_buckets(positions)
    models = [m for m in comparison.models if m.name in long]
    blocks: list = [
        Heading(2, "Attention along the context"),
        Text("How attention changes with the query's position in long segments. Queries are grouped into buckets "
             "by position: bucket b holds positions b to 2b \u2212 1 (bucket 0 is position 0 alone), so the buckets "
             "double, 1, 2, 4, 8, ... up to the sweep's max_len, and each is a mean over the queries of the corpus "
             "that fall in it. `first_token_by_position` is the share of attention on the first token (BOS or "
             "[CLS]): an attention sink's share; `distance_by_position` is the mean distance attended over past the "
             "first token, sum_{k \u2265 1} A[q, k] |q \u2212 k| in tokens (see the metric definitions). Statements "
             "are made only at buckets whose rows are not thin, about heads beyond chance."),
    ]
    short = [f"{name} ({n})" for name, n in filled.items() if name not in long]
    sink = context.layer_profiles(positions, metric=context.SINK)
    distance = context.layer_profiles(positions, metric=context.DISTANCE)
    panels = [(metric, frame) for metric, frame in ((context.SINK, sink), (context.DISTANCE, distance)) if len(frame)]
    fig = Figure(figsize=(min(MAX_WIDTH, 5.0 * len(panels) + 0.6), 3.2 * len(models) + 0.2), layout="constrained")
    axes = fig.subplots(len(models), len(panels), squeeze=False)
    for row, m in zip(axes, models):
        for ax, (metric, frame) in zip(row, panels):
            if not (frame["model"] == m.name).any():
                ax.set_visible(False)
                continue
            sinks = metric == context.SINK
            chance = context.chance_profile(positions, metric=metric)
            charts.position_profiles(frame, model=m.name, ax=ax, share=sinks, chance=chance,
                                     ylabel="share on the first token" if sinks else "mean distance (tokens)",
                                     title=f"{m.name} ({m.family}): "
                                           + ("first-token share" if sinks else "distance past the first token"))
    name = pngs.add("context_by_layer.png", fig)
    blocks.append(Figures([name], "Each model's first-token share (left) and mean distance attended over past the "
                                  "first token (right) against the query's position, one line per layer (the mean "
                                  "over its heads), with uniform attention's value on the same queries as a dashed "
                                  "black line (chance: a share falls along the context for uniform attention too, "
                                  "1/(q+1) at position q of a causal model, so compare each line with it), "
                                  "coloured by depth from layer 0 (dark) to the last layer (yellow); position on a "
                                  "log2 axis, each point at its bucket's first position."))
    tops = context.sink_heads(positions, n=CONTEXT_TOP)
    items = []
    for m in models:
        items += _sink_sentences(m.name, positions, tops)
    reach = context.reach(positions)
    reach = reach[reach["model"].isin(long)]
    for m in models:
        items += _reach_sentences(m.name, reach)
    if items:
        blocks.append(Bullets(items))
    if len(reach):
        drawable = [(m.name, reach[reach["model"] == m.name]) for m in models if (reach["model"] == m.name).any()]
        top = max(1.0, float(reach["value"].max()))

        def draw(rows, model, ax, cbar):
            figures.value_heatmap(rows, model=model, ax=ax, vmin=0.0, vmax=top, label="reach: distance / uniform's",
                                  cbar=cbar, title=f"{model}: reach at {_positions(int(rows['bucket'].iloc[0]))}")

        files = heatmap_rows(drawable, pngs, "context_reach", draw)
        blocks.append(Figures(files, "Reach of each head at the model's longest bucket that is not thin: its mean "
                                     "distance attended over past the first token, divided by the same under uniform "
                                     "attention over the keys each query sees (the chance column). Uniform attention "
                                     "reaches 1; a head that looks a fixed number of tokens back, near 0, and so does a "
                                     "sink, whose attention on the first token is left out (the first-token share "
                                     f"shows it); one scale, 0 to {top:.2f}; annotated: the {ANNOTATE_TOP} longest "
                                     "reaches."))
    rows = _context_table(positions, reach, tops, long)
    if len(rows):
        blocks.append(Table(rows, numeric=tuple(c for c in rows.columns if c not in ("model", "head")), sortable=True,
                            note=f"Per model, the {CONTEXT_ROWS} heads with the largest first-token share at the "
                                 f"longest bucket and the {CONTEXT_ROWS} with the longest reach; early: the first "
                                 "bucket after position 0, late: the longest. Click a heading to sort."))
    if short:
        blocks.append(Note("Not drawn, with fewer than "
                           f"{context.MIN_BUCKETS} non-empty buckets (too short a context): " + ", ".join(short) + "."))
    return blocks


def _sink_sentences(model: str, positions: pd.DataFrame, tops: pd.DataFrame) -> list[str]:
    """The mean first-token share at the first and the last bucket a statement may be made at, each beside its
    chance, and the largest sinks there (heads that may carry a claim)."""
    rows = positions[(positions["model"] == model) & (positions["metric"] == context.SINK) & positions["value"].notna()]
    rows = rows[(rows["bucket"] >= 1) & (rows["count"].fillna(0) > 0)]
    solid = context.solid_buckets(rows) if len(rows) else pd.Series(dtype=bool)
    buckets = sorted(b for (m, b), ok in solid.items() if ok)
    top = tops[tops["model"] == model]
    if len(buckets) < 2 or top.empty:
        return []
    early, late = buckets[0], buckets[-1]
    mean_at = rows.groupby("bucket")[["value", "chance"] if "chance" in rows else ["value"]].mean()

    def at(bucket):
        chance = mean_at["chance"].get(bucket, np.nan) if "chance" in mean_at else np.nan
        return f"{mean_at['value'][bucket]:.2f} at {_positions(bucket)}" + (
            "" if pd.isna(chance) else f" (uniform attention: {chance:.3f})")

    heads_text = ", ".join(f"{r.label} {r.value:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}] (chance {r.chance:.3f}; "
                           f"{r.early:.2f} at {_positions(r.early_bucket)}, chance {r.early_chance:.3f})"
                           for r in top.itertuples())
    return [f"{model}: the mean first-token share over all heads is {at(early)} and {at(late)}; the largest at "
            f"{_positions(late)}, beyond chance: {heads_text}."]


def _reach_sentences(model: str, reach: pd.DataFrame) -> list[str]:
    """Which head looks furthest back, and which nearest, beyond uniform attention's reach (or why none does)."""
    mine = reach[reach["model"] == model]
    if mine.empty:
        return []
    where = _positions(int(mine["bucket"].iloc[0]))
    out = []
    far = mine[mine["far"] == ""]
    if len(far):
        best = far.loc[far["value"].idxmax()]
        out.append(f"{model} at {where}: {best['label']} looks furthest back past the first token, "
                   f"{best['distance']:.1f} tokens on average [{best['ci_low']:.1f}, {best['ci_high']:.1f}] against "
                   f"{best['chance']:.1f} for uniform attention (reach {best['value']:.2f}).")
    else:
        best = mine.loc[mine["value"].idxmax()]
        out.append(f"No head of {model} looks further back than uniform attention beyond its interval at {where}: "
                   f"the furthest, {best['label']}, reaches {best['value']:.2f} ({best['far']}).")
    near = mine[mine["near"] == ""]
    if len(near):
        best = near.loc[near["value"].idxmin()]
        out.append(f"{model} at {where}: {best['label']} looks nearest, {best['distance']:.1f} tokens "
                   f"[{best['ci_low']:.1f}, {best['ci_high']:.1f}] (reach {best['value']:.2f}), "
                   f"{best['distance_early']:.1f} at {_positions(int(best['early_bucket']))}.")
    return out


def _context_table(positions: pd.DataFrame, reach: pd.DataFrame, tops: pd.DataFrame, long: list[str]) -> pd.DataFrame:
    sink = positions[(positions["metric"] == context.SINK) & positions["value"].notna() & (positions["bucket"] >= 1)]
    sink = sink[sink["count"].fillna(0) > 0]
    frames = []
    for model in long:
        mine = sink[sink["model"] == model]
        far = reach[reach["model"] == model]
        if mine.empty and far.empty:
            continue
        chosen: list[tuple[int, int]] = []
        if len(mine):
            late = mine[mine["bucket"] == mine["bucket"].max()]
            late = late.sort_values(["value", "layer", "head"], ascending=[False, True, True], kind="stable")
            chosen += list(zip(late["layer"].head(CONTEXT_ROWS), late["head"].head(CONTEXT_ROWS)))
        if len(far):
            longest = far.sort_values(["value", "layer", "head"], ascending=[False, True, True], kind="stable")
            chosen += list(zip(longest["layer"].head(CONTEXT_ROWS), longest["head"].head(CONTEXT_ROWS)))
        chosen = list(dict.fromkeys((int(a), int(b)) for a, b in chosen))
        early_b = int(mine["bucket"].min()) if len(mine) else None
        late_b = int(mine["bucket"].max()) if len(mine) else None
        at = mine.set_index(["layer", "head", "bucket"])["value"]
        reached = far.set_index(["layer", "head"])
        for layer, head in chosen:
            frames.append({
                "model": model, "head": f"L{layer}H{head}",
                "sink early": fmt_cell(at.get((layer, head, early_b), np.nan)) if early_b is not None else "–",
                "sink late": fmt_cell(at.get((layer, head, late_b), np.nan)) if late_b is not None else "–",
                "distance early": (f"{reached.loc[(layer, head), 'distance_early']:.1f}"
                                   if (layer, head) in reached.index else "–"),
                "distance late": (f"{reached.loc[(layer, head), 'distance']:.1f}"
                                  if (layer, head) in reached.index else "–"),
                "reach": fmt_cell(reached.loc[(layer, head), "value"]) if (layer, head) in reached.index else "–",
            })
    frame = pd.DataFrame(frames, columns=["model", "head", "sink early", "sink late", "distance early",
                                          "distance late", "reach"])
    return frame.drop(columns="model") if len(long) == 1 else frame


def shown_elsewhere(comparison: Comparison) -> dict[str, set[str]]:
    """Table name -> the metrics of it that `context_section` and `movement_section` show, so that the report's
    "other tables" leaves them out."""
    out: dict[str, set[str]] = {}
    if "positions" in comparison.frames and context.long_models(comparison["positions"]):
        out["positions"] = {context.SINK, context.DISTANCE}
    if "value" in comparison.frames and len(movement.value_means(comparison.heads, comparison["value"])):
        out["value"] = set(movement.value_means(comparison.heads, comparison["value"])["metric"])
    if "weights" in comparison.frames:
        weights = comparison["weights"]
        if ((weights["metric"] == movement.COPYING) & weights["value"].notna()).any():
            out["weights"] = {movement.COPYING}
    return out
