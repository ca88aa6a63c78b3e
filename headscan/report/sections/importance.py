"""The report's "Does the head matter?" section (importance.parquet): each head's effect against its strongest
pattern, the heads whose pattern and effect disagree, and AtP against exact ablation. A model of a run with an
importance table but no effect of its own (left out by ``--importance-model``) is named as not measured, nothing
more.

It takes the runs side by side, draws its PNGs (sized as in `headscan.report.sections`) and returns document
blocks, or nothing when no run has an importance table. The numbers come from `headscan.analysis.importance`.
This module loads no model.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from ...analysis.importance import MATTERS, NEGLIGIBLE, STRIKING, agreement, matter_table
from ...analysis.inactive import QUIET, inactive_against_ablation, inactive_sentence
from ...analysis.runs import Comparison
from ...plots.importance import atp_against_exact, effect_against_pattern
from ..document import Bullets, Figures, Heading, Note, Table, Text
from ..figures import MAX_WIDTH, Pngs
from . import Context, register_section

__all__ = ["importance_section", "TARGET_UNITS"]

TARGET_UNITS = {  # what a change of each target is measured in
    "next_token_loss": "change of the next-token loss (nats per token)",
    "masked_loss": "change of the masked-token loss (nats per token)",
    "hidden_change": "1 - cosine of the final hidden states",
}
NAMED = 3  # heads named per model in the section's sentences
PANEL = 3.6  # inches per model's panel


def _signed(value: float) -> str:
    return "–" if pd.isna(value) else f"{value:+.3g}"


def _with_interval(value: float, low: float, high: float) -> str:
    if pd.isna(value):
        return "–"
    return _signed(value) + ("" if pd.isna(low) or pd.isna(high) else f" [{_signed(low)}, {_signed(high)}]")


def _notes(comparison: Comparison, model: str) -> dict:
    return comparison.model(model).provenance.extra.get("importance") or {}


def _model_lines(comparison: Comparison, table: pd.DataFrame, scale_of: dict[str, str]) -> list[str]:
    lines = []
    for model in [m.name for m in comparison.models if (table["model"] == m.name).any()]:
        part = table[table["model"] == model]
        notes = _notes(comparison, model)
        target = part["target"].iloc[0]
        exact = int(part["exact"].sum())
        ranked = part.reindex(part["value"].abs().sort_values(ascending=False).index).head(NAMED)
        named = "; ".join(f"{r.label} {_with_interval(r.value, r.ci_low, r.ci_high)}" for r in ranked.itertuples())
        how = ("exact mean ablation" if exact == len(part) else
               f"exact mean ablation for {exact} of {len(part)} heads, AtP's estimate for the rest" if exact else
               "AtP's first-order estimate of mean ablation")
        how += ", the first position left alone" if notes.get("ablate_first") is False else ""
        yardstick = scale_of.get(model)
        largest = f"{yardstick}'s largest exact effect" if yardstick else "the largest exact effect"
        if exact:  # findings come from exact ablations only: AtP screens, it does not decide
            verdict = (f"{int(part['matters'].sum())} of the {exact} exactly ablated heads matter (calibrated interval "
                       f"clear of 0, at least {MATTERS:.0%} of {largest}), {int(part['nil'].sum())} have none "
                       f"(calibrated interval within {NEGLIGIBLE:.0%} of {largest} around 0); AtP estimates count in "
                       "neither. Each interval is widened by what its method and target needed to hold 95% at its "
                       "size (" + _calibration_basis(part) + ").")
            withheld = int(part["too_few_units"].sum()) if "too_few_units" in part else 0
            if withheld:
                verdict += (f" {withheld} exact rows rest on fewer units than any size measured and are judged "
                            "neither way: too few units to assess.")
        else:
            verdict = ("No head was ablated exactly, so none is said to matter: AtP only screens (sweep with "
                       "--importance ablate).")
        lines.append(f"{model} (`{target}`; {how}): the largest effects are {named}. {verdict}"
                     + (f" Sample: {notes['sample']}." if notes.get("sample") else ""))
    return lines


def _unmeasured_lines(comparison: Comparison, measured: set[str]) -> list[str]:
    """One sentence per run with an importance table naming its models that have no effect in it, and why, as
    its settings say (``importance_models``: only the models it names, never a control)."""
    lines = []
    for run_name, run in comparison.runs:
        if "importance" not in run.frames:  # a run without importance (or a retrieval or patching run): not ours
            continue
        left = [m.name for m in comparison.models if m.run == run_name and m.name not in measured]
        if not left:
            continue
        chosen = run.provenance.config.get("importance_models") or []
        why = (f"the sweep measured importance only for {', '.join(chosen)} (--importance-model), which leaves out "
               "every other model and every control" if chosen else "the sweep wrote no effect for them")
        lines.append(f"Not measured: {', '.join(left)} ({why}). Nothing in this section is said of them.")
    return lines


def _inactive_part(comparison: Comparison, controls: dict[str, str], measured: set[str]) -> list:
    """One sentence per trained model with quiet heads and measured importance: which ablation confirms as
    inactive and which not (a model without importance is checked by nothing, so it gets no sentence)."""
    quiet = inactive_against_ablation(comparison.heads, comparison["importance"], scale_of=controls)
    lines = [inactive_sentence(quiet, m.name) for m in comparison.models
             if m.name not in controls and m.name in measured]
    lines = [line for line in lines if line]
    if not lines:
        return []
    return [Text(f"Inactive heads: a head that writes little (output_norm, its interval below {QUIET:g} of its "
                 "layer's mean head; Guo et al. 2024, Gu et al. 2025) should matter little, and ablation is the "
                 "check: confirmed where its exact mean ablation's effect is nil, contradicted where it matters."),
            Bullets(lines)]


def _flag_table(table: pd.DataFrame, single: bool) -> Table | Note:
    flagged = table[table["flag"] != ""]
    if flagged.empty:
        return Note("No head is flagged: none has a striking pattern with no effect, nor an effect without a "
                    "striking pattern, on values whose support is not thin.")
    frame = pd.DataFrame({
        "model": flagged["model"], "head": flagged["label"], "flag": flagged["flag"],
        "pattern": flagged["pattern"],
        "share [95%]": [_with_interval(v, lo, hi).replace("+", "") for v, lo, hi in
                        zip(flagged["pattern_value"], flagged["pattern_low"], flagged["pattern_high"])],
        "effect [95%]": [_with_interval(v, lo, hi) for v, lo, hi in
                         zip(flagged["value"], flagged["ci_low"], flagged["ci_high"])],
        "method": flagged["method"],
    })
    if single:
        frame = frame.drop(columns="model")
    return Table(frame, sortable=True,
                 note=f"A striking pattern: the lower end of its interval at least {STRIKING:g} of the head's "
                      f"attention; no effect: the effect's whole interval within {NEGLIGIBLE:.0%} of the "
                      f"model's largest effect around 0; an effect: its interval clear of 0 and at least "
                      f"{MATTERS:.0%} of the largest, with no pattern whose interval reaches "
                      f"{STRIKING:g}. Values resting on thin support flag nothing. Click a heading to sort.")


def _nothing_to_compare(importance: pd.DataFrame) -> str:
    """Why no head has both an AtP estimate and an exact ablation: which of the two reasons holds in these runs."""
    exact = importance[~importance["method"].str.startswith("atp") & importance["value"].notna()]
    if exact.empty:
        return ("No head was ablated exactly in these runs (sweep with --importance ablate), so there is nothing to "
                "compare.")
    ablated = ", ".join(f"{model} ({', '.join(sorted(part['target'].unique()))})"
                        for model, part in exact.groupby("model", sort=False))
    return (f"Heads were ablated exactly ({ablated}), but AtP has no first-order estimate of that target "
            f"(hidden_change, 1 - cosine of the final hidden states, is at its minimum when nothing is ablated: its "
            f"first-order change is 0), so there is nothing to compare.")


def _agreement_part(comparison: Comparison, pngs: Pngs) -> list:
    importance = comparison["importance"]
    agreed = agreement(importance)
    agreed = agreed[agreed["heads"] > 0]
    blocks: list = [Heading(3, "AtP against exact ablation"),
                    Text("Attribution patching (AtP) estimates every head's effect from one backward pass: the "
                         "gradient of the target at the head's output times the change the ablation makes, summed "
                         "over positions (Nanda 2023; Kramár et al. 2024). Where the sweep also ablated heads "
                         "exactly, the two are compared head by head.")]
    if agreed.empty:
        return blocks + [Note(_nothing_to_compare(importance))]
    models = [m.name for m in comparison.models if (agreed["model"] == m.name).any()]
    fig = Figure(figsize=(min(MAX_WIDTH, PANEL * len(models) + 0.4), PANEL), layout="constrained")
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    for ax, model in zip(axes, models):
        atp_against_exact(importance, model=model, ax=ax)
    name = pngs.add("atp_against_exact.png", fig)
    frame = pd.DataFrame({"model": agreed["model"], "AtP": agreed["estimate"], "exact": agreed["exact"],
                          "heads": agreed["heads"].astype(str),
                          "Spearman": agreed["spearman"].map(lambda v: "–" if pd.isna(v) else f"{v:.2f}"),
                          "top 10 shared": [f"{s} of {k}" for s, k in zip(agreed["top_shared"], agreed["top"])],
                          "top 20 shared": [f"{s} of {k}" for s, k in zip(agreed["top20_shared"], agreed["top20"])]})
    return blocks + [Figures([name], "Each head that has both: AtP's estimate of mean ablation (x) against the exact "
                                     "mean ablation (y); the dashed line is agreement."),
                     Table(frame, numeric=("heads", "Spearman"),
                           note="Spearman's rank correlation over the heads with both; top 10 (20) shared: how many "
                                "of the 10 (20) largest exact effects (by size) are also among AtP's 10 (20) largest, "
                                "AtP's recall as a screen. Only heads AtP "
                                "ranked high are ablated under --ablate-top, so a high correlation there says AtP "
                                "orders its own top heads well, not that it missed none.")]


def importance_section(comparison: Comparison, pngs: Pngs) -> list:
    """Does the head matter: each model's heads by effect and strongest pattern, the flagged heads, and AtP
    against exact ablation; nothing when no run has an importance table."""
    if "importance" not in comparison.frames or comparison["importance"]["value"].notna().sum() == 0:
        return []
    controls = {control: trained for trained, names in comparison.control_map().items() for control in names}
    table = matter_table(comparison.heads, comparison["importance"], scale_of=controls)
    measured = set(table["model"])  # the models with an effect (exact or AtP) for some head
    blocks: list = [
        Heading(2, "Does the head matter?"),
        Text("Where a head looks is not whether the model needs it. importance.parquet holds, per head, the change "
             "of the model's target when the head's output is removed (ablated minus clean; positive: the loss "
             "rises without it): replaced by its mean over the corpus (mean ablation), by 0, or by its output on "
             "another segment at the same position (resample ablation), exactly or (mean and 0) as AtP's "
             "first-order estimate. Unless the run was swept with --ablate-first, each segment's first position "
             "(BOS, [CLS]) keeps the head's own output and the mean leaves it out: many heads park attention there, "
             "and replacing it would measure that sink. Chance is 0: a head whose removal changes nothing scores 0. "
             "Whether a head matters is said from exact mean ablations only; AtP is a screen for which heads to "
             "ablate. Targets: a causal model's next-token loss, an encoder's masked-token loss where its "
             "checkpoint has a trained head, else the change of its final hidden states (1 - cosine)."),
        Bullets(_model_lines(comparison, table, controls) + _unmeasured_lines(comparison, measured)),
    ]
    blocks += _inactive_part(comparison, controls, measured)
    models = [m.name for m in comparison.models if (table["model"] == m.name).any()]
    fig = Figure(figsize=(min(MAX_WIDTH, PANEL * len(models) + 0.4), PANEL), layout="constrained")
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    for ax, model in zip(axes, models):
        target = table.loc[table["model"] == model, "target"].iloc[0]
        effect_against_pattern(table, model=model, ax=ax, unit=TARGET_UNITS.get(target, target), legend=False)
    seen = {}  # one legend for the figure: every pattern any panel drew, not only the last panel's
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if seen:
        fig.legend(list(seen.values()), list(seen.keys()), loc="outside right upper", fontsize="x-small",
                   frameon=False, title="strongest pattern", title_fontsize="x-small")
    name = pngs.add("importance_against_pattern.png", fig)
    blocks += [Figures([name], "Each head's strongest pattern (its largest share of attention on one kind of key, "
                               "coloured by which) against the effect of removing it, with the effect's 95% "
                               "interval; dots are exact mean ablations, crosses AtP estimates. The flagged heads "
                               "of largest effect are labelled (all of them are in the table below)."),
               Heading(3, "Heads whose pattern and effect disagree"),
               _flag_table(table, single=len(comparison.models) == 1)]
    return blocks + _agreement_part(comparison, pngs)


@register_section("does the head matter", order=130, shown=lambda comparison: "importance" in comparison.frames)
def does_the_head_matter(context: Context) -> list:
    return importance_section(context.comparison, context.pngs)


def _calibration_basis(part: pd.DataFrame) -> str:
    """Which of the rows' factors were measured for their method and target, and which are the widest measured."""
    exact = part[part["exact"]] if "exact" in part else part
    widest = int((exact.get("cal_basis", pd.Series(dtype=object)) == "widest measured").sum())
    if not widest:
        return "measured for each, experiments/interval_calibration.py"
    return (f"{widest} of {len(exact)} exact rows' method and target were never measured and take the widest "
            "factor measured at their size; experiments/interval_calibration.py")
