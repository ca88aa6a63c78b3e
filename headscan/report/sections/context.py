"""The section "Attention along the context" (positions.parquet): how the first-token (sink) share and the distance
attended over change with the query's position, per model and layer, and each head's reach.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...analysis import positions
from ...analysis.claims import control_range, untested_text
from ...analysis.runs import Comparison
from ...plots import heatmaps, profiles
from ..document import Bullets, Figures, Heading, Note, Table, Text
from ..figures import ANNOTATE_TOP, MAX_WIDTH, Pngs, fmt_cell, heatmap_rows
from . import Context, register_section

__all__ = ["context_section"]

CONTEXT_TOP = 3  # sink heads named per model in "Attention along the context"
CONTEXT_ROWS = 5  # heads per model and ranking in its table (largest sink share, longest reach)


def _positions(bucket: int) -> str:
    return "position 0" if bucket == 0 else ("position 1" if bucket == 1 else
                                             f"positions {bucket}\u2013{2 * bucket - 1}")


def _profiles_figure(table: pd.DataFrame, models: list) -> Figure:
    """Each model's first-token share and distance past the first token against the query's position, one line
    per layer, with uniform attention's value on the same queries."""
    sink = positions.layer_profiles(table, metric=positions.SINK)
    distance = positions.layer_profiles(table, metric=positions.DISTANCE)
    panels = [(metric, frame) for metric, frame in ((positions.SINK, sink), (positions.DISTANCE, distance))
              if len(frame)]
    fig = Figure(figsize=(min(MAX_WIDTH, 5.0 * len(panels) + 0.6), 3.2 * len(models) + 0.2), layout="constrained")
    axes = fig.subplots(len(models), len(panels), squeeze=False)
    for row, m in zip(axes, models):
        for ax, (metric, frame) in zip(row, panels):
            if not (frame["model"] == m.name).any():
                ax.set_visible(False)
                continue
            sinks = metric == positions.SINK
            chance = positions.chance_profile(table, metric=metric)
            profiles.position_profiles(frame, model=m.name, ax=ax, share=sinks, chance=chance,
                                       ylabel="share on the first token" if sinks else "mean distance (tokens)",
                                       title=f"{m.name} ({m.family}): "
                                             + ("first-token share" if sinks else "distance past the first token"))
    return fig


def context_section(comparison: Comparison, pngs: Pngs) -> list:
    """How the first-token (sink) share and the distance attended over change with the query's position: per
    model, one line per layer; the heads with the largest sink share late in the context; each head's reach;
    a sortable table. Nothing unless some model's positions table has at least `positions.MIN_BUCKETS`
    non-empty buckets (a corpus of short sentences would draw a meaningless section)."""
    if "positions" not in comparison.frames:
        return []
    table = comparison["positions"]
    long = positions.long_models(table)
    if not long:
        return []
    filled = positions.filled_buckets(table)
    models = [m for m in comparison.models if m.name in long]
    blocks: list = [
        Heading(2, "Attention along the context"),
        Text("How attention changes with the query's position in long segments. Queries are grouped into buckets "
             "by position: bucket b holds positions b to 2b \u2212 1 (bucket 0 is position 0 alone), so the buckets "
             "double, 1, 2, 4, 8, ... up to the sweep's max_len, and each is a mean over the queries of the corpus "
             "that fall in it. `first_token_by_position` is the share of attention on the first token (BOS or "
             "[CLS]): an attention sink's share; `distance_by_position` is the mean distance attended over past the "
             "first token, sum_{k \u2265 1} A[q, k] |q \u2212 k| in tokens (see the metric definitions). Statements "
             "are made only at buckets whose rows are not thin, about heads beyond chance; the sweep tests no row "
             "of positions.parquet, and uniform attention is no null (untrained heads leave it too), so each "
             "statement says whether the run's random-init controls' heads of the same layer reach as far, or that "
             "it describes and was not tested."),
    ]
    short = [f"{name} ({n})" for name, n in filled.items() if name not in long]
    name = pngs.add("context_by_layer.png", _profiles_figure(table, models))
    blocks.append(Figures([name], "Each model's first-token share (left) and mean distance attended over past the "
                                  "first token (right) against the query's position, one line per layer (the mean "
                                  "over its heads), with uniform attention's value on the same queries as a dashed "
                                  "black line (chance: a share falls along the context for uniform attention too, "
                                  "1/(q+1) at position q of a causal model, so compare each line with it), "
                                  "coloured by depth from layer 0 (dark) to the last layer (yellow); position on a "
                                  "log2 axis, each point at its bucket's first position."))
    tops = positions.sink_heads(table, n=CONTEXT_TOP)
    items = []
    for m in models:
        items += _sink_sentences(m.name, table, tops)
    reach = positions.reach(table)
    reach = reach[reach["model"].isin(long)]
    for m in models:
        items += _reach_sentences(m.name, reach, table)
    if items:
        blocks.append(Bullets(items))
    if len(reach):
        drawable = [(m.name, reach[reach["model"] == m.name]) for m in models if (reach["model"] == m.name).any()]
        top = max(1.0, float(reach["value"].max()))

        def draw(rows, model, ax, cbar):
            heatmaps.value_heatmap(rows, model=model, ax=ax, vmin=0.0, vmax=top, label="reach: distance / uniform's",
                                  cbar=cbar, title=f"{model}: reach at {_positions(int(rows['bucket'].iloc[0]))}")

        files = heatmap_rows(drawable, pngs, "context_reach", draw)
        blocks.append(Figures(files, "Reach of each head at the model's longest bucket that is not thin: its mean "
                                     "distance attended over past the first token, divided by the same under uniform "
                                     "attention over the keys each query sees (the chance column). Uniform attention "
                                     "reaches 1; a head that looks a fixed number of tokens back, near 0, and so does a "
                                     "sink, whose attention on the first token is left out (the first-token share "
                                     f"shows it); one scale, 0 to {top:.2f}; annotated: the {ANNOTATE_TOP} longest "
                                     "reaches."))
    rows = _context_table(table, reach, tops, long)
    if len(rows):
        blocks.append(Table(rows, numeric=tuple(c for c in rows.columns if c not in ("model", "head")), sortable=True,
                            note=f"Per model, the {CONTEXT_ROWS} heads with the largest first-token share at the "
                                 f"longest bucket and the {CONTEXT_ROWS} with the longest reach; early: the first "
                                 "bucket after position 0, late: the longest. Click a heading to sort."))
    if short:
        blocks.append(Note("Not drawn, with fewer than "
                           f"{positions.MIN_BUCKETS} non-empty buckets (too short a context): "
                           + ", ".join(short) + "."))
    return blocks


def _sink_sentences(model: str, table: pd.DataFrame, tops: pd.DataFrame) -> list[str]:
    """The mean first-token share at the first and the last bucket a statement may be made at, each beside its
    chance, and the largest sinks there (heads that may carry a claim)."""
    rows = table[(table["model"] == model) & (table["metric"] == positions.SINK) & table["value"].notna()]
    rows = rows[(rows["bucket"] >= 1) & (rows["count"].fillna(0) > 0)]
    solid = positions.solid_buckets(rows) if len(rows) else pd.Series(dtype=bool)
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
            f"{_positions(late)}, beyond chance: {heads_text}; " + _null_said(top.assign(metric=positions.SINK), table)
            + "."]


def _null_said(rows: pd.DataFrame, table: pd.DataFrame) -> str:
    """What `rows` (heads of one model at one bucket, with ``metric`` and ``bucket``) lie against: the range of the
    model's random-init controls' heads of each one's layer where the run holds them, else that they describe
    (`headscan.analysis.claims.untested_text`)."""
    metric = str(rows["metric"].iloc[0])
    ranges = control_range(rows, table, keys=("metric", "bucket"))
    if not ranges["controls"].any():
        return untested_text(metric, why="the sweep tests no row of positions.parquet, and this run has no "
                                         "random-init controls to compare with; uniform attention is no null, "
                                         "untrained heads leave it too")
    said = [f"{label} {untested_text(metric, pd.Series({**dict(row), 'ci_low': low, 'ci_high': high}))}"
            for label, low, high, (_, row) in zip(rows["label"], rows["ci_low"], rows["ci_high"], ranges.iterrows())]
    return "against the random-init controls: " + "; ".join(said)


def _as_rows(best: pd.Series) -> pd.DataFrame:
    """A reach row as a positions row of `positions.DISTANCE`: its distance is the value the controls' compare with."""
    return best.to_frame().T.assign(metric=positions.DISTANCE, value=best["distance"]).astype(
        {"layer": int, "bucket": int, "ci_low": float, "ci_high": float})


def _reach_sentences(model: str, reach: pd.DataFrame, table: pd.DataFrame) -> list[str]:
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
                   f"{best['chance']:.1f} for uniform attention (reach {best['value']:.2f}); "
                   + _null_said(_as_rows(best), table) + ".")
    else:
        best = mine.loc[mine["value"].idxmax()]
        out.append(f"No head of {model} looks further back than uniform attention beyond its interval at {where}: "
                   f"the furthest, {best['label']}, reaches {best['value']:.2f} ({best['far']}).")
    near = mine[mine["near"] == ""]
    if len(near):
        best = near.loc[near["value"].idxmin()]
        out.append(f"{model} at {where}: {best['label']} looks nearest, {best['distance']:.1f} tokens "
                   f"[{best['ci_low']:.1f}, {best['ci_high']:.1f}] (reach {best['value']:.2f}), "
                   f"{best['distance_early']:.1f} at {_positions(int(best['early_bucket']))}; "
                   + _null_said(_as_rows(best), table) + ".")
    return out


def _context_table(table: pd.DataFrame, reach: pd.DataFrame, tops: pd.DataFrame, long: list[str]) -> pd.DataFrame:
    sink = table[(table["metric"] == positions.SINK) & table["value"].notna() & (table["bucket"] >= 1)]
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


@register_section("attention along the context", order=100, shown=lambda comparison: "positions" in comparison.frames)
def attention_along_the_context(context: Context) -> list:
    return context_section(context.comparison, context.pngs)
