"""The report's "Head families" section (similarity.parquet): each model's heads on a two-dimensional map of how alike
they attend, coloured by layer and by pattern type, the clusters with their member heads, and the pattern types.

It takes the runs side by side, draws its PNGs and returns document blocks, or nothing when no run has a
similarity table. The numbers come from `headscan.analysis.families`. This module loads no model.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from ...analysis import families
from ...analysis.runs import Comparison
from ...plots.families import head_map as draw_head_map
from ..atlas import families_shown
from ..document import Bullets, Figures, Heading, Note, Table, Text
from ..figures import MAX_WIDTH, Pngs
from . import Context, register_section

__all__ = ["families_section"]

PANEL = 3.4  # inches per panel
LISTED = 12  # clusters listed per model
MEMBERS = 16  # member heads named per cluster; the rest are counted


def _sample_line(comparison: Comparison, model: str, mapped: pd.DataFrame) -> str:
    notes = comparison.model(model).provenance.extra.get("similarity") or {}
    queries = comparison["similarity"]
    queries = queries.loc[queries["model"] == model, "count"]
    clustered = mapped[mapped["cluster_size"] > 1]
    return (f"{model}: {notes.get('sample_n', '?')} sampled segments (seed {notes.get('sample_seed', '?')}), "
            f"{int(queries.max()) if len(queries) else 0:,} queries; {clustered['cluster'].nunique()} clusters of two "
            f"or more heads hold {len(clustered)} of its {len(mapped)} heads.")


def _few(members: str) -> str:
    names = members.split(", ")
    return ", ".join(names[:MEMBERS]) + (f" and {len(names) - MEMBERS} more" if len(names) > MEMBERS else "")


def _across_part(comparison: Comparison) -> list:
    """The closest heads of two models of one run, over the same words (similarity_across)."""
    if "similarity_across" not in comparison.frames or comparison["similarity_across"]["value"].isna().all():
        return []
    across = comparison["similarity_across"]
    closest = families.closest_across(across, top=LISTED)
    frame = pd.DataFrame({"model": closest["model"], "head": closest["label"], "other model": closest["other_model"],
                          "other head": closest["other_label"], "JS (nats)": closest["value"].map(lambda v: f"{v:.3f}"),
                          "word queries": closest["count"].map(lambda v: f"{v:,.0f}")})
    lines = []
    for (model, other), part in across.groupby(["model", "other_model"], sort=False):
        lines.append(f"{model} against {other}: median divergence {part['value'].median():.3f} nats over "
                     f"{part['count'].iloc[0]:,.0f} word queries of {part['units'].iloc[0]:.0f} segments; the closest "
                     f"pair {part.loc[part['value'].idxmin(), 'label']} and "
                     f"{part.loc[part['value'].idxmin(), 'other_label']}, {part['value'].min():.3f} nats.")
    return [Heading(3, "The same heads in two models"),
            Text("Heads of two models whose tokenizers cut the text differently are compared word by word "
                 "(similarity_across; CoNLL-U corpora): each head's attention from a word (the mean over its "
                 "tokens) to each word (the sum over its tokens), as Clark et al.'s word-level attention, plus one "
                 "key for the attention on tokens of no word ([CLS], [SEP], BOS), so that a sink head of one model "
                 "can match a sink head of the other. A query word sees that key and the words up to itself when "
                 "either model is causal (an encoder's look ahead has nothing to match), each row renormalised over "
                 "them; then Clark's smoothing and the mean Jensen-Shannon divergence over the sample's words."),
            Bullets(lines),
            Table(frame, numeric=("JS (nats)", "word queries"),
                  note=f"The {LISTED} pairs of smallest divergence of each pair of models; similarity_across.parquet "
                       f"holds every pair of heads.")]


def families_section(comparison: Comparison, pngs: Pngs) -> list:
    """Head families: the map of each model's heads by layer and by pattern type, the clusters, the pattern types."""
    if not families_shown(comparison):
        return []
    similarity = comparison["similarity"]
    models = [m.name for m in comparison.models if (similarity["model"] == m.name).any()]
    types = families.pattern_types(comparison.heads, comparison.offsets) if not comparison.heads.empty else pd.DataFrame()
    mapped = []
    for model in models:
        part = families.head_map(similarity, model)
        if not types.empty:
            part = part.merge(types[types["model"] == model].drop(columns="model"), on=["layer", "head"], how="left")
        mapped.append(part)
    mapped = pd.concat(mapped, ignore_index=True)
    if "pattern_type" not in mapped:
        mapped["pattern_type"] = ""
    blocks: list = [
        Heading(2, "Head families"),
        Text("Which heads attend alike. For every pair of heads of a model, similarity.parquet holds the mean "
             "Jensen-Shannon divergence between their attention rows over the same queries of a seeded sample of "
             "segments (Clark et al. 2019, section 6: their smoothing, 0.999 p + 0.001 / n over the n keys each "
             "query sees; natural log, so 0 is identical and ln 2 = 0.69 is disjoint). The map places the heads by "
             "classical MDS of the Jensen-Shannon distance (the square root of the divergence, a metric); Clark et "
             "al. used metric SMACOF on the divergence, so compare who sits near whom, not coordinates. Numbers "
             f"mark clusters: average linkage on the divergence, merged while the mean divergence between two "
             f"clusters is at most {families.CLUSTER_CUT:g} nats (headscan's addition; Clark et al. do not cluster)."),
        Bullets([_sample_line(comparison, model, mapped[mapped["model"] == model]) for model in models]),
    ]
    fig = Figure(figsize=(min(MAX_WIDTH, 2 * PANEL + 0.8), PANEL * len(models)), layout="constrained")
    axes = fig.subplots(len(models), 2, squeeze=False)
    for row, model in zip(axes, models):
        draw_head_map(mapped, model=model, hue="layer", ax=row[0])
        draw_head_map(mapped, model=model, hue="pattern_type", ax=row[1])
    name = pngs.add("head_families.png", fig)
    blocks.append(Figures([name], "Each model's heads placed by how alike they attend (near: similar attention), "
                                  "coloured by layer (left) and by pattern type (right); numbers are clusters."))
    listed = families.clusters(mapped, similarity)
    listed = listed.groupby("model", sort=False).head(LISTED)
    if listed.empty:
        blocks.append(Note(f"No two heads are within {families.CLUSTER_CUT:g} nats of each other on average."))
    else:
        frame = listed.assign(mean_js=listed["mean_js"].map(lambda v: f"{v:.3f}"), members=listed["members"].map(_few))
        frame = frame.rename(columns={"mean_js": "mean JS (nats)"}).astype(str)
        if len(models) == 1:
            frame = frame.drop(columns="model")
        blocks.append(Table(frame, numeric=("cluster", "heads", "mean JS (nats)"),
                            note=f"The largest clusters of each model (at most {LISTED}), with the mean divergence "
                                 f"between their members; similarity.parquet holds every pair."))
    blocks += _across_part(comparison)
    if "sink" in mapped:
        counts = mapped.groupby(["model", "pattern_type"], sort=False).size().unstack(fill_value=0)
        counts = counts.reindex(models).reset_index().astype(str)
        blocks += [Heading(3, "Pattern types"),
                   Table(counts, numeric=tuple(c for c in counts.columns if c != "model"), note="Heads per pattern type (Kovaleva et al. 2019). " + families.PATTERN_RULE)]
    return blocks


@register_section("head families", order=140, shown=families_shown)
def head_families(context: Context) -> list:
    return families_section(context.comparison, context.pngs)
