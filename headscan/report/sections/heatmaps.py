"""The section "Heatmaps": one layer x head grid per metric, every model side by side at the same height.
"""

from __future__ import annotations

import pandas as pd

from ...analysis import movement
from ...analysis.ranking import striking_order
from ...analysis.runs import Comparison, swept_layers
from ...metrics import describe
from ...plots import heatmaps
from ..document import Bullets, Figures, Heading, Text
from ..figures import ANNOTATE_TOP, Pngs, heatmap_rows, structural
from . import Context, register_section

__all__ = ["heatmaps_section"]

OWN_SECTION = (movement.DLA, movement.DLA_POSITIVE)  # heads-table metrics drawn in "What heads move", not heatmaps


def heatmaps_section(comparison: Comparison, pngs: Pngs) -> list:
    blocks: list = [
        Heading(2, "Heatmaps"),
        Text(f"One figure per metric, every model side by side at the same height, so rows line up by relative "
             f"depth: layers are rows (layer 0 at the top), heads columns. The {ANNOTATE_TOP} most striking heads "
             "of each model carry their value: the highest, or the lowest where the registry marks low as "
             "striking. Grey cells are undefined. Where a metric is 0 or undefined for every head of a model by "
             "construction, one sentence says why instead of a grid."),
    ]
    part_swept = [f"{m.name}: {where}" for m in comparison.models if (where := swept_layers(m.provenance))]
    if part_swept:  # a sweep with --layers: the layers it did not sweep are grey rows, or past the grid's end
        blocks.append(Text(f"Swept on part of their layers (--layers), so the other layers have no rows: "
                           f"{'; '.join(part_swept)}. `headscan merge` joins such runs into the whole model's."))
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
                shown = swept_layers(comparison.model(name).provenance) or f"{n_layers} layers"
                heatmaps.head_heatmap(part, model=name, metric=metric, ax=ax, vmin=0.0, vmax=vmax,
                                     annotate_top=ANNOTATE_TOP, cbar=cbar,
                                     title=f"{name} ({comparison.model(name).family}, {shown})")

            files = heatmap_rows([(m.name, part) for m, part in drawable], pngs, f"heatmap_{metric}", draw)
            scale = "0 to 1, one scale for every model" if bounded else f"0 to {vmax:.2f}, one scale for every model"
            blocks.append(Figures(files, f"`{metric}` by layer and head; colour: {describe(metric).unit}, {scale}; "
                                         f"annotated: each model's {ANNOTATE_TOP} {striking_order(metric)} heads."))
        if notes:
            blocks.append(Bullets(notes) if drawable else Text(" ".join(notes)))
    return blocks


@register_section("heatmaps", order=50)
def heatmaps_part(context: Context) -> list:
    return heatmaps_section(context.comparison, context.pngs)
