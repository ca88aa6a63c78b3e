"""The report's section "Heads over training": for a checkpoint series, each metric's trajectory per head across
the steps, and the step at which each head forms (`headscan.analysis.series.formation`).

A report has this section when two or more of its models are checkpoints of one series (their provenance
records a ``step``): one run over ``--checkpoints FOLDER``, or several runs of one architecture at different
steps. This module chooses no numbers itself and loads no model.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from ...analysis.ranking import fmt_score
from ...analysis.roles import role_for
from ...analysis.runs import Comparison
from ...analysis.series import formation, formation_rule, with_steps
from ...plots.series import trajectories
from ..atlas import report_steps
from ..document import Figures, Heading, Note, Table, Text
from ..figures import Pngs, name_part
from . import Context, register_section

__all__ = ["series_section", "shown", "report_steps"]

ALWAYS = ("prev_token", "induction")  # drawn for every series that has them; other metrics where a head forms


def shown(comparison: Comparison) -> bool:
    """Whether the report has this section: some series has checkpoints at two steps or more."""
    return len(report_steps(comparison)) > 0


def series_section(comparison: Comparison, pngs: Pngs) -> list:
    steps = report_steps(comparison)
    rows = with_steps(comparison.heads, steps)
    formed = formation(rows)
    blocks: list = [
        Heading(2, "Heads over training"),
        Text("Each checkpoint is a model of its own in the tables, named by its spec, with its training step in its "
             "provenance. Below, each metric's value per head against the step, its 95% interval as a band, "
             "coloured by layer (dark the first, yellow the last); the dotted line is chance (uniform attention), "
             "the dashed one the role's threshold, and a filled dot marks the step at which a head forms. "
             + formation_rule()),
    ]
    for series, part in rows.groupby("series", sort=False):
        done = formed[(formed["series"] == series) & formed["step"].notna()]
        present = [m for m in dict.fromkeys(part["metric"]) if part.loc[part["metric"] == m, "value"].notna().any()]
        drawn = [m for m in present if m in ALWAYS or m in set(done["metric"])]
        drawn = [m for m in drawn if role_for(m) is not None]
        checkpoints = sorted(part["step"].unique())
        blocks += [Heading(3, f"Series {series}"),
                   Text(f"{len(checkpoints)} checkpoints, steps {', '.join(str(int(s)) for s in checkpoints)}.")]
        files = []
        for metric in drawn:
            fig, ax = plt.subplots(figsize=(6.4, 3.6))
            trajectories(part, metric=metric, series=series, formed=formed, threshold=role_for(metric).threshold,
                         ax=ax)
            fig.tight_layout()
            files.append(pngs.add(f"series_{name_part(series)}_{metric}.png", fig))
            plt.close(fig)
        if files:
            blocks.append(Figures(files, "Each head's score against the training step, with its 95% interval; "
                                         "filled dots: where it forms."))
        if len(done):
            table = pd.DataFrame({
                "head": done["label"], "metric": done["metric"], "role": done["role"],
                "forms at step": done["step"].astype(int).astype(str),
                "value": [fmt_score(m, v) for m, v in zip(done["metric"], done["value"])],
                "95% interval": [f"[{fmt_score(m, lo, v)}, {fmt_score(m, hi, v)}]" for m, lo, hi, v in
                                 zip(done["metric"], done["ci_low"], done["ci_high"], done["value"])],
                "chance": [fmt_score(m, c, v) for m, c, v in zip(done["metric"], done["chance"], done["value"])],
            }).sort_values(["forms at step", "metric"], key=lambda c: c.astype(int) if c.name == "forms at step"
                           else c, kind="stable")
            blocks.append(Table(table, numeric=("forms at step", "value", "chance"), sortable=True))
        else:
            blocks.append(Note("No head forms a role by the rule above in this series."))
    return blocks


@register_section("heads over training", order=150, shown=shown)
def heads_over_training(context: Context) -> list:
    return series_section(context.comparison, context.pngs)
