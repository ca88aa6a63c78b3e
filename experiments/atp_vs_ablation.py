"""AtP against exact ablation: does attribution patching rank a model's heads as removing them does?

Claim. Attribution patching's first-order estimate of each head's effect, from one backward pass per batch,
orders the heads as exact single-head ablation does: Spearman's rank correlation of at least 0.8 between AtP's
estimate and the exact change of the loss, over every head of smollm2 (30 layers x 9 query heads) on 64 UD
English EWT dev sentences, for mean ablation (and, reported beside it, zero ablation).

Literature. Nanda (2023) introduced attribution patching and warned that it "works badly for big things"
(large activation changes, such as removing a layer-0 component). Kramár et al. (2024, AtP*) find AtP's
false negatives come from attention saturation (a patched query or key moves a softmax far from linear) and
from cancellation between a node's direct and indirect effects; headscan patches each head's output z after
the softmax, so saturation does not enter, but cancellation and large effects do. Their numbers are for
Pythia and activation patching between prompt pairs, not for mean ablation over a corpus, so the 0.8 here is
this project's bar, not theirs.

    python experiments/atp_vs_ablation.py                            # smollm2, 64 sentences: 2-3 hours, 2 cores
    python experiments/atp_vs_ablation.py --model minilm --limit 16   # no AtP (hidden_change): exact effects only
    python experiments/atp_vs_ablation.py --from-heads reports/experiments/atp_vs_ablation   # README again, no sweep
    python experiments/atp_vs_ablation.py --from-heads reports/experiments/atp_vs_ablation --add-atp-star
        # AtP* (GradDrop, mean ablation) on run.json's sentences and settings, added to heads.csv: ~20 min

Writes ``reports/experiments/atp_vs_ablation/`` (or ``--out``):

- ``heads.csv``: one row per head, columns ``model, layer, head, label`` and, for each method (``atp_mean``,
  ``atp_zero``, ``mean_ablation``, ``zero_ablation``), its value and ``<method>_ci_low``/``<method>_ci_high``;
  and ``atp_star`` (AtP* of mean ablation, `headscan.models.atp_star`: a size per token, no interval);
- ``run.json``: the run's settings (below);
- ``scatter.png``: AtP against exact, mean and zero ablation (resample ablation has no AtP estimate);
- ``README.md``: the check, the rank agreement, the agreement over subsets of heads (every head; layers 1 and
  up; layers 2 and up; heads whose mean-ablation 95% interval excludes 0; the fifth with the largest
  |mean_ablation|), the heads AtP misjudges most and their layers, and, where the bar is missed, by how much
  and where. A hand-written section between ``<!-- notes -->`` and ``<!-- /notes -->`` survives every rewrite.

The README is always written from ``heads.csv`` and ``run.json`` as they are on disk, so ``--from-heads FOLDER``
(no sweep) writes the same README a run wrote, keeping the notes of the README already in the output folder,
and redraws ``scatter.png`` from ``heads.csv``. With ``--out`` elsewhere it copies ``heads.csv`` and
``run.json`` there first.

``run.json`` (written by a run; write it by hand for a run made before the script wrote one):

- required: ``model`` (name, as in heads.csv), ``corpus`` (the file's name or "builtin"), ``limit``
  (sentences), ``max_len``, ``batch_size``, ``device``, ``minutes`` (the sweep's wall time), ``target``
  (``next_token_loss``, ``masked_loss`` or ``hidden_change``);
- optional (the README leaves out what is missing): ``bootstrap``, ``seconds``, ``command`` (the line that
  reproduces the run), ``headscan_version``, ``git_revision``, ``importance`` (the sweep's importance notes,
  a dict: ``ablation_passes``, ``sample``, ``ablated_heads``, ``means``, ...; ``ablated``, the list of pairs,
  is left out).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from _common import corpus_name, ewt_dev, markdown_table, out_folder, verdict, weights_present

import headscan
from headscan.analysis.importance import agreement, spearman
from headscan.corpus import read_corpus
from headscan.plots.importance import atp_against_exact
from headscan.scan import sweep_model

BAR = 0.8  # the Spearman correlation AtP must reach against exact mean ablation
MISSES = 10  # heads listed where AtP and exact ablation differ most
METHODS = ("atp_mean", "atp_zero", "mean_ablation", "zero_ablation", "resample_ablation")
REQUIRED = ("model", "corpus", "limit", "max_len", "batch_size", "device", "minutes", "target")
NOTES_OPEN, NOTES_CLOSE = "<!-- notes -->", "<!-- /notes -->"
TOLD_FROM_0 = "exact effect's 95% interval excludes 0"
EMPTY_NOTES = "<!-- Hand-written notes go here: a rewrite of this README (--from-heads) keeps them. -->"


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--corpus", default=None, help="default: EWT dev, else builtin")
    parser.add_argument("--limit", type=int, default=64, help="sentences (default 64)")
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None, help="default: reports/experiments/atp_vs_ablation "
                                                    "(with --from-heads: that folder)")
    parser.add_argument("--from-heads", default=None, metavar="FOLDER",
                        help="no sweep: write README.md and scatter.png again from FOLDER's heads.csv and run.json")
    parser.add_argument("--add-atp-star", action="store_true",
                        help="with --from-heads: first compute AtP* on the sentences and settings of FOLDER's "
                             "run.json and add its column to heads.csv (no exact sweep)")
    return parser.parse_args(argv)


# --- tables ---------------------------------------------------------------------------------------------------


def per_head(table: pd.DataFrame) -> pd.DataFrame:
    """One row per head: each method's value and interval."""
    # label out of the index: dropna=False (a method NaN for every head stays a column) would cross every label
    # with every (layer, head)
    wide = table.pivot_table(index=["model", "layer", "head"], columns="method",
                             values=["value", "ci_low", "ci_high"], dropna=False)
    wide.columns = [f"{method}" if stat == "value" else f"{method}_{stat}" for stat, method in wide.columns]
    labels = table.drop_duplicates(["model", "layer", "head"]).set_index(["model", "layer", "head"])["label"]
    wide.insert(0, "label", labels.reindex(wide.index))
    return wide.reset_index()


def importance_rows(heads: pd.DataFrame, target: str) -> pd.DataFrame:
    """heads.csv back into importance.parquet's long rows (model, layer, head, label, method, value, ci_low,
    ci_high, target), one per head and method present, for the library's `agreement` and plots."""
    parts = []
    for method in METHODS:
        if method not in heads:
            continue
        part = heads[["model", "layer", "head", "label"]].copy()
        part["method"] = method
        for stat, column in (("value", method), ("ci_low", f"{method}_ci_low"), ("ci_high", f"{method}_ci_high")):
            part[stat] = heads[column] if column in heads else float("nan")
        parts.append(part)
    if not parts:
        raise ValueError(f"heads.csv has none of the methods {', '.join(METHODS)}; its columns: {list(heads.columns)}")
    rows = pd.concat(parts, ignore_index=True)
    rows["target"] = target
    return rows


def subsets(heads: pd.DataFrame) -> pd.DataFrame:
    """Agreement of AtP with exact ablation over subsets of the heads: every head; layers 1 and up; layers 2 and
    up; the heads whose mean-ablation 95% interval excludes 0; the fifth of heads (rounded up) with the largest
    |mean_ablation|. ``n`` is the subset's size; the correlations leave out heads where either value is NaN."""
    heads = heads.reindex(columns=list(dict.fromkeys([*heads.columns, *METHODS, "mean_ablation_ci_low",
                                                      "mean_ablation_ci_high"])))
    exact = heads["mean_ablation"]
    measured = exact.notna()
    fifth = exact[measured].abs().nlargest(math.ceil(measured.sum() / 5)).index
    chosen = {
        "every head": pd.Series(True, index=heads.index),
        "layers 1 and up": heads["layer"] >= 1,
        "layers 2 and up": heads["layer"] >= 2,
        TOLD_FROM_0: (heads["mean_ablation_ci_low"] > 0)
        | (heads["mean_ablation_ci_high"] < 0),
        "the fifth with the largest exact effects": heads.index.isin(fifth),
    }
    rows = []
    for name, mask in chosen.items():
        part = heads[mask]
        mean = part[["atp_mean", "mean_ablation"]].dropna()
        rows.append({"heads": name, "n": len(part),
                     "Spearman (mean)": spearman(part["atp_mean"], part["mean_ablation"]),
                     "Spearman (zero)": spearman(part["atp_zero"], part["zero_ablation"]),
                     "Pearson (mean)": float(mean["atp_mean"].corr(mean["mean_ablation"])) if len(mean) >= 3
                     else float("nan")})
    return pd.DataFrame(rows, columns=["heads", "n", "Spearman (mean)", "Spearman (zero)", "Pearson (mean)"])


def worst(heads: pd.DataFrame, top: int = MISSES) -> pd.DataFrame:
    """The `top` heads where AtP's estimate is farthest from the exact mean ablation; miss = atp_mean -
    mean_ablation."""
    columns = ["label", "layer", "mean_ablation", "atp_mean", "miss", "zero_ablation", "atp_zero"]
    heads = heads.reindex(columns=list(dict.fromkeys([*heads.columns, *METHODS])))
    both = heads.dropna(subset=["atp_mean", "mean_ablation"]).copy()
    both["miss"] = both["atp_mean"] - both["mean_ablation"]
    return both.reindex(both["miss"].abs().sort_values(ascending=False, kind="stable").index).head(top)[columns]


def by_layer(misses: pd.DataFrame) -> pd.DataFrame:
    """The misjudged heads counted by layer: how many, which, and the largest |miss| among them."""
    groups = misses.groupby("layer", sort=True)
    return pd.DataFrame({"layer": list(groups.groups),
                         "misjudged": groups.size().to_list(),
                         "which": groups["label"].agg(", ".join).to_list(),
                         "largest abs(miss)": groups["miss"].agg(lambda m: float(m.abs().max())).to_list()})


# --- AtP* -----------------------------------------------------------------------------------------------------


def atp_star_heads(model, corpus, config) -> pd.DataFrame:
    """AtP* of mean ablation per head (`headscan.models.atp_star`: GradDrop, no QK fix), on the sweep's own
    sample, means, positions and batches: the mean pass of `headscan.scan.importance` gives each head's mean,
    the replaced positions are the sweep's (each segment's first left alone unless ``ablate_first``). Per head
    ``atp_star``: the sum over sequences of the paper's per-prompt score (1/(L-1) sum over dropped layers of
    |estimate|) over the target's token count, a size in the target's units; ``atp_star_check``: plain AtP from
    the same passes, which must equal the sweep's ``atp_mean``."""
    import torch

    from headscan.corpus import batches, encode
    from headscan.metrics.importance import importance_keys, target_sums
    from headscan.models.atp_star import atp_star
    from headscan.scan.importance import ImportanceRun, ImportanceState, replaced

    columns = [(None, key, "importance") for key in importance_keys(config)]
    with ImportanceRun(model, corpus, config, columns) as run:
        run.prepare(ImportanceState(np.zeros((0, 0, 0))), lambda: False, lambda: None)
        encoded = encode(corpus, model, config.max_len, indices=run.sample, long=config.long)
        pad = model.special_token_ids["pad"]
        star = torch.zeros((model.n_layers, model.n_heads), dtype=torch.float64)
        atp = torch.zeros_like(star)
        tokens = 0.0
        for batch in batches(encoded, config.batch_size, pad if pad is not None else 0):
            ids, mask = batch.input_ids.to(model.device), batch.attention_mask.to(model.device)
            real = mask.bool()
            sums = {}

            def target(output, ids=ids, real=real, sums=sums):
                sums["total"], sums["count"] = target_sums(run.target, output, tokens=ids, real=real)
                return sums["total"]

            result = atp_star(run.surgery, ids, mask, run.means, target,
                              positions=replaced(real, config.ablate_first))
            star += result.star.double().sum(0).cpu()
            atp += result.atp.double().sum(0).cpu()
            tokens += float(sums["count"].sum())
    layer, head = np.meshgrid(np.arange(model.n_layers), np.arange(model.n_heads), indexing="ij")
    return pd.DataFrame({"layer": layer.ravel(), "head": head.ravel(),
                         "atp_star": (star / tokens).numpy().ravel(), "atp_star_check": (atp / tokens).numpy().ravel()})


def with_atp_star(heads: pd.DataFrame, star: pd.DataFrame) -> tuple[pd.DataFrame, float]:
    """heads.csv with the ``atp_star`` column (replaced if there), and the largest |atp_star_check - atp_mean|:
    0 up to rounding when AtP* ran on the sweep's sentences and settings."""
    merged = heads.drop(columns=["atp_star"], errors="ignore").merge(star, on=["layer", "head"], how="left")
    gap = float((merged["atp_star_check"] - merged["atp_mean"]).abs().max()) if "atp_mean" in merged else float("nan")
    return merged.drop(columns=["atp_star_check"]), gap


def recall(estimate: pd.Series, exact: pd.Series, k: int) -> tuple[int, int]:
    """(k, how many of exact's k largest |values| are among estimate's k largest |values|), over heads with both."""
    both = pd.DataFrame({"estimate": estimate, "exact": exact}).dropna()
    k = min(k, len(both))
    return k, len(set(both["exact"].abs().nlargest(k).index) & set(both["estimate"].abs().nlargest(k).index))


def star_table(heads: pd.DataFrame) -> pd.DataFrame:
    """AtP and AtP* against exact mean ablation: Spearman and recall of the exact top 10 and top 20. AtP* is a
    size, so it is ranked against |mean_ablation|; AtP both signed and as a size."""
    exact = heads["mean_ablation"]
    rows = []
    for name, estimate, against, target in (
            ("AtP (atp_mean)", heads["atp_mean"], "mean_ablation", exact),
            ("abs(AtP)", heads["atp_mean"].abs(), "abs(mean_ablation)", exact.abs()),
            ("AtP* (atp_star)", heads["atp_star"], "abs(mean_ablation)", exact.abs())):
        (top, shared), (top20, shared20) = recall(estimate, exact, 10), recall(estimate, exact, 20)
        rows.append({"estimate": name, "against": against, "Spearman": spearman(estimate, target),
                     "top-10 recall": f"{shared} of {top}", "top-20 recall": f"{shared20} of {top20}"})
    return pd.DataFrame(rows)


def star_section(heads: pd.DataFrame, settings: dict) -> list[str]:
    """The README's AtP* section, empty without an ``atp_star`` column."""
    if "atp_star" not in heads or heads["atp_star"].isna().all():
        return []
    ran = settings.get("atp_star") or {}
    how = (f" It took {float(ran['minutes']):.1f} minutes ({ran.get('device', settings['device'])})"
           + (f", with headscan git {ran['git_revision'][:12]}" if ran.get("git_revision") else "") + "."
           if ran.get("minutes") is not None else "")
    lines = ["## AtP* (GradDrop) beside AtP\n",
             "AtP* (Kramár et al. 2024) for each head's output, mean ablation as the replacement, on the same "
             "sentences, means, replaced positions and batches: for each layer l one backward pass with the "
             "gradient through block l's contribution to the residual stream dropped, and per sentence the mean "
             "over the other L - 1 layers of the estimates' sizes, summed over sentences and divided by the "
             "token count (`headscan.models.atp_star`). No QK fix: it concerns query and key nodes, and a head's "
             "output is taken after its own softmax. AtP* is a size, so it is ranked against |mean_ablation|; "
             "recall counts how many of the exact top k by |effect| are in the estimate's own top k." + how
             + "\n"]
    if ran.get("command"):
        lines.append(f"    {ran['command']}\n")
    if ran.get("atp_check") is not None:
        lines.append(f"Plain AtP from the same passes differs from the sweep's `atp_mean` by at most "
                     f"{float(ran['atp_check']):.1e} per token.\n")
    return lines + [markdown_table(star_table(heads))]


# --- run.json and README -----------------------------------------------------------------------------------


def read_settings(folder: Path) -> dict:
    path = folder / "run.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: --from-heads needs the run's settings beside heads.csv "
                                f"(fields: {', '.join(REQUIRED)}; see this script's docstring)")
    settings = json.loads(path.read_text())
    missing = [key for key in REQUIRED if key not in settings]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}; a run.json needs {', '.join(REQUIRED)} "
                         "(see this script's docstring)")
    return settings


def notes_of(readme: Path) -> str:
    """The hand-written section of an existing README (between the markers), else the empty placeholder."""
    if readme.is_file():
        found = re.search(re.escape(NOTES_OPEN) + r"\n?(.*?)\n?" + re.escape(NOTES_CLOSE), readme.read_text(), re.S)
        if found:
            return found.group(1)
        # a README without the markers may hold hand-written text: never overwrite it silently
        raise ValueError(f"{readme} has no {NOTES_OPEN} ... {NOTES_CLOSE} section: put its hand-written text "
                         "between those markers (or delete the README) and run again")
    return EMPTY_NOTES


def checked_rho(agree: pd.DataFrame) -> float:
    """Spearman(atp_mean, mean_ablation) from `agreement`'s table; NaN where no head has both."""
    checks = agree[agree["exact"] == "mean_ablation"]
    return float(checks["spearman"].iloc[0]) if len(checks) else float("nan")


def recall_line(agree: pd.DataFrame) -> str:
    """AtP as a screen: how many of exact ablation's ten and twenty largest |effects| it puts in its own ten and
    twenty, per pair of methods (`agreement`'s ``top_shared`` and ``top20_shared``)."""
    parts = [f"`{row.estimate}` finds {row.top_shared} of `{row.exact}`'s top {row.top} and {row.top20_shared} of "
             f"its top {row.top20}" for row in agree.itertuples()]
    return ("Recall as a screen (exact ablation's largest |effects| that AtP also ranks in its own top k): "
            + "; ".join(parts) + ".\n") if parts else ""


def readme_text(heads: pd.DataFrame, settings: dict, notes: str = EMPTY_NOTES) -> str:
    """The README for `heads` (heads.csv's rows) and `settings` (run.json), with `notes` as its hand-written
    section."""
    notes_run = settings.get("importance") or {}
    agree = agreement(importance_rows(heads, settings["target"]))
    rho = checked_rho(agree)
    ok = rho >= BAR
    version = settings.get("headscan_version")
    revision = settings.get("git_revision")
    made_with = (f" headscan {version}" if version else "") + (f" (git {revision[:12]})" if revision else "")
    lines = [
        "# AtP against exact ablation\n",
        f"Model `{settings['model']}`, corpus `{settings['corpus']}`, first {settings['limit']} sentences, max_len "
        f"{settings['max_len']}, batch size {settings['batch_size']}"
        + (f", {settings['bootstrap']} bootstrap resamples" if settings.get("bootstrap") is not None else "")
        + f"; target `{settings['target']}`; every head ablated exactly ("
        + ", ".join(m.removesuffix("_ablation") for m in METHODS if m.endswith("_ablation") and m in heads)
        + "), one at a time"
        + (f" ({notes_run['ablation_passes']})" if notes_run.get("ablation_passes") else "")
        + (f"; {notes_run['positions']}" if notes_run.get("positions") else "")
        + f"; means over {notes_run.get('sample', 'the corpus')}. The sweep took {float(settings['minutes']):.1f} "
        f"minutes on this machine ({settings['device']})" + (f", with{made_with}" if made_with else "") + ".\n",
    ]
    if settings.get("command"):
        lines.append(f"    {settings['command']}\n")
    lines.append(f"Check: Spearman(atp_mean, mean_ablation) >= {BAR}: **{verdict(ok)}** ({rho:.3f})"
                 + (f", {BAR - rho:.3f} short of the bar" if rho < BAR else "") + ".\n")
    lines.append(recall_line(agree))
    lines += ["## Rank agreement\n", markdown_table(agree)]
    lines += star_section(heads, settings)
    parts = subsets(heads)
    lines += ["## Agreement over subsets of heads\n",
              "Spearman (mean): atp_mean against mean_ablation; Spearman (zero): atp_zero against zero_ablation; "
              "Pearson (mean): the linear correlation of atp_mean and mean_ablation. The interval and the fifth "
              "are the exact mean ablation's.\n", markdown_table(parts)]
    misses = worst(heads)
    if len(misses):
        layers = by_layer(misses)
        early = int(misses["layer"].le(1).sum())
        if rho < BAR:  # False for NaN
            rows = parts.set_index("heads")["Spearman (mean)"]
            lines += ["## By how much, and where\n",
                      f"Spearman(atp_mean, mean_ablation) is {rho:.3f}, {BAR - rho:.3f} short of {BAR}. Over layers "
                      f"1 and up it is {rows['layers 1 and up']:.3f}, over layers 2 and up "
                      f"{rows['layers 2 and up']:.3f}, and over the heads whose exact effect's interval excludes 0 "
                      f"{rows[TOLD_FROM_0]:.3f}. {early} of the {len(misses)} heads AtP misjudges most "
                      "are in layers 0 and 1.\n",
                      "What the literature expects: a first-order estimate \"works badly for big things\" (Nanda "
                      "2023), and removing an early head changes the residual stream every later layer reads; AtP "
                      "also misjudges heads whose direct and indirect effects cancel (Kramár et al. 2024, AtP*). "
                      "Attention saturation, AtP*'s other cause, cannot enter: headscan patches each head's output "
                      "after the softmax.\n"]
        lines += [f"## The {len(misses)} heads AtP misjudges most (mean ablation)\n",
                  "Values are changes of the loss per token (ablated minus clean); miss = atp_mean - mean_ablation.\n",
                  markdown_table(misses, floats="{:+.4f}"),
                  "By layer:\n", markdown_table(layers, floats="{:.4f}")]
    else:
        lines += ["## The heads AtP misjudges most\n", "No head has both atp_mean and mean_ablation.\n"]
    lines += ["![AtP against exact ablation](scatter.png)\n", f"{NOTES_OPEN}\n{notes}\n{NOTES_CLOSE}\n"]
    return "\n".join(lines)


def git_revision() -> str | None:
    """This checkout's commit, for run.json; None outside a git checkout."""
    import subprocess

    try:
        found = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "HEAD"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip() or None


def draw_star(heads: pd.DataFrame, ax) -> None:
    """|AtP| and AtP* (y) against |exact mean ablation| (x), log-log: a screen finds the heads on the right."""
    both = heads.dropna(subset=["atp_mean", "atp_star", "mean_ablation"])
    exact = both["mean_ablation"].abs()
    for values, label, marker in ((both["atp_mean"].abs(), "|atp_mean|", "o"), (both["atp_star"], "atp_star", "x")):
        ax.scatter(exact, values, s=10, marker=marker, alpha=0.6, label=label)
    low = max(float(min(exact.min(), both["atp_star"].min())), 1e-6)
    high = float(max(exact.max(), both["atp_star"].max(), both["atp_mean"].abs().max()))
    ax.plot([low, high], [low, high], color="grey", linewidth=0.8)
    ax.set(xscale="log", yscale="log", xlabel="|mean_ablation|", ylabel="estimate",
           title="AtP* and |AtP| against |exact|")
    ax.legend(fontsize=8)


def draw(table: pd.DataFrame, model: str, path, heads: pd.DataFrame | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    star = heads is not None and "atp_star" in heads and heads["atp_star"].notna().any()
    fig, axes = plt.subplots(1, 3 if star else 2, figsize=(12.5 if star else 8.5, 4.0), layout="constrained")
    for ax, (estimate, exact) in zip(axes, (("atp_mean", "mean_ablation"), ("atp_zero", "zero_ablation"))):
        atp_against_exact(table, model=model, estimate=estimate, exact=exact, ax=ax)
    if star:
        draw_star(heads, axes[2])
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(folder: Path) -> float:
    """README.md and scatter.png from `folder`'s heads.csv and run.json (the README's notes kept); returns
    Spearman(atp_mean, mean_ablation)."""
    heads = pd.read_csv(folder / "heads.csv")
    settings = read_settings(folder)
    readme = folder / "README.md"
    notes = notes_of(readme)  # first: a README it may not rewrite leaves the scatter untouched too
    rows = importance_rows(heads, settings["target"])
    draw(rows, str(heads["model"].iloc[0]), folder / "scatter.png", heads)
    readme.write_text(readme_text(heads, settings, notes))
    return checked_rho(agreement(rows))


def settings_of(args, run, source, seconds: float, argv) -> dict:
    """run.json: the settings a README is written from."""
    notes = dict(run.provenance.models[0].extra.get("importance", {}))
    notes.pop("ablated", None)  # every (layer, head) pair; `ablated_heads` says which
    return {"model": run.provenance.models[0].name, "corpus": corpus_name(source), "limit": args.limit,
            "max_len": args.max_len, "batch_size": args.batch_size, "bootstrap": args.bootstrap,
            "device": args.device, "minutes": round(seconds / 60, 2), "seconds": round(seconds, 1),
            "target": notes.get("target"),
            "command": shlex.join(["python", "experiments/atp_vs_ablation.py", *argv]),
            "headscan_version": run.provenance.headscan_version, "git_revision": run.provenance.git_revision,
            "importance": notes}


def add_atp_star(folder: Path, settings: dict, argv, corpus=None, model=None) -> dict:
    """Compute AtP* on the sentences and settings of `settings` (run.json's), add its column to `folder`'s
    heads.csv and return run.json's ``atp_star`` record (how long, which revision, which command, the check)."""
    if settings["target"] == "hidden_change":
        return {"note": "none: the first-order change of hidden_change is 0"}
    if corpus is None:
        source = settings["corpus"] if settings["corpus"] == "builtin" else ewt_dev()
        if corpus_name(source) != settings["corpus"]:
            raise FileNotFoundError(f"run.json's corpus is {settings['corpus']!r}, this machine has {source!r}")
        corpus = read_corpus(source, limit=settings["limit"])
    model = model or headscan.load_model(settings["model"], device=settings["device"])
    config = headscan.SweepConfig(device=settings["device"], max_len=settings["max_len"],
                                  batch_size=settings["batch_size"], importance="ablate", values=False,
                                  ablate_first=bool((settings.get("importance") or {}).get("ablate_first", False)))
    started = time.perf_counter()
    star = atp_star_heads(model, corpus, config)
    seconds = time.perf_counter() - started
    heads, gap = with_atp_star(pd.read_csv(folder / "heads.csv"), star)
    heads.to_csv(folder / "heads.csv", index=False)
    return {"method": "GradDrop (Kramár et al. 2024, eq. 11) of mean ablation, no QK fix", "device": settings["device"],
            "minutes": round(seconds / 60, 2), "seconds": round(seconds, 1), "atp_check": gap,
            "git_revision": git_revision(), "command": shlex.join(["python", "experiments/atp_vs_ablation.py", *argv])}


def from_heads(folder: Path, out: Path) -> float:
    if not (folder / "heads.csv").is_file():
        raise FileNotFoundError(f"{folder / 'heads.csv'} not found: --from-heads takes a folder this script wrote")
    read_settings(folder)  # its own run.json, checked before anything is copied
    if out.resolve() != folder.resolve():
        for name in ("heads.csv", "run.json"):
            if (folder / name).is_file():
                shutil.copyfile(folder / name, out / name)
    return write_outputs(out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    if args.from_heads:
        folder = Path(args.from_heads)
        out = out_folder("atp_vs_ablation", args.out or folder)
        if args.add_atp_star:
            if out.resolve() != folder.resolve():
                for name in ("heads.csv", "run.json"):
                    shutil.copyfile(folder / name, out / name)
            settings = read_settings(out)
            settings["atp_star"] = add_atp_star(out, settings, argv)
            (out / "run.json").write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n")
        rho = from_heads(out if args.add_atp_star else folder, out)
        print(f"{verdict(rho >= BAR)}: Spearman(atp_mean, mean_ablation) = {rho:.3f}; wrote {out / 'README.md'}")
        return 0 if rho >= BAR else 1
    out = out_folder("atp_vs_ablation", args.out)
    source = args.corpus or ewt_dev()
    if not weights_present(args.model):
        print(f"SKIP {args.model}: weights not on this machine")
        return 1
    model = headscan.load_model(args.model, device=args.device)
    config = headscan.SweepConfig(device=args.device, max_len=args.max_len, batch_size=args.batch_size,
                                  bootstrap=args.bootstrap, importance="ablate", values=False)
    corpus = read_corpus(source, limit=args.limit)
    started = time.perf_counter()
    run = sweep_model(model, corpus, config)
    seconds = time.perf_counter() - started
    per_head(run["importance"]).to_csv(out / "heads.csv", index=False)
    settings = settings_of(args, run, source, seconds, argv)
    settings["atp_star"] = add_atp_star(out, settings, argv, corpus=corpus, model=model)
    (out / "run.json").write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n")
    rho = write_outputs(out)
    heads = pd.read_csv(out / "heads.csv")
    ok = rho >= BAR
    print(f"{verdict(ok)} {model.name}: Spearman(atp_mean, mean_ablation) = {rho:.3f} over "
          f"{int(heads[['atp_mean', 'mean_ablation']].notna().all(axis=1).sum()) if 'atp_mean' in heads else 0} "
          f"heads (>= {BAR} expected); {seconds / 60:.1f} minutes")
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
