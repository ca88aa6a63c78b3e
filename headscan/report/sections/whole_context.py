"""The report's section "Which heads need the whole context": retrieval heads (a retrieval run joined to a sweep)
and what masking them does to needle accuracy, streaming heads, how both relate to induction and copying, and the key/value budget curve.

Claims are gated as everywhere in the report: a head is named a retrieval head only when the low end of its 95%
interval (over trials) clears both Wu et al.'s 0.1 and the score a head attending uniformly would get, and its
support is not thin; a head is named one that needs the whole context only when its streaming interval clears
the uniform head's share (`headscan.analysis.whole_context`).

This module chooses no numbers itself and loads no model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...analysis.claims import control_range, untested_text
from ...analysis.masking import draw_overlap, masked_heads, masking_by_condition, masking_lines, overlap
from ...analysis.ranking import fmt_score, thin
from ...analysis.runs import Comparison
from ...analysis.whole_context import (
    RETRIEVAL_THRESHOLD,
    WU_SHARES,
    kv_budget,
    relations,
    retrieval_head_tests,
    retrieval_shares,
)
from ...plots import heatmaps
from ...plots.masking import accuracy_by_depth
from ...plots.whole_context import kv_budget_curve, score_scatter
from ..document import Bullets, Figures, Heading, Note, Table, Text
from ..figures import ANNOTATE_TOP, MAX_WIDTH, Pngs, heatmap_rows, name_part
from . import Context, register_section

__all__ = ["whole_context_section", "shown"]

TOP = 5  # heads per model in the retrieval and streaming tables
DEFAULT_SINK, DEFAULT_RECENT = 64, 256  # SweepConfig's defaults, for a run that did not record them


def shown(comparison: Comparison) -> bool:
    """Whether the report has this section: a run scored streaming, or a retrieval run joined."""
    heads = comparison.heads
    return "retrieval" in comparison.frames or bool(heads.loc[heads["metric"] == "streaming", "value"].notna().any())


def _settings(comparison: Comparison, model: str) -> tuple[int, int, int]:
    """(sink, recent, length) of the sweep that scored `model`'s streaming."""
    run = dict(comparison.runs)[comparison.model(model).run]
    config = run.provenance.config
    return (int(config.get("sink", DEFAULT_SINK)), int(config.get("recent", DEFAULT_RECENT)),
            int(min(config.get("max_len") or 0, comparison.model(model).provenance.max_context or 10**9)) or 1)


def whole_context_section(comparison: Comparison, palette: dict, pngs: Pngs) -> list:
    blocks: list = [
        Heading(2, "Which heads need the whole context"),
        Text("Two views of the heads a long context needs. Retrieval heads (Wu et al. 2024): in needle-in-a-"
             "haystack trials, at each step of the greedy answer, a head copies when its most-attended key is the "
             "needle token just generated; its score is the share of the answer's tokens it copies, averaged over "
             f"the trials whose answer passes the ROUGE-1 gate. Wu et al. call a head above {RETRIEVAL_THRESHOLD:g} a "
             "retrieval head and find 3-6% of them. Streaming heads (DuoAttention, Xiao et al. 2024): "
             "`streaming` is the share of a head's attention outside the first S tokens and the last W, what a "
             "sink-and-window cache would take from it; a head near 0 can live with such a cache."),
    ]
    if "retrieval" in comparison.frames:
        blocks += _retrieval_part(comparison, pngs)
    if "retrieval_masking" in comparison.frames:
        blocks += _masking_part(comparison, pngs)
    blocks += _streaming_part(comparison, pngs)
    blocks += _relations_part(comparison, pngs)
    blocks += _budget_part(comparison, palette, pngs)
    return blocks


# --- retrieval ----------------------------------------------------------------------------------------------


def _chosen(retrieval: pd.DataFrame, model: str) -> str:
    """The gated score where any trial passed the gate, else the ungated one."""
    gated = retrieval[(retrieval["model"] == model) & (retrieval["metric"] == "retrieval")]
    return "retrieval" if gated["value"].notna().any() else "retrieval_ungated"


def _retrieval_part(comparison: Comparison, pngs: Pngs) -> list:
    retrieval, trials = comparison["retrieval"], comparison["retrieval_trials"]
    shares = retrieval_shares(retrieval, trials)
    blocks: list = [Heading(3, "Retrieval heads")]
    rows, findings, drawable, tops = [], [], [], []
    for model in dict.fromkeys(retrieval["model"]):
        metric = _chosen(retrieval, model)
        share = shares[(shares["model"] == model) & (shares["metric"] == metric)].iloc[0]
        gated = shares[(shares["model"] == model) & (shares["metric"] == "retrieval")].iloc[0]
        if model in comparison.published:
            findings.append(_published_line(model, comparison.published[model]))
        else:
            failed = gated["trials_total"] - gated["trials_passed"]
            findings.append(f"{model}: {gated['trials_passed']} of {gated['trials_total']} trials passed the answer "
                            f"gate ({failed} failed it or had no answer span; all are kept in "
                            "retrieval_trials.parquet)." + ("" if metric == "retrieval" else " No trial passed, so the "
                                                            "scores below are the ungated ones (every trial), not Wu "
                                                            "et al.'s."))
        rows.append({"model": model, "score": metric, "trials": str(share["trials"]), "heads": str(share["heads"]),
                     "= 0": _pct(share["zero"], share["heads"]), f"(0, {RETRIEVAL_THRESHOLD:g}]":
                     _pct(share["low"], share["heads"]), f"> {RETRIEVAL_THRESHOLD:g}": _pct(share["above"], share["heads"]),
                     "> 0.5": _pct(share["above_half"], share["heads"]),
                     f"interval > {RETRIEVAL_THRESHOLD:g}": _pct(share["above_interval"], share["heads"])})
        part = retrieval[(retrieval["model"] == model) & (retrieval["metric"] == metric)]
        drawable.append((model, part))
        top = part.assign(thin=thin(part)).sort_values(["value", "layer", "head"], ascending=[False, True, True])
        for row in top.head(TOP).itertuples():
            tops.append({"model": model, "head": row.label, "score": metric, "value": fmt_score(metric, row.value),
                         "95% low": fmt_score(metric, row.ci_low, row.value),
                         "95% high": fmt_score(metric, row.ci_high, row.value), "trials": str(int(row.count)),
                         "chance": "\u2013" if pd.isna(row.chance) else f"{row.chance:.4f}",
                         "mark": "‡" if row.thin else ""})
        mine = trials[trials["model"] == model] if len(trials) else trials
        if model not in comparison.published and "needle" in mine and mine["needle"].nunique() > 1:
            findings.append(_needle_line(trials, model, gated=metric == "retrieval"))
            continue
        # an imported file defines no chance; every haystack it came from is thousands of tokens long, so a uniform
        # head's score is far below the threshold and the threshold alone decides
        above_chance = top["ci_low"] > top["chance"].fillna(-np.inf)
        strong = top[(top["ci_low"] > RETRIEVAL_THRESHOLD) & above_chance & ~top["thin"]]
        said = _retrieval_null(retrieval, strong.assign(metric=metric), metric)
        if len(strong):
            named = ", ".join(f"{r.label} {r.value:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]" for r in strong.head(TOP).itertuples())
            chance = strong["chance"].iloc[0]
            findings.append(f"{model}: " + ("1 head scores" if len(strong) == 1 else f"{len(strong)} heads score")
                            + f" above Wu et al.'s {RETRIEVAL_THRESHOLD:g} with {'its' if len(strong) == 1 else 'their'}"
                            " whole 95% interval" + ("" if pd.isna(chance) else f", and above chance ({chance:.4f})")
                            + f", {'a retrieval head' if len(strong) == 1 else 'retrieval heads'} by Wu et al.'s definition: "
                            f"{named}; {said}.")
        else:
            findings.append(f"{model}: no head's 95% interval clears {RETRIEVAL_THRESHOLD:g} and chance, so none is "
                            f"a retrieval head by Wu et al.'s definition here; {said}.")
    for name, value in WU_SHARES.items():
        rows.append({"model": f"{name} (Wu et al.)", "score": "retrieval", "trials": "", "heads": "",
                     f"> {RETRIEVAL_THRESHOLD:g}": f"{value:.1%}"})
    blocks += [Bullets(findings),
               Table(pd.DataFrame(rows).fillna(""), numeric=("trials", "heads")),
               Note("Shares of heads by score, Wu et al.'s Figure 3 bins; the last column counts heads whose whole "
                    "95% interval over trials lies above the threshold. Wu et al.'s own models below, from their "
                    "Figure 3 (their Section 3.1: 3% to 6% of heads above 0.1).")]

    def draw(part, name, ax, cbar):
        metric = str(part["metric"].iloc[0])
        heatmaps.head_heatmap(part, model=name, metric=metric, ax=ax, vmin=0.0, vmax=1.0, annotate_top=ANNOTATE_TOP,
                             cbar=cbar, title=f"{name}: {metric}")

    files = heatmap_rows(drawable, pngs, "retrieval", draw)
    blocks.append(Figures(files, "Retrieval score by layer and head (0 to 1); annotated: each model's "
                                 f"{ANNOTATE_TOP} highest heads."))
    frame = pd.DataFrame(tops)
    if len(frame) and not frame["mark"].astype(bool).any():
        frame = frame.drop(columns="mark")
    blocks.append(Table(frame, numeric=("value", "95% low", "95% high", "trials", "chance"), sortable=True))
    return blocks


def _retrieval_null(retrieval: pd.DataFrame, strong: pd.DataFrame, metric: str) -> str:
    """What the retrieval sentence's heads lie against: the model's random-init controls' heads of each one's
    layer where the retrieval table holds them, else that the count describes (`untested_text`)."""
    ranges = control_range(strong, retrieval) if len(strong) else pd.DataFrame({"controls": []})
    if not ranges["controls"].any():
        return untested_text(metric, why="Wu et al.'s threshold is a definition, not a null, and no random-init "
                                         "control was decoded beside this model")
    beyond = sum(untested_text(metric, pd.Series({**dict(row), "ci_low": low, "ci_high": high})).startswith("beyond")
                 for low, high, (_, row) in zip(strong["ci_low"], strong["ci_high"], ranges.iterrows()))
    return (f"{beyond} of them beyond every random-init control head of their layer (a comparison, not a tested "
            "finding)")


def _needle_line(trials: pd.DataFrame, model: str, *, gated: bool) -> str:
    """How many heads are retrieval heads with needles as the unit and Benjamini-Hochberg over the model's heads."""
    tests = retrieval_head_tests(trials, model, gated=gated)
    found = tests[tests["q_value"] <= 0.05].sort_values(["value", "layer", "head"], ascending=[False, True, True])
    needles = int(tests["needles"].max()) if len(tests) else 0
    rule = (f"its mean over {needles} needles above {RETRIEVAL_THRESHOLD:g} by a one-sided t-test over the needles' "
            f"means, at a 5% false-discovery rate (Benjamini-Hochberg over all {len(tests)} heads)")
    rule += ("; a test against Wu et al.'s threshold, a definition: " +
             untested_text("retrieval", why="no random-init control was decoded beside this model"))
    if found.empty:
        return f"{model}: no head is a retrieval head by this rule ({rule})."
    named = ", ".join(f"{r.label} {r.value:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]" for r in found.head(TOP).itertuples())
    return (f"{model}: {len(found)} head{'s are retrieval heads' if len(found) > 1 else ' is a retrieval head'}, "
            f"{rule}; 95% intervals resample needles: {named}.")


def _published_line(model: str, provenance) -> str:
    """What the rows of a model imported from a published score file rest on, in words."""
    trials = provenance.extra.get("trials")
    return (f"{model}: scores imported from the published file `{provenance.id}` (sha256 "
            f"{str(provenance.revision)[:12]}), {trials} trials per head, every one a trial that passed the "
            "publishers' answer gate (their file keeps no failed trial); intervals bootstrapped over those trials as "
            "for headscan's own runs; chance is not defined (the file holds no haystack lengths).")


def _pct(count, total) -> str:
    return "" if not total else f"{count / total:.1%} ({count})"


# --- masking ------------------------------------------------------------------------------------------------


def _chosen_on(comparison: Comparison) -> list[str]:
    """Which needles chose the masked heads and which were masked, per model of each masking run's provenance."""
    lines = []
    for _, run in comparison.runs:
        if "retrieval_masking" not in run.frames:
            continue
        for model in run.provenance.models:
            about = model.extra.get("masking") or {}
            if about.get("mask_needles") is not None:
                lines.append(f"{model.name}: heads chosen on needles {about.get('choose_needles')}, masked on the "
                             f"trials of needles {about['mask_needles']} (the run's needles split by index).")
            elif about.get("ranked_by"):
                lines.append(f"{model.name}: heads ranked by {about['ranked_by']}.")
            else:
                lines.append(f"{model.name}: the run does not record which needles chose its heads (a run before "
                             "the split): they may have been chosen on the trials that test them.")
    return lines


def _masking_part(comparison: Comparison, pngs: Pngs) -> list:
    masking, trials = comparison["retrieval_masking"], comparison["retrieval_masking_trials"]
    rows = masking_by_condition(masking)
    sentences = masking_lines(masking)
    overlaps = []
    sentences += _chosen_on(comparison)
    for model in dict.fromkeys(masking["model"]):
        masked = masked_heads(trials, model)
        if not masked:
            continue
        found = overlap(comparison.heads, model, masked)
        said = [f"{n} among its {len(masked)} highest {name} heads" for name, n in
                (("sink (first_token)", found["first_token"]), ("induction", found["induction"])) if n is not None]
        sentences.append(f"{model}: masked {', '.join(masked)}; of these, " + ("; ".join(said) if said else
                         "no overlap with sink or induction heads can be stated (the sweep scored neither)") + ".")
        sets = draw_overlap(masking, trials, model, retrieval=comparison.frames.get("retrieval"),
                            heads=comparison.heads if len(comparison.heads) else None)
        overlaps.append(sets.assign(model=model))
    files = []
    for model in dict.fromkeys(rows["model"]):
        fig = Figure(figsize=(6.0, 3.6), layout="constrained")
        accuracy_by_depth(rows, model=model, ax=fig.subplots())
        files.append(pngs.add(f"retrieval_masking_{name_part(model)}.png", fig))
    shown = rows.assign(
        length=rows["length"].map(lambda v: "every" if pd.isna(v) else str(int(v))),
        depth=rows["depth"].map(lambda v: "every" if pd.isna(v) else f"{v:g}"),
        accuracy=[_interval(r.value, r.ci_low, r.ci_high) for r in rows.itertuples()],
        drop=[("" if pd.isna(r.drop) else _interval(r.drop, r.drop_low, r.drop_high, signed=True))
              for r in rows.itertuples()],
        passed=rows["passed"].map(lambda v: f"{v:.0%}"), trials=rows["count"].astype(int).astype(str),
        masked=rows["k"].astype(int).astype(str))
    table = shown[["model", "length", "depth", "condition", "masked", "accuracy", "drop", "passed", "trials"]]
    blocks = [Heading(3, "Masking the retrieval heads"),
              Text("Trials decoded again with heads masked (their output zeroed before the output projection, at "
                   "every position of the prefill and of the answer): the top retrieval heads (top), and as many "
                   "random heads drawn from the same layers, never a top head, in seeded draws (random: each draw, and "
                   "pooled). The heads are chosen on needles other than those of the masked trials (half the run's "
                   "needles, or an earlier run on other needles), so the test does not reuse what chose them. "
                   "Accuracy is the answer's ROUGE-1 recall, the answer gate's number, averaged over trials; the drop "
                   "is paired, each masked trial against the same trial unmasked (none), with its 95% interval "
                   "resampling needles (a needle's trials share its words, so they are one unit). The top set's drop "
                   "is ranked among the random draws' drops: its permutation p-value is (1 + draws with a drop at "
                   "least as large) / (draws + 1), so N draws cannot give less than 1/(N + 1). Retrieval heads matter "
                   "to the answer beyond heads of their layers when that p-value is small."),
              Bullets(sentences),
              Figures(files, "Needle accuracy by depth with no head, the top retrieval heads and random heads of "
                             "their layers masked; bars: 95% intervals over needles."),
              Table(table, numeric=("masked", "trials")),
              Note("masked: heads masked; passed: share of trials whose answer passes the gate; drop: the "
                   "condition's accuracy minus none's on the same trials. The rows per length and depth rest on few "
                   "needles each and are not corrected for how many there are: read them as a description, and the "
                   "row over every trial as the test.")]
    if overlaps:
        sets = pd.concat(overlaps, ignore_index=True)
        frame = pd.DataFrame({"model": sets["model"], "set": sets["set"], "heads": sets["heads"],
                              "drop": sets["drop"].map(lambda v: "" if pd.isna(v) else f"{v:+.2f}")})
        for column, name in (("run_top", "in the run's top"), ("sink", "sink"), ("induction", "induction")):
            if sets[column].notna().any():
                frame[name] = sets[column].map(lambda v: "" if pd.isna(v) else str(int(v)))
        blocks += [Table(frame, sortable=True),
                   Note("Each masked set and its drop over every masked trial; in the run's top: how many of its "
                        "heads are among the run's own top retrieval heads (as many as the top set, scored on all "
                        "its trials, the masked ones included); sink and induction: among the sweep's as many highest "
                        "first_token and induction heads. A random draw that hits important heads drops more.")]
    return blocks


def _interval(value, low, high, signed: bool = False) -> str:
    form = "+.2f" if signed else ".2f"
    if pd.isna(low) or pd.isna(high):
        return f"{value:{form}}"
    return f"{value:{form}} [{low:{form}}, {high:{form}}]"


# --- streaming ----------------------------------------------------------------------------------------------


def _streaming_part(comparison: Comparison, pngs: Pngs) -> list:
    heads = comparison.heads
    rows = heads[(heads["metric"] == "streaming") & heads["value"].notna()]
    if rows.empty:
        return []
    blocks: list = [Heading(3, "Streaming heads")]
    sentences, drawable = [], []
    for model in dict.fromkeys(rows["model"]):
        part = rows[rows["model"] == model]
        sink, recent, length = _settings(comparison, model)
        drawable.append((model, part))
        # claims read the interval calibrated for the rows' size where the sweep recorded it (a family never
        # measured, as streaming is, takes the widest factor at its size; too few units: no claim either way)
        too_few = part["cal_basis"].astype(object).eq("too few units") if "cal_basis" in part else \
            pd.Series(False, index=part.index)
        low = part["cal_low"] if "cal_low" in part else part["ci_low"]
        high = part["cal_high"] if "cal_high" in part else part["ci_high"]
        ok = ~thin(part) & ~too_few
        small = int((ok & (high < 0.01)).sum())
        chance = part["chance"].fillna(0.0) if "chance" in part else pd.Series(0.0, index=part.index)
        needs = part[ok & (low > chance)].sort_values("value", ascending=False)
        named = ", ".join(f"{r.label} {r.value:.3f} [{low[r.Index]:.3f}, {high[r.Index]:.3f}]"
                          for r in needs.head(TOP).itertuples())
        if too_few.all():
            sentences.append(f"{model} (sink {sink}, window {recent}, segments of {length} tokens): too few units to "
                             "assess which heads lose what to such a cache; the map below describes this run only.")
            continue
        sentences.append(f"{model} (sink {sink}, window {recent}, segments of {length} tokens): {small} of {len(part)} "
                         "heads lose less than 1% of their attention to such a cache (whole calibrated interval below "
                         "0.01; never measured for coverage, so it takes the widest factor at its size)"
                         + (f"; the heads that lose most: {named}." if named else "."))

    def draw(part, name, ax, cbar):
        heatmaps.head_heatmap(part, model=name, metric="streaming", ax=ax, vmin=0.0, vmax=1.0,
                             annotate_top=ANNOTATE_TOP, cbar=cbar, title=f"{name}: streaming")

    files = heatmap_rows(drawable, pngs, "streaming", draw)
    return blocks + [Bullets(sentences), Figures(files, "Attention outside the sink and the window, by layer and head "
                                                        f"(0 to 1); annotated: each model's {ANNOTATE_TOP} highest heads.")]


# --- relations ------------------------------------------------------------------------------------------------


def _relations_part(comparison: Comparison, pngs: Pngs) -> list:
    retrieval = comparison["retrieval"] if "retrieval" in comparison.frames else None
    weights = comparison["weights"] if "weights" in comparison.frames else None
    wide, rho = relations(comparison.heads, retrieval, weights)
    if rho.empty:
        return []
    blocks: list = [Heading(3, "Retrieval and streaming against induction and copying")]
    pairs = [(other, score) for score, other in (("retrieval", "streaming"), ("retrieval", "induction"),
                                                 ("retrieval", "copying"), ("streaming", "induction"))]
    files = []
    for model in dict.fromkeys(rho["model"]):
        drawn = [(x, y) for x, y in pairs if {x, y} <= set(wide.columns) and wide.loc[wide["model"] == model, [x, y]]
                 .dropna().shape[0]]
        if not drawn:
            continue
        fig = Figure(figsize=(min(3.2 * len(drawn), MAX_WIDTH), 3.2), layout="constrained")
        for ax, (x, y) in zip(fig.subplots(1, len(drawn), squeeze=False)[0], drawn):
            score_scatter(wide, x=x, y=y, model=model, ax=ax, title=f"{model}")
        files.append(pngs.add(f"whole_context_scatter_{name_part(model)}.png", fig))
    table = rho.assign(spearman=rho["spearman"].map(lambda v: f"{v:+.2f}"), heads=rho["heads"].astype(str))
    return blocks + [Figures(files, "Each head's scores against each other (the retrieval score is the gated one "
                                    "where any trial passed, else the ungated one)."),
                     Table(table, numeric=("spearman", "heads")),
                     Note("Spearman rank correlations over the heads with both scores; no interval: read them as a "
                          "description of these heads, not as an estimate.")]


# --- the key/value budget -------------------------------------------------------------------------------------


def _budget_part(comparison: Comparison, palette: dict, pngs: Pngs) -> list:
    parts = []
    for model in dict.fromkeys(comparison.heads["model"]):
        sink, recent, length = _settings(comparison, model)
        parts.append(kv_budget(comparison.heads[comparison.heads["model"] == model], sink=sink, recent=recent,
                               length=length))
    budget = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if budget.empty:
        return []
    fig = Figure(figsize=(6.0, 4.0), layout="constrained")
    kv_budget_curve(budget, palette=palette, ax=fig.subplots())
    rows = []
    for model, part in budget.groupby("model", sort=False):
        sink, recent, length = _settings(comparison, model)
        for goal in (0.9, 0.95, 0.99):
            reached = part[part["kept_low"] >= goal]
            if reached.empty:
                continue
            first = reached.iloc[0]
            rows.append({"model": model, "attention kept": f"{goal:.0%} (band's low end)",
                         "key/value heads whole": f"{int(first['k'])} of {len(part) - 1} ({first['full_share']:.0%})",
                         f"cache memory at {length} tokens": f"{first['memory']:.0%}",
                         "kept (band)": f"{first['kept']:.3f} [{first['kept_low']:.3f}, {first['kept_high']:.3f}]"})
    return [Heading(3, "Key/value budget"),
            Text("Key/value heads sorted by the attention mass a sink-and-window cache would take from their query "
                 "heads (under grouped-query attention a key/value head keeps the whole context if any query head "
                 "reading it needs it, so a group's loss is the sum of its query heads' streaming scores); keeping "
                 "the first k whole keeps the share of attention mass shown, averaged over query heads. The band "
                 "puts every streamed head at its interval's ends (conservative: the ends of separate intervals). "
                 "Dashed: the cache's memory against a full cache at the segment length, the streamed heads keeping "
                 "S + W tokens."),
            Figures([pngs.add("kv_budget.png", fig)], "Share of attention mass kept against the share of key/value "
                                                      "heads keeping the whole context."),
            Table(pd.DataFrame(rows)) if rows else Note("No budget keeps 90% of the attention mass by its band.")]


@register_section("which heads need the whole context", order=110, shown=shown)
def whole_context(context: Context) -> list:
    return whole_context_section(context.comparison, context.palette, context.pngs)
