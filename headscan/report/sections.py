"""The report's figure sections: each takes the runs side by side, draws its PNGs and returns document blocks.

`headscan.report` lays these out with the text sections. Every figure is drawn by `headscan.figures` and sized
so that, shown at `DISPLAY` CSS pixels per PNG pixel, it fits the page's text column (`PAGE_WIDTH`) without
being shrunk: wide content wraps onto more rows instead, so tick labels stay at their drawn size (8 pt, about
10 CSS pixels). What a metric is measured in, its striking end and when it is 0 by construction come from the
metric registry, through `headscan.findings`.

This module chooses no finding (see `headscan.findings`) and loads no model (see `headscan.examples`).
"""

from __future__ import annotations

import io
import math
import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..analysis import movement
from ..analysis import positions as context
from ..plots import heatmaps as figures
from ..plots import profiles as charts
from .document import Bullets, Figures, Heading, Note, Table, Text
from ..analysis.findings import WIDE_CI, fmt_score, run_differences, run_pairs, striking_order, top_heads, why_structural
from ..analysis.runs import Comparison
from ..analysis.syntax import DIRECTIONS, MIN_SHARE, best_heads, direction_text, syntax_display, syntax_findings

if TYPE_CHECKING:  # the report only reads what headscan.examples computed; it never imports the models
    from .examples import ExampleAttention, Examples

__all__ = ["Pngs", "DPI", "DISPLAY", "PAGE_WIDTH", "slug", "structural", "examples_section", "induction_section",
           "differences_section", "heatmaps_section", "offsets_section", "prev_next_section", "entropy_section",
           "syntax_section", "context_section", "movement_section", "shown_elsewhere"]

ANNOTATE_TOP = 3  # heads annotated in each heatmap
OFFSET_METRICS = ("prev_token", "self", "next_token")  # the metrics an offset profile explains: d = -1, 0, +1
OFFSET_TOP = 3  # heads drawn in each offset profile
DIFFERENCE_METRICS = 4  # at most this many metrics drawn per pair of runs: those that differ most
DIFFERENCE_ROWS = 20  # rows of the table of heads whose intervals do not overlap
CONTEXT_TOP = 3  # sink heads named per model in "Attention along the context"
CONTEXT_ROWS = 5  # heads per model and ranking in its table (largest sink share, longest reach)
COPYING_TOP = 3  # copying heads named per model
DLA_TOP = 5  # heads per model in the direct logit attribution table
OWN_SECTION = (movement.DLA, movement.DLA_POSITIVE)  # heads-table metrics drawn in "What heads move", not heatmaps
DPI = 130
DISPLAY = 0.7  # on the page, a figure's PNG pixels are shown at this scale (about 91 CSS pixels per inch)
PAGE_WIDTH = 1100  # CSS pixels of the page's text column
MAX_WIDTH = PAGE_WIDTH / DISPLAY / DPI  # inches: the widest figure shown without shrinking (about 12.1)


class Pngs(dict):
    """Figure file name -> PNG bytes, names kept distinct."""

    def add(self, name: str, fig: Figure) -> str:
        base, n = name, 2
        while name in self:
            name = base.removesuffix(".png") + f"-{n}.png"
            n += 1
        buf = io.BytesIO()
        # No "Software" entry and no date: the same figure gives the same bytes.
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
        self[name] = buf.getvalue()
        return name


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "model"


def _rows(comparison: Comparison, model: str, metric: str) -> pd.DataFrame:
    heads = comparison.heads
    return heads[(heads["model"] == model) & (heads["metric"] == metric)]


def structural(comparison: Comparison, model: str, metric: str) -> str | None:
    """Why `model`'s `metric` is 0 or undefined for every head by construction, or None."""
    m = comparison.model(model)
    return why_structural(_rows(comparison, model, metric), metric, family=m.family, provenance=m.provenance)


def _shape(comparison: Comparison, model: str) -> tuple[int, int]:
    part = comparison.heads[comparison.heads["model"] == model]
    return int(part["layer"].max()) + 1, int(part["head"].max()) + 1


def _wrap(widths: list[float], limit: float = MAX_WIDTH) -> list[list[int]]:
    """Indices of panels of the given widths, in rows no wider than `limit` (each row at least one panel)."""
    rows, row, used = [], [], 0.0
    for i, width in enumerate(widths):
        if row and used + width > limit:
            rows.append(row)
            row, used = [], 0.0
        row.append(i)
        used += width
    return rows + [row] if row else rows


# --- example attention ------------------------------------------------------------------------------------


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
        figures.attention_matrix(p.tokens, p.pattern, causal=p.family == "causal", ax=ax, cbar=False,
                                 title=f"{p.model} {p.label}: {p.metric} {fmt_score(p.metric, p.value)}\n({p.family})")
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
    drawn = list(examples.drawn)
    if drawn:
        name = pngs.add("looking_both_ways.png", _attention_figure(_both_ways(drawn)))
        blocks.append(Figures([name], "Looking both ways: " + "; ".join(
            f"{e.model} {e.label} ({e.metric} {fmt_score(e.metric, e.value)} over the corpus)" for e in drawn)
            + ". One shared 0-1 colour scale; blank cells are keys a causal model cannot see."))
    if examples.failed:
        total = len({e.model for e in drawn}) + len(examples.failed)
        blocks.append(Note(f"The example attention could not be drawn for {len(examples.failed)} of {total} models; "
                           "everything else here needs only the tables. Why:"))
        blocks.append(Bullets(list(examples.failed)))
    return blocks


def induction_section(comparison: Comparison, examples: Examples | None, pngs: Pngs) -> list:
    """Induction and duplicate-token heads: their strongest heads, and the induction example where drawn."""
    if "induction" not in comparison.metrics or examples is None or not examples.repeated_text:
        return []
    blocks: list = [
        Heading(2, "Induction heads"),
        Text(f"Each model's strongest induction head on a repeated sequence: \u201c{examples.repeated_text}\u201d. "
             "In the second copy an induction head attends to the token that followed the current token in the "
             "first copy: a diagonal stripe one step right of the first copy's diagonal. `induction` and "
             "`duplicate_token` need repeated tokens to score; the `repeat-random` corpus gives them."),
    ]
    shown = list(examples.induction)
    if shown:
        name = pngs.add("induction_example.png", _attention_figure(shown))
        blocks.append(Figures([name], "Induction heads on the repeated sequence: " + "; ".join(
            f"{e.model} {e.label} (induction {fmt_score('induction', e.value)} over the corpus)" for e in shown)
            + "."))
    return blocks


# --- differences between runs ---------------------------------------------------------------------------


def _fmt(value: float) -> str:
    return "–" if pd.isna(value) else f"{value:.3f}"


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
        bounded = diff[diff["metric"].map(figures.is_bounded).astype(bool) & diff["difference"].notna()]
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
            n_layers, n_heads = _shape(comparison, first)
            ncols = min(2, len(chosen))
            nrows = math.ceil(len(chosen) / ncols)
            width = min(MAX_WIDTH, ncols * min(max(3.4, 0.36 * n_heads + 1.9), 6.0))
            height = min(max(2.4, 0.16 * n_layers + 1.3), 5.2)
            fig = Figure(figsize=(width, height * nrows), layout="constrained")
            axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
            for ax, metric in zip(axes, chosen):
                figures.difference_heatmap(diff, metric=metric, ax=ax)
            for ax in axes[len(chosen):]:
                ax.set_visible(False)
            fig.suptitle(f"{second} \u2212 {first}")
            name = pngs.add(f"difference_{slug(second)}_{slug(first)}.png", fig)
            blocks.append(Figures([name], f"{second} minus {first}, head by head; blue: lower in {second}, red: "
                                          "higher; each panel has its own symmetric scale; \u2022: intervals do not "
                                          "overlap."))
        if len(apart):
            top = apart.reindex(apart["difference"].abs().sort_values(ascending=False, kind="stable").index)
            top = top.head(DIFFERENCE_ROWS)
            frame = pd.DataFrame({
                "metric": top["metric"], "head": top["label"],
                first: top["value_a"].map(_fmt), f"{first} low": top["ci_low_a"].map(_fmt),
                f"{first} high": top["ci_high_a"].map(_fmt),
                second: top["value_b"].map(_fmt), f"{second} low": top["ci_low_b"].map(_fmt),
                f"{second} high": top["ci_high_b"].map(_fmt),
                "difference": top["difference"].map(lambda v: f"{v:+.3f}"),
            })
            numeric = tuple(c for c in frame.columns if c not in ("metric", "head"))
            blocks.append(Table(frame.reset_index(drop=True), numeric=numeric, sortable=True,
                                note=(f"All {len(apart)} head scores" if len(frame) == len(apart) else
                                      f"The {len(frame)} largest differences of the {len(apart)} head scores")
                                + " whose 95% intervals do not overlap; low and high are the interval's ends. Click a "
                                  "heading to sort."))
    return blocks


# --- heatmaps -----------------------------------------------------------------------------------------------


def heatmaps_section(comparison: Comparison, pngs: Pngs) -> list:
    blocks: list = [
        Heading(2, "Heatmaps"),
        Text(f"One figure per metric, every model side by side at the same height, so rows line up by relative "
             f"depth: layers are rows (layer 0 at the top), heads columns. The {ANNOTATE_TOP} most striking heads "
             "of each model carry their value: the highest, or the lowest where the registry marks low as "
             "striking. Grey cells are undefined. Where a metric is 0 or undefined for every head of a model by "
             "construction, one sentence says why instead of a grid."),
    ]
    for metric in comparison.metrics:
        if metric in OWN_SECTION:  # drawn in "What heads move", on their own scale
            continue
        rows = comparison.heads[comparison.heads["metric"] == metric]
        bounded = figures.is_bounded(metric)
        notes, drawable = [], []
        for m in comparison.models:
            part = rows[rows["model"] == m.name]
            if part.empty:
                continue
            reason = structural(comparison, m.name, metric)
            if reason is not None:
                notes.append(f"{m.name}: {reason}.")
            elif part["value"].isna().all():
                notes.append(f"{m.name}: undefined for every head; no query of the corpus counts for it.")
            else:
                drawable.append((m, part))
        blocks.append(Heading(3, metric))
        if drawable:
            # One scale per metric across models: 0-1 for bounded metrics, 0 to the largest value otherwise.
            finite = pd.concat([part["value"] for _, part in drawable]).dropna()
            vmax = 1.0 if bounded else (float(finite.max()) if len(finite) and finite.max() > 0 else 1.0)
            widths = [min(max(2.6, 0.3 * (int(part["head"].max()) + 1) + 1.1), 7.0) for _, part in drawable]
            files = []
            for row in _wrap([w + 0.3 for w in widths], MAX_WIDTH - 1.0):
                fig = Figure(figsize=(sum(widths[i] for i in row) + 1.0, 4.2), layout="constrained")
                axes = fig.subplots(1, len(row), squeeze=False, width_ratios=[widths[i] for i in row])[0]
                for k, (ax, i) in enumerate(zip(axes, row)):
                    m, part = drawable[i]
                    n_layers = int(part["layer"].max()) + 1
                    figures.head_heatmap(part, model=m.name, metric=metric, ax=ax, vmin=0.0, vmax=vmax,
                                         annotate_top=ANNOTATE_TOP, cbar=k == len(row) - 1,
                                         title=f"{m.name} ({m.family}, {n_layers} layers)")
                    if n_layers > 16:
                        ax.set_yticks(np.arange(0, n_layers, 2) + 0.5, [str(i) for i in range(0, n_layers, 2)])
                suffix = "" if len(row) == len(drawable) else "_" + "_".join(slug(drawable[i][0].name) for i in row)
                files.append(pngs.add(f"heatmap_{metric}{suffix}.png", fig))
            scale = "0 to 1, one scale for every model" if bounded else f"0 to {vmax:.2f}, one scale for every model"
            blocks.append(Figures(files, f"`{metric}` by layer and head; colour: {figures.unit(metric)}, {scale}; "
                                         f"annotated: each model's {ANNOTATE_TOP} {striking_order(metric)} heads."))
        if notes:
            blocks.append(Bullets(notes) if drawable else Text(" ".join(notes)))
    return blocks


# --- offset profiles ----------------------------------------------------------------------------------------


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
            charts.offset_profiles(part, model=m.name, heads=list(top["label"]), ax=ax, title=title)
            drawn = part[part["label"].isin(top["label"])]
            widest = max(widest, float((drawn["ci_high"] - drawn["ci_low"]).max(skipna=True) or 0.0))
        for ax in row:
            ax.label_outer()
    name = pngs.add("offset_profiles.png", fig)
    band = (f"the widest drawn is {widest:.3f}, so most bands are thinner than their line" if widest < 0.02
            else f"the widest drawn is {widest:.3f}")
    return blocks + [Figures([name], "Mean attention by relative offset, one row per model, one column per metric; "
                                     f"the shaded band around each line is its 95% interval ({band}).")]


# --- previous against next, entropy by depth --------------------------------------------------------------


def prev_next_section(comparison: Comparison, palette: dict, pngs: Pngs) -> list:
    blocks: list = [Heading(2, "Previous against next token")]
    if not {"prev_token", "next_token"} <= set(comparison.metrics):
        return blocks + [Note("The tables have no prev_token and next_token metrics to compare.")]
    fig = Figure(figsize=(6.4, 6.2), layout="constrained")
    charts.prev_next_scatter(comparison.heads, ax=fig.subplots(), palette=palette, ci_threshold=WIDE_CI)
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
    charts.entropy_by_depth(comparison.heads, ax=fig.subplots(), palette=palette)
    return blocks + [Figures([pngs.add("entropy_by_depth.png", fig)],
                             f"Attention entropy ({figures.unit('entropy')}) of every head by relative depth (layer "
                             "/ (layers - 1): 0 the first layer, 1 the last), so models of different depth compare "
                             "over their whole depth; the line is the mean over a layer's heads. Low entropy is "
                             "focused attention.")]


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
             "`nmod:poss` is `nmod`; `all` is every word but the root). The baseline is the best fixed offset "
             "d in -3..2 for that relation and direction on the same words (d = -1: the previous word; its "
             "accuracy is what a perfect positional head would score). Heads are 0-indexed L{layer}H{head}: "
             "Clark et al.'s 1-indexed BERT \u201chead 8-10\u201d is L7H9 here."),
    ]
    best = best_heads(syntax)
    if best.empty:
        return blocks + [Note("The syntax table has no scored dependent: the corpus gave no gold syntax (the sweep "
                              "scores relations on CoNLL-U treebanks only).")]
    models = [m.name for m in comparison.models if (best["model"] == m.name).any()]
    best = best[best["model"].isin(models)]
    palette = {**figures.model_palette(models), **palette}
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
        charts.syntax_best_heads(best, direction=direction, relations=shown, ax=ax, palette=palette, legend=False,
                                 title=title)
        ax.set_xlim(-0.6, across - 0.4)  # every row of panels at the same scale
    fig.legend(handles=charts.syntax_legend_handles(models, palette), loc="outside upper center",
               ncols=len(models) + 3, frameon=False, fontsize="small")
    name = pngs.add("syntactic_heads.png", fig)
    beats = best[best["beats"] & ~best["thin"]]
    choice = ", ".join(f"{n_heads[m]} in {m}" for m in models)
    blocks.append(Figures([name], "Per relation (most dependents first, `all` left of the dotted line), each "
                                  "model's most accurate head with its 95% interval, against the best fixed offset "
                                  "(the light bar, its offset d written at its foot), one panel per direction. A "
                                  "filled point's interval lies wholly above the baseline; a hollow one's reaches "
                                  "down to it. Each point is labelled with its head."))
    blocks.append(Text(f"{len(beats)} of {len(best)} best heads beat the best fixed offset beyond their 95% interval "
                       "(the interval's lower end above the baseline). Read them with two cautions: the best head is "
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
                 + ", ".join(f"`{r}` ({int(counts[r]):,})" for r in left) + "; syntax.parquet has them.")
    frame = syntax_display(best, with_model=len(models) > 1)
    numeric = ("accuracy", "95% low", "95% high", "dependents", "baseline", "offset", "margin")
    blocks.append(Table(frame, numeric=numeric, note=note, sortable=True))
    return blocks


# --- attention along the context -------------------------------------------------------------------------------


def _heatmap_row_figures(drawable: list, pngs: Pngs, name: str, draw) -> list[str]:
    """Layer x head heatmaps of (model name, rows), side by side at one height, wrapped to fit the page;
    `draw(rows, model, ax, cbar)` draws one."""
    widths = [min(max(2.6, 0.3 * (int(rows["head"].max()) + 1) + 1.1), 7.0) for _, rows in drawable]
    files = []
    for row in _wrap([w + 0.3 for w in widths], MAX_WIDTH - 1.0):
        fig = Figure(figsize=(sum(widths[i] for i in row) + 1.0, 4.2), layout="constrained")
        axes = fig.subplots(1, len(row), squeeze=False, width_ratios=[widths[i] for i in row])[0]
        for k, (ax, i) in enumerate(zip(axes, row)):
            model, rows = drawable[i]
            draw(rows, model, ax, k == len(row) - 1)
            n_layers = int(rows["layer"].max()) + 1
            if n_layers > 16:
                ax.set_yticks(np.arange(0, n_layers, 2) + 0.5, [str(i) for i in range(0, n_layers, 2)])
        suffix = "" if len(row) == len(drawable) else "_" + "_".join(slug(drawable[i][0]) for i in row)
        files.append(pngs.add(f"{name}{suffix}.png", fig))
    return files


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
             "[CLS]): an attention sink's share; `distance_by_position` is the mean distance attended over, "
             "sum_k A[q, k] |q \u2212 k| in tokens (see the metric definitions)."),
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
            charts.position_profiles(frame, model=m.name, ax=ax, share=sinks,
                                     ylabel="share on the first token" if sinks else "mean distance (tokens)",
                                     title=f"{m.name} ({m.family}): "
                                           + ("first-token share" if sinks else "distance attended over"))
    name = pngs.add("context_by_layer.png", fig)
    blocks.append(Figures([name], "Each model's first-token share (left) and mean distance attended over (right) "
                                  "against the query's position, one line per layer (the mean over its heads), "
                                  "coloured by depth from layer 0 (dark) to the last layer (yellow); position on a "
                                  "log2 axis, each point at its bucket's first position."))
    tops = context.sink_heads(positions, n=CONTEXT_TOP)
    items = []
    for m in models:
        mine = sink[sink["model"] == m.name]
        mine = mine[mine["bucket"] >= 1]
        top = tops[tops["model"] == m.name]
        if mine.empty or top.empty:
            continue
        early, late = int(mine["bucket"].min()), int(mine["bucket"].max())
        model_mean = positions[(positions["model"] == m.name) & (positions["metric"] == context.SINK)]
        mean_at = model_mean.groupby("bucket")["value"].mean()
        heads_text = ", ".join(f"{r.label} {r.value:.2f} ({r.early:.2f} at {_positions(r.early_bucket)})"
                               for r in top.itertuples())
        items.append(f"{m.name}: the mean first-token share over all heads is {mean_at[early]:.2f} at "
                     f"{_positions(early)} and {mean_at[late]:.2f} at {_positions(late)}; the largest at "
                     f"{_positions(late)}: {heads_text}.")
    reach = context.reach(positions)
    reach = reach[reach["model"].isin(long)]
    for m in models:
        mine = reach[reach["model"] == m.name]
        if mine.empty:
            continue
        bucket = int(mine["bucket"].iloc[0])
        far, near = mine.loc[mine["value"].idxmax()], mine.loc[mine["value"].idxmin()]
        items.append(f"{m.name} at {_positions(bucket)}: {far['label']} looks furthest, {far['distance']:.1f} tokens "
                     f"on average (reach {far['value']:.2f}); {near['label']} nearest, {near['distance']:.1f} tokens "
                     f"(reach {near['value']:.2f}), {near['distance_early']:.1f} at {_positions(int(near['early_bucket']))}.")
    if items:
        blocks.append(Bullets(items))
    if len(reach):
        drawable = [(m.name, reach[reach["model"] == m.name]) for m in models if (reach["model"] == m.name).any()]
        top = max(1.0, float(reach["value"].max()))

        def draw(rows, model, ax, cbar):
            figures.value_heatmap(rows, model=model, ax=ax, vmin=0.0, vmax=top, label="reach: distance / position",
                                  cbar=cbar, title=f"{model}: reach at {_positions(int(rows['bucket'].iloc[0]))}")

        files = _heatmap_row_figures(drawable, pngs, "context_reach", draw)
        blocks.append(Figures(files, "Reach of each head: its mean distance attended over at the model's longest "
                                     "bucket divided by that bucket's first position. A head that looks a fixed "
                                     "number of tokens back keeps its distance as the context grows, so its reach is "
                                     "near 0; one that spreads over everything before the query looks further the "
                                     "later the query, with a reach near 0.75 (uniform attention over the context); "
                                     f"one scale, 0 to {top:.2f}; annotated: the {ANNOTATE_TOP} longest reaches."))
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
                "sink early": _fmt(at.get((layer, head, early_b), np.nan)) if early_b is not None else "–",
                "sink late": _fmt(at.get((layer, head, late_b), np.nan)) if late_b is not None else "–",
                "distance early": (f"{reached.loc[(layer, head), 'distance_early']:.1f}"
                                   if (layer, head) in reached.index else "–"),
                "distance late": (f"{reached.loc[(layer, head), 'distance']:.1f}"
                                  if (layer, head) in reached.index else "–"),
                "reach": _fmt(reached.loc[(layer, head), "value"]) if (layer, head) in reached.index else "–",
            })
    frame = pd.DataFrame(frames, columns=["model", "head", "sink early", "sink late", "distance early",
                                          "distance late", "reach"])
    return frame.drop(columns="model") if len(long) == 1 else frame


# --- what heads move -----------------------------------------------------------------------------------------------


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
             "keys so that it reads like attention. The heads metrics computed on it say how much of a sink "
             "survives: much of the attention on [CLS], [SEP] or BOS is a no-op."),
    ]
    sinks = movement.sink_summary(heads, value)
    items = []
    for row in sinks.itertuples():
        what = "[SEP]" if row.metric == "sep" else ("[CLS]" if comparison.model(row.model).family ==
                                                     "bidirectional" else "BOS (first-token)")
        items.append(f"{row.model}: mean {what} share {row.attention:.2f} attention-weighted, {row.value_weighted:.2f} "
                     f"value-weighted, over {row.heads} heads (`{row.metric}`); the largest fall: {row.drop_label}, "
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
            colours = {**figures.model_palette(list(dict.fromkeys(pairs["model"]))), **palette}
            charts.value_weighting_by_depth(pairs, ax=left, palette=colours, metric=metric)
            charts.value_weighting_scatter(movement.paired(heads, value, metric=metric), ax=right, palette=colours,
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
                          "attention-weighted": means["attention"].map(_fmt),
                          "value-weighted": means["value_weighted"].map(_fmt),
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
    if rows.empty:
        return []
    counts = movement.copying_counts(weights)
    top = movement.copying_heads(weights, n=COPYING_TOP)
    blocks: list = [
        Heading(3, "Copying heads"),
        Text("Each head's OV copying score (Olsson et al. 2022), read off the weights alone, with no corpus: "
             "how far what the head writes when it attends to a token raises that same token's logit, from \u22121 "
             "(it lowers it) through 0 to 1 (it copies it). A copying head that attends to a name, say, pushes "
             f"the model to say that name again. Counted as copying: a score above {movement.COPYING_HIGH:g}."),
    ]
    items = []
    for row in counts.itertuples():
        mine = top[top["model"] == row.model]
        embedding = mine["embedding"].dropna()
        named = ", ".join(f"{r.label} {r.value:.2f}" for r in mine.itertuples())
        items.append(f"{row.model}: {row.high} of {row.heads} heads score above {movement.COPYING_HIGH:g} "
                     f"({row.positive} above 0, mean {row.mean:.2f}); the highest: {named}"
                     + (f" (embedding {embedding.iloc[0]})" if len(embedding) else "") + ".")
    blocks.append(Bullets(items))
    drawable = [(m.name, rows[rows["model"] == m.name]) for m in comparison.models if (rows["model"] == m.name).any()]

    def draw(part, model, ax, cbar):
        figures.value_heatmap(part, model=model, ax=ax, vmin=-1.0, vmax=1.0, cmap=figures.SIGNED_CMAP, center=0.0,
                              label="OV copying score", annotate_top=ANNOTATE_TOP, cbar=cbar,
                              title=f"{model} ({comparison.model(model).family})")

    files = _heatmap_row_figures(drawable, pngs, "copying", draw)
    blocks.append(Figures(files, "OV copying score by layer and head, one scale from \u22121 (blue: lowers the "
                                 "attended token's logit) through 0 (white) to 1 (red: copies it); annotated: each "
                                 f"model's {ANNOTATE_TOP} highest."))
    return blocks


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
        best = part.iloc[0]
        share = "" if pd.isna(best["positive"]) else f", positive at {best['positive']:.0%} of queries"
        items.append(f"{model}: {best['label']} adds {best['dla']:+.2f} logits to the next token on average{share}.")
    blocks.append(Bullets(items))
    frame = pd.DataFrame({
        "model": top["model"], "head": top["label"], "logits": top["dla"].map(lambda v: f"{v:+.3f}"),
        "95% low": top["ci_low"].map(lambda v: "–" if pd.isna(v) else f"{v:+.3f}"),
        "95% high": top["ci_high"].map(lambda v: "–" if pd.isna(v) else f"{v:+.3f}"),
        "positive share": top["positive"].map(_fmt),
    })
    if top["model"].nunique() == 1 and len(comparison.models) == 1:
        frame = frame.drop(columns="model")
    blocks.append(Table(frame, numeric=("logits", "95% low", "95% high", "positive share"), sortable=True,
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
