"""The report's figure sections: each takes the runs side by side, draws its PNGs and returns document blocks.

`headscan.report.build` lays these out with the text sections. Every figure is drawn by `headscan.plots` and sized
so that, shown at `DISPLAY` CSS pixels per PNG pixel, it fits the page's text column (`PAGE_WIDTH`) without
being shrunk: wide content wraps onto more rows instead, so tick labels stay at their drawn size (8 pt, about
10 CSS pixels). What a metric is measured in, its striking end and when it is 0 by construction come from the
metric registry, through `headscan.analysis.ranking`.

This module chooses no finding (see `headscan.analysis`) and loads no model (see `headscan.report.examples`).
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
from ..analysis.findings import run_differences, run_pairs
from ..analysis.ranking import WIDE_CI, fmt_score, striking_order, top_heads, why_structural
from ..analysis.runs import Comparison
from ..metrics import describe
from ..plots import heatmaps as figures
from ..plots import profiles as charts
from ..tables.folders import fitting
from .document import Bullets, Figures, Heading, Note, Table, Text

if TYPE_CHECKING:  # the report only reads what headscan.report.examples computed; it never imports the models
    from .examples import ExampleAttention, Examples

__all__ = ["Pngs", "DPI", "DISPLAY", "PAGE_WIDTH", "name_part", "structural", "examples_section", "induction_section",
           "differences_section", "heatmaps_section", "offsets_section", "prev_next_section", "entropy_section",
           "heatmap_rows"]

ANNOTATE_TOP = 3  # heads annotated in each heatmap
OFFSET_METRICS = ("prev_token", "self", "next_token")  # the metrics an offset profile explains: d = -1, 0, +1
OFFSET_TOP = 3  # heads drawn in each offset profile
DIFFERENCE_METRICS = 4  # at most this many metrics drawn per pair of runs: those that differ most
DIFFERENCE_ROWS = 20  # rows of the table of heads whose intervals do not overlap
OWN_SECTION = (movement.DLA, movement.DLA_POSITIVE)  # heads-table metrics drawn in "What heads move", not heatmaps
DPI = 130
DISPLAY = 0.7  # on the page, a figure's PNG pixels are shown at this scale (about 91 CSS pixels per inch)
PAGE_WIDTH = 1100  # CSS pixels of the page's text column
MAX_WIDTH = PAGE_WIDTH / DISPLAY / DPI  # inches: the widest figure shown without shrinking (about 12.1)


class Pngs(dict):
    """Figure file name -> PNG bytes, names kept distinct."""

    def add(self, name: str, fig: Figure) -> str:
        base = name = fitting(name)  # names made of run and model names can pass the file system's 255 bytes
        n = 2
        while name in self:
            name = base.removesuffix(".png") + f"-{n}.png"
            n += 1
        self[name] = palette_png(fig)
        return name


def palette_png(fig: Figure) -> bytes:
    """`fig` as a PNG of at most 256 colours: a third of the bytes of matplotlib's RGBA PNG, and the same to the
    eye (a colormap has 256 colours; anti-aliased edges take the nearest). No "Software" entry and no date, so
    the same figure gives the same bytes."""
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    buf.seek(0)
    with Image.open(buf) as image:
        rgba = image.convert("RGBA")
    flat = Image.alpha_composite(Image.new("RGBA", rgba.size, "white"), rgba).convert("RGB")
    palette = flat.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    out = io.BytesIO()
    palette.save(out, format="PNG", optimize=True)
    return out.getvalue()


def name_part(name: str) -> str:
    """A run or model name as part of a file or folder name (a figure's, a report's).

    >>> name_part("run:meta-llama/Llama-3.2-1B")
    'run-meta-llama-Llama-3.2-1B'
    """
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
    drawn = list(examples.drawn)
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


def induction_section(comparison: Comparison, examples: Examples | None, pngs: Pngs) -> list:
    """Induction and duplicate-token heads: their strongest heads, and the induction example where drawn."""
    if "induction" not in comparison.metrics or examples is None or not examples.repeated_text:
        return []
    blocks: list = [
        Heading(2, "Induction heads"),
        Text(f"Each model's strongest head on `induction` whose value lies beyond chance (not thin), on a repeated "
             f"sequence: \u201c{examples.repeated_text}\u201d. In the second copy a head that matches prefixes "
             "attends to the token that followed the current token in the first copy: a diagonal stripe one step "
             "right of the first copy's diagonal. Attention alone makes it prefix-matching; the role \u201cinduction"
             "\u201d also asks for evidence that it copies what it attends to (see the roles under the atlas). "
             "`induction` and `duplicate_token` need repeated tokens to score; the `repeat-random` corpus gives "
             "them."),
    ]
    shown = list(examples.induction)
    if shown:
        name = pngs.add("induction_example.png", _attention_figure(shown))
        blocks.append(Figures([name], "Heads beyond chance on `induction`, on the repeated sequence: " + "; ".join(
            _evidence(e) for e in shown) + "."))
    drawn = {e.model for e in shown}
    missing = [m.name for m in comparison.models if m.name not in drawn
               and (comparison.heads["model"] == m.name).any()]
    if missing:
        top = top_heads(comparison.heads[comparison.heads["model"].isin(missing)], metric="induction", n=1)
        said = [f"{row.model}: no head lies beyond chance on `induction`; the strongest, {row.label} "
                f"{fmt_score('induction', row.value)} (chance {fmt_score('induction', row.chance)}), {row.unsupported}."
                for row in top.itertuples()]
        if said:
            blocks.append(Bullets(said))
    return blocks


# --- differences between runs ---------------------------------------------------------------------------


def fmt_cell(value: float) -> str:
    """A number in a table cell: three decimals, "–" for NaN."""
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
        bounded = describe(metric).bounded
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

            def draw(part, name, ax, cbar, metric=metric, vmax=vmax):
                n_layers = int(part["layer"].max()) + 1
                figures.head_heatmap(part, model=name, metric=metric, ax=ax, vmin=0.0, vmax=vmax,
                                     annotate_top=ANNOTATE_TOP, cbar=cbar,
                                     title=f"{name} ({comparison.model(name).family}, {n_layers} layers)")

            files = heatmap_rows([(m.name, part) for m, part in drawable], pngs, f"heatmap_{metric}", draw)
            scale = "0 to 1, one scale for every model" if bounded else f"0 to {vmax:.2f}, one scale for every model"
            blocks.append(Figures(files, f"`{metric}` by layer and head; colour: {describe(metric).unit}, {scale}; "
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
                             f"Attention entropy ({describe('entropy').unit}) of every head by relative depth (layer "
                             "/ (layers - 1): 0 the first layer, 1 the last), so models of different depth compare "
                             "over their whole depth; the line is the mean over a layer's heads. Low entropy is "
                             "focused attention.")]


# --- rows of layer x head heatmaps ------------------------------------------------------------------------


def heatmap_rows(drawable: list, pngs: Pngs, name: str, draw) -> list[str]:
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
        suffix = "" if len(row) == len(drawable) else "_" + "_".join(name_part(drawable[i][0]) for i in row)
        files.append(pngs.add(f"{name}{suffix}.png", fig))
    return files
