"""The section "What carries the answer": contrastive patching over prompt pairs (patching.parquet, paths.parquet
from ``headscan patch``), each model's heads by the fraction of the logit difference they restore, AtP's agreement
with the exact patches, and the paths between heads. This module loads no model."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from ...analysis.patching import top_patched
from ...analysis.runs import Comparison
from ...plots.patching import patching_heatmap
from ..document import Bullets, Figures, Heading, Table, Text
from ..figures import MAX_WIDTH
from . import Context, register_section

__all__ = ["patching_section"]

TOP = 8  # heads listed per model
PANEL = 3.4  # inches per model's heatmap


def _interval(value, low, high) -> str:
    if pd.isna(value):
        return "–"
    return f"{value:+.2f}" + ("" if pd.isna(low) else f" [{low:+.2f}, {high:+.2f}]")


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


def patching_section(comparison: Comparison, pngs) -> list:
    patching = comparison["patching"]
    blocks: list = [
        Heading(2, "What carries the answer"),
        Text("Contrastive activation patching over prompt pairs (Wang et al. 2022): a clean prompt and a corrupted "
             "one that differ in one word, read as the logit difference between the answer and a wrong answer at "
             "the last token. Denoising puts one head's clean output into the corrupted run, noising its corrupted "
             "output into the clean run; each head's number is the fraction of the clean-minus-corrupted difference "
             "it restores (or destroys), summed over pairs, with a 95% interval over pairs. 0 is a head that carries "
             "none of it. Labels are 0-indexed."),
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
        sortable=True, note=f"Each model's {TOP} heads that restore the most."))
    if "paths" in comparison.frames:
        paths = comparison["paths"]
        paths = paths[paths["target"] == "fraction"].sort_values("value", ascending=False, kind="stable").head(10)
        blocks += [Heading(3, "Paths between heads"),
                   Text("Path patching: the sender's clean output reaches only the receiver's queries, keys or values "
                        "(the heads between them frozen at their corrupted outputs); the fraction restored through "
                        "that one path, with its 95% interval over pairs."),
                   Table(pd.DataFrame({
                       "model": paths["model"], "sender": paths["sender_label"], "receiver": paths["label"],
                       "through": paths["path"].map({"q": "queries", "k": "keys", "v": "values"}),
                       "restored [95%]": [_interval(r.value, r.ci_low, r.ci_high) for r in paths.itertuples()],
                       "above 0": ["yes" if r.ci_low > 0 else "no" for r in paths.itertuples()]}), sortable=True)]
    return blocks


@register_section("what carries the answer", order=135, shown=lambda comparison: "patching" in comparison.frames)
def patching(context: Context) -> list:
    return patching_section(context.comparison, context.pngs)
