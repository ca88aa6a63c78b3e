"""The section "Syntactic heads" (Clark et al. 2019, from syntax.parquet): per relation, each model's best head
against the best fixed offset, as a figure, findings and a sortable table.
"""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure

from ...analysis.formats import code
from ...analysis.runs import Comparison
from ...analysis.syntax import DIRECTIONS, MIN_SHARE, best_heads, direction_text, syntax_display, syntax_findings
from ...plots.style import model_palette
from ...plots.syntax import syntax_best_heads, syntax_legend_handles
from ..document import Bullets, Figures, Heading, Note, Table, Text
from ..figures import MAX_WIDTH, Pngs
from . import Context, register_section

__all__ = ["syntax_section"]

# --- syntactic heads -----------------------------------------------------------------------------------------

_SYNTAX_TITLES = {
    "dependent_to_head": "dependent \u2192 head: is the word the dependent attends to most its head?",
    "head_to_dependent": "head \u2192 dependent: is the word attending most to the dependent its head?",
}


# What the section says first: how accuracy, the baseline and "beats" are read
_INTRO = ("Does a head attend from a word to its syntactic head? As Clark et al. (2019): attention between words "
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
          "the words the dependent could pick. A causal model's word cannot attend to a word to its right, so "
          "its plain accuracy counts dependents whose head it could never pick; a causal model is judged here on "
          "the dependents whose head the attending word can see (the `_visible` directions, which only a "
          "causal model's table has; "
          "\u201cseen\u201d beside the dependents), a bidirectional one on all. A head beats its baseline when "
          "the paired difference between the two on the same dependents (head's hits minus the offset's, "
          "per document) has its 95% interval above 0. Chosen and scored on the same words, the best of a "
          "model's heads against the best of six offsets would look better than it is (the winner's curse), so "
          "that difference is cross-fitted: the documents are split in two by the parity of their index, each "
          "half is scored with the head and the offset chosen on the other half, and the two are added up, the "
          "interval over every document with those choices held fixed; the in-sample difference (head and "
          "offset chosen on the whole corpus) is shown beside it. Heads are 0-indexed L{layer}H{head}: Clark et "
          "al.'s 1-indexed "
          "BERT \u201chead 8-10\u201d is L7H9 here.")


# What the sortable table's comparison columns hold (`headscan.analysis.syntax.syntax_display`): each difference
# beside its own accuracy and baseline, held out where the table records the cross-fit, else in sample
_HELD_OUT_NOTE = ("held out (head and offset chosen on the other half of the documents, the two halves added up; "
                  "the head column adds the two halves' choices where they differ): the accuracy of the head chosen "
                  "on the other half, the baseline (each half scored with the offset best on the other) and "
                  "held-out vs baseline, the first minus the second on the same dependents, with margin, the low "
                  "end of its 95% interval over documents, and beats: the margin is above 0; then in sample (head "
                  "and offset d chosen on every document): the baseline, the offset d and in-sample vs baseline, "
                  "the accuracy minus that baseline.")
_IN_SAMPLE_NOTE = ("the baseline, the offset d best on the whole corpus, vs baseline: the head's accuracy minus the "
                   "offset's on the same dependents, and margin: the low end of its 95% interval over documents "
                   "(tables without it: the head's interval's low end minus the baseline); beats: the margin is "
                   "above 0.")


def _syntax_slot(models: int) -> float:
    """Inches per relation in the syntactic-heads figure: room for each model's point and rotated head label."""
    return max(0.36, 0.17 * models + 0.06)


def _balanced(n: int, per_row: int) -> list[list[int]]:
    """Indices 0..n-1 in as few rows of at most `per_row` as can be, the rows as even as can be."""
    rows = max(1, math.ceil(n / max(per_row, 1)))
    size = math.ceil(n / rows)
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


def _syntax_figure(best: pd.DataFrame, models: list[str], palette: dict) -> Figure:
    """Each model's best head per relation against the best fixed offset: one panel per direction and row of
    relations, every row at the same scale."""
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
        syntax_best_heads(best, direction=direction, relations=shown, ax=ax, palette=palette, legend=False,
                          title=title)
        ax.set_xlim(-0.6, across - 0.4)  # every row of panels at the same scale
    fig.legend(handles=syntax_legend_handles(models, palette), loc="outside upper center",
               ncols=len(models) + 3, frameon=False, fontsize="small")
    return fig


def _rule_and_caution(best: pd.DataFrame, choice: str) -> tuple[str, str]:
    """What "beats" means for `best` (`best_heads`), and the caution to read the count with; `choice` names how
    many heads each model's best was chosen from."""
    held = best["held_out"]
    if held.any():
        rule = f"the cross-fitted paired difference's interval above 0{'' if held.all() else ' where recorded'}"
        in_sample = int((best["vs_baseline_in_sample_low"] > 0).sum())
        return rule, (f"Held out, the head and the offset are chosen on the other half of the documents, so a head "
                      f"that was only the luckiest of a model's heads ({choice}) on these words does not pass; in "
                      f"sample, head and offset chosen on every document, {in_sample} would. The head's own "
                      "accuracy and interval are in sample; its held-out accuracy is in the table.")
    # tables written without the paired comparison are judged on the head's own interval
    rule = ("the paired difference's interval above 0" if best["vs_baseline_low"].notna().any()
            else "the interval's lower end above the baseline")
    return rule, (f"Read them with two cautions: the best head is the most accurate of a model's heads ({choice}) "
                  "on the same words, so its accuracy is a little optimistic and its interval is that head's own, "
                  "not widened for the choice; and the baseline is itself the best of six offsets on these words.")


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
        Text(_INTRO),
    ]
    best = best_heads(syntax)
    if best.empty:
        return blocks + [Note("The syntax table has no scored dependent: the corpus gave no gold syntax (the sweep "
                              "scores relations on CoNLL-U treebanks only).")]
    models = [m.name for m in comparison.models if (best["model"] == m.name).any()]
    best = best[best["model"].isin(models)]
    palette = {**model_palette(models), **palette}
    relations = list(dict.fromkeys(best["relation"]))
    name = pngs.add("syntactic_heads.png", _syntax_figure(best, models, palette))
    beats = best[best["beats"]]  # as the table's "beats" column counts them
    found = beats[beats["unsupported"] == ""]
    choice = ", ".join(f"{n_heads[m]} in {m}" for m in models)
    rule, caution = _rule_and_caution(best, choice)
    blocks.append(Figures([name], "Per relation (most dependents first, `all` left of the dotted line), each "
                                  "model's most accurate head with its 95% interval, against the best fixed offset "
                                  "(the light bar, cross-fitted, the offset d best on the whole corpus written at its "
                                  "foot), one panel per direction. A filled point beats the baseline (its "
                                  "cross-fitted paired difference's interval lies above 0, where the table records "
                                  "it); a hollow one does not. Each point is labelled with its head."))
    blocks.append(Text(f"{len(beats)} of {len(best)} best heads {'beats' if len(beats) == 1 else 'beat'} the best "
                       "fixed offset beyond their 95% interval "
                       f"({rule}); {len(found)} of these "
                       + ("is a finding, which also needs" if len(found) == 1 else "are findings, which also need")
                       + f" the interval above chance and support that is not thin. {caution}"))
    sentences = syntax_findings(best)
    items = [sentence for model in models for sentence in sentences.get(model, [])]
    if items:
        blocks.append(Bullets(items))
    counts = syntax[syntax["count"] > 0].groupby("relation")["count"].max()
    left = sorted((r for r in counts.index if r not in relations), key=lambda r: (-counts[r], r))
    note = ("One row per model, relation and direction: the most accurate head (ties to the head whose interval "
            "starts higher, then the lower layer and head), its accuracy and 95% interval, in sample, and the "
            "relation's dependents (\u201cseen\u201d: only those whose head the query can see); then "
            + (_HELD_OUT_NOTE if best["held_out"].any() else _IN_SAMPLE_NOTE)
            + " Click a heading to sort.")
    if best["thin"].any():
        note += " \u2021: resting on thin support; no finding rests on it."
    if left:
        note += (f" Left out, each under {MIN_SHARE:.0%} of all dependents: "
                 + ", ".join(f"{code(r)} ({int(counts[r]):,})" for r in left) + "; syntax.parquet has them.")
    frame = syntax_display(best, with_model=len(models) > 1)
    numeric = [c for c in frame.columns if c not in ("model", "relation", "direction", "head", "beats", "no claim")]
    blocks.append(Table(frame, numeric=numeric, note=note, sortable=True))
    return blocks


@register_section("syntactic heads", order=90, shown=lambda comparison: "syntax" in comparison.frames)
def syntactic_heads(context: Context) -> list:
    return syntax_section(context.comparison, context.palette, context.pngs)
