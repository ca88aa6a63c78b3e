"""The section "What carries the answer": contrastive patching over prompt pairs (patching.parquet, paths.parquet
from ``headscan patch``), each model's heads by the fraction of the logit difference they restore (what
denoising and noising measure, that fractions do not add, what a 0 can mean), AtP's agreement with the exact
patches, and the paths between heads with their q-values and key/value groups. This module loads no model."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from ...analysis.patching import Q_LEVEL, grouped_query_note, kv_sharers, path_tests, positive_total, top_patched
from ...analysis.runs import Comparison
from ...plots.patching import patching_heatmap
from ..document import Bullets, Figures, Heading, Table, Text
from ..figures import MAX_WIDTH
from . import Context, register_section

__all__ = ["patching_section"]

TOP = 8  # heads listed per model
SUMMED = 5  # the top heads whose fractions the model's line adds up, beside all of them
PANEL = 3.4  # inches per model's heatmap


def _interval(value, low, high) -> str:
    """A value and its interval, with four decimals where two would print a small effect as 0."""
    if pd.isna(value):
        return "–"
    digits = 4 if max(abs(x) for x in (value, low, high) if pd.notna(x)) < 0.01 else 2
    return f"{value:+.{digits}f}" + ("" if pd.isna(low) else f" [{low:+.{digits}f}, {high:+.{digits}f}]")


def _about(comparison: Comparison, model: str) -> dict:
    """What the patching run recorded of `model` (its provenance's ``patching``): a patching run joins its model's
    sweep under the model's own name."""
    for _, run in comparison.runs:
        if "patching" in run.frames and model in run.models:
            return run.provenance.model(model).extra.get("patching", {})
    return {}


def _model_lines(comparison: Comparison, patching: pd.DataFrame) -> list[str]:
    lines = []
    for model in dict.fromkeys(patching["model"]):
        about = _about(comparison, model)
        mean = about.get("mean_logit_difference", {})
        line = (f"{model}: {about.get('clean_right', '?')} of {about.get('pairs', '?')} clean prompts give the answer "
                f"the larger logit (mean logit difference {mean.get('clean', float('nan')):.2f} clean, "
                f"{mean.get('corrupted', float('nan')):.2f} corrupted).")
        line += (f" Its positive denoising fractions sum to {positive_total(patching, model):.2f} (the top "
                 f"{SUMMED} to {positive_total(patching, model, k=SUMMED):.2f}), and its noising ones to "
                 f"{positive_total(patching, model, 'noise'):.2f}: heads overlap, so fractions are not shares of one "
                 f"whole and do not add up to 1.")
        recalls = about.get("atp_recall") or {}
        for key, name, against in (("denoise", "AtP", "exact denoising"),
                                   ("atp_star_denoise", "AtP*", "the size of exact denoising")):
            recall = recalls.get(key)
            if recall:
                ten, twenty = (recall[f"top_{k}"].split(" of ") for k in (10, 20))
                line += (f" {name}, as a screen: Spearman {recall['spearman']:.2f} with {against}; its top "
                         f"{ten[1]} holds {ten[0]} of the exact top {ten[1]}, its top {twenty[1]} {twenty[0]} of the "
                         f"exact top {twenty[1]}.")
        lines.append(line)
    return lines


def _selection(comparison: Comparison, model: str) -> str:
    """Where `model`'s path candidates were chosen and where their paths were estimated, as its run recorded."""
    chosen = _about(comparison, model).get("path_selection")
    if not chosen:
        return (f"{model}: the candidates were chosen and the paths estimated on the same pairs (a run made before "
                f"headscan held them apart), so the top paths' values lean high; its p- and q-values are read off its "
                f"intervals.")
    return (f"{model}: candidates {', '.join(chosen['candidates'])}, chosen on pairs {chosen['chosen_on']}; paths "
            f"estimated on pairs {chosen['estimated_on']}.")


def _group(patching: pd.DataFrame, path) -> str:
    """A key or value path's key/value group and how many query heads read it; "–" for a query path or a group of
    one head (no grouped-query attention)."""
    sharers = kv_sharers(patching, path.model, int(path.layer), int(path.kv_group))
    return f"{int(path.kv_group)} ({len(sharers)} heads)" if path.path != "q" and len(sharers) > 1 else "–"


def _paths_blocks(comparison: Comparison, patching: pd.DataFrame) -> list:
    paths = path_tests(comparison["paths"])
    paths = paths[paths["target"] == "fraction"]
    tested = {model: len(rows) for model, rows in paths.groupby("model", sort=False)}
    shown = paths.sort_values("value", ascending=False, kind="stable").head(10)
    notes = list(dict.fromkeys(note for _, row in shown.iterrows()
                               if (note := grouped_query_note(patching, row)) is not None))
    return [
        Heading(3, "Paths between heads"),
        Text("Path patching: the sender's clean output reaches only the receiver's queries, keys or values (the heads "
             "between them frozen at their corrupted outputs); the fraction restored through that one path, with its "
             "95% interval over pairs. With --path-top the candidates (senders and receivers, the top heads by "
             "denoising) are chosen on other pairs than those the paths are estimated on, as each model's line says. "
             f"A path is said to carry part of the difference where its Benjamini-Hochberg q-value over the paths "
             f"tested is at most {Q_LEVEL} (" + ", ".join(f"{n} paths of {model}" for model, n in tested.items())
             + "): a q-value says an effect is not 0, not that it is large. A key or value path of a grouped-query "
             "model patches the receiver's key/value group, which several query heads read (kv group)."),
        Bullets([_selection(comparison, model) for model in tested] + [note[0].upper() + note[1:] + "." for note in notes]),
        Table(pd.DataFrame({
            "model": shown["model"], "sender": shown["sender_label"], "receiver": shown["label"],
            "through": shown["path"].map({"q": "queries", "k": "keys", "v": "values"}),
            "kv group": [_group(patching, r) for r in shown.itertuples()],
            "restored [95%]": [_interval(r.value, r.ci_low, r.ci_high) for r in shown.itertuples()],
            "q": [f"{q:.2g}" if pd.notna(q) else "–" for q in shown["q_value"]],
            f"q ≤ {Q_LEVEL}": ["yes" if q <= Q_LEVEL else "no" for q in shown["q_value"]]}), sortable=True)]


def patching_section(comparison: Comparison, pngs) -> list:
    patching = comparison["patching"]
    blocks: list = [
        Heading(2, "What carries the answer"),
        Text("Contrastive activation patching over prompt pairs (Wang et al. 2022): a clean prompt and a corrupted "
             "one that differ in one word, read as the logit difference between the answer and a wrong answer at "
             "the last token. Denoising puts one head's clean output into the corrupted run: it measures "
             "sufficiency, how much of the clean-minus-corrupted difference that head alone restores. Noising puts "
             "its corrupted output into the clean run: it measures necessity, how much is lost without the head's "
             "clean output. Each number is a fraction of the difference, summed over pairs, with a 95% interval "
             "over pairs. Fractions do not add: heads overlap and interact, so a model's fractions can sum past 1. "
             "A 0 is no effect under that patch, not no part in the task: under noising a head whose work another "
             "head also does (a backup) scores 0, since the other still carries the difference; under denoising a "
             "head that acts only together with others scores 0, since alone it restores nothing. Labels are "
             "0-indexed."),
        Bullets(_model_lines(comparison, patching)),
    ]
    models = list(dict.fromkeys(patching["model"]))
    fig = Figure(figsize=(min(MAX_WIDTH, PANEL * len(models) + 0.6), PANEL), layout="constrained")
    for ax, model in zip(fig.subplots(1, len(models), squeeze=False)[0], models):
        patching_heatmap(patching, model=model, ax=ax)
    blocks.append(Figures([pngs.add("patching.png", fig)], "Fraction of the logit difference each head restores "
                          "when its clean output is patched into the corrupted run (red: restores; blue: the "
                          "opposite); the largest three written in."))
    top = top_patched(patching, "denoise", TOP)
    noise = patching[(patching["method"] == "noise") & (patching["target"] == "fraction") & patching["position"].isna()]
    noise = noise.set_index(["model", "label"])
    blocks.append(Table(pd.DataFrame({
        "model": top["model"], "head": top["label"],
        "restored (denoising) [95%]": [_interval(r.value, r.ci_low, r.ci_high) for r in top.itertuples()],
        "destroyed (noising) [95%]": [_interval(*noise.loc[(r.model, r.label), ["value", "ci_low", "ci_high"]])
                                      if (r.model, r.label) in noise.index else "–" for r in top.itertuples()]}),
        sortable=True, note=f"Each model's {TOP} heads that restore the most, ranked on the same pairs their "
                            f"fractions and intervals are estimated on: the top of such a ranking leans high (the "
                            f"winner's curse), and an interval is one head's, not a claim about the ranking."))
    if "paths" in comparison.frames:
        blocks += _paths_blocks(comparison, patching)
    return blocks


@register_section("what carries the answer", order=135, shown=lambda comparison: "patching" in comparison.frames)
def patching(context: Context) -> list:
    return patching_section(context.comparison, context.pngs)
