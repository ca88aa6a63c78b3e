"""The report's opening: its title, what it covers, the contents and the interactive head atlas with its role rules
(the atlas itself, data and script, is `headscan.report.atlas`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...analysis.claims import run_gate_text
from ...analysis.runs import Comparison
from ...metrics import describe
from .. import atlas
from ..document import Bullets, Contents, Heading, Raw, Text
from . import Context, register_section

if TYPE_CHECKING:  # the report only reads what headscan.report.examples computed; it never imports the models
    from ..examples import Examples

__all__ = ["header", "atlas_section"]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def header(comparison: Comparison, title: str) -> list:
    names = [m.name for m in comparison.models]
    runs = [name for name, _ in comparison.runs]
    metrics = comparison.metrics
    units = [f"`{m}` in {describe(m).unit}" for m in metrics if not describe(m).bounded]
    return [
        Heading(1, title),
        Text(f"{_plural(len(runs), 'run')} ({', '.join(runs)}), {_plural(len(names), 'model')} ({', '.join(names)}), "
             f"{len(metrics)} metrics per head." + (" A model in more than one run is named run:model."
                                                    if any(":" in n for n in names) else "")),
        Text("Heads are labelled L{layer}H{head}, both 0-indexed (the TransformerLens convention): Clark et al.'s "
             "(2019) 1-indexed BERT \u201chead 3-1\u201d is L2H0 here. Metrics that run from 0 to 1 share one colour "
             "scale throughout" + (f"; the others keep their units: {', '.join(units)}" if units else "") + "."),
        *([Bullets(caveats)] if (caveats := _caveats(comparison)) else []),
        Contents(),
    ]


def _caveats(comparison: Comparison) -> list[str]:
    """What a reader must know of each embedded model before reading its heads (its provenance's ``caveat``),
    once per model and its controls."""
    said = {}
    for model in comparison.models:
        caveat = model.provenance.extra.get("caveat") if model.provenance is not None else None
        if caveat:
            said.setdefault(caveat, []).append(model.name)
    return [f"Caveat ({', '.join(names)}): {caveat}." for caveat, names in said.items()]


def atlas_section(comparison: Comparison, examples: Examples | None) -> list:
    return [
        Heading(2, "Head atlas"),
        Text("Every head of every model, one grid per model: layers are rows (layer 0 at the top), heads columns, "
             "each grid as tall as the others, so models of different depth line up by relative depth (0 is the "
             "first layer, 1 the last). Choose what colours the grid; hover a head for its value and 95% interval; "
             "click it for all its scores, ranks, offset profile and attention on the example sentence. A "
             "checkpoint series is one grid with a slider over its training steps (the last first). Where the runs "
             "have a similarity table, a head map under each grid places the heads by how alike they attend (as in "
             "Head families; a point opens its head), and the grid can be coloured by head family (cluster)."),
        Raw(atlas.atlas_html(comparison, examples),
            markdown="The interactive head atlas is in `index.html` beside this file; its role rules follow."),
        Text("Roles, from the numbers, by the rules findings use too: a role needs its metric at the role's "
             "threshold and the value a finding against its null where the run tested its rows, else beyond "
             "chance (its 95% interval's low end above uniform attention's value, which is no null: untrained "
             "heads leave it too), support not thin; colouring by role shows a head's first role in this order. The atlas can also be "
             "coloured by lift over chance: value \u2212 chance, or value / chance for shares."),
        Bullets(atlas.role_rules(comparison.tested)),
        Text(run_gate_text(comparison.runs)),
    ]


@register_section("the atlas", order=10)
def head_atlas(context: Context) -> list:
    return [*header(context.comparison, context.title), *atlas_section(context.comparison, context.examples)]
