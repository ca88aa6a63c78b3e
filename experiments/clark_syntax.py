"""Syntactic heads (Clark et al. 2019): some heads find a word's syntactic head far above a fixed-offset baseline.

Claim. For several dependency relations a single attention head's most-attended word is the gold syntactic
head (or, transposed, the head word attends most to its dependent) much more often than the best fixed
offset: BERT-base's "8-10" finds the verb of a direct object, "8-11" the noun of a determiner.

Literature: Clark et al. (2019), "What Does BERT Look At?", Table 1 / Figure 5, BERT-base (uncased) on the
Penn Treebank WSJ dev set with Stanford dependencies; the numbers below are the best head per relation as
their notebook ``Syntax_Analysis.ipynb`` prints it. The notebook labels heads ``layer-head`` from 0 (its
``7-9`` is ``L7H9`` here), the paper's figures from 1 (``8-10``). Relations are mapped to UD where they
correspond (dobj -> obj, nn -> compound, num -> nummod, auxpass -> aux, nsubjpass -> nsubj, since UD
subtypes are folded into their base); Stanford's prep/pobj (the preposition heads the phrase) and poss have
no UD counterpart with the same attachment (UD's case attaches the preposition to the noun, and nmod:poss is
folded into nmod), and Stanford's cc attaches to the first conjunct, UD's to the following one: those rows
are shown unmapped. EWT is web text and UD is not Stanford dependencies, so the comparison is of the pattern
(a head far above the baseline for det, obj, nsubj ...), not of the decimals.

It reads the ``syntax`` table that every sweep of a CoNLL-U corpus writes, and uses only ``headscan.sweep``.

Checks (PASS/FAIL where the weights are present): for det, obj and nsubj the best head's accuracy exceeds the
relation's best offset baseline beyond its 95% interval (its lower end is above the baseline).

    python experiments/clark_syntax.py                          # minilm (+ bert-base-uncased where cached)
    python experiments/clark_syntax.py --model smollm2 --limit 400

Writes ``reports/experiments/clark_syntax/``: ``best_heads.csv`` (per model and relation: the best head, its
direction, accuracy, interval, count, baseline and offset, Clark's numbers beside), ``best_heads.png`` and
``README.md``.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd
from _common import corpus_name, ewt_dev, markdown_table, out_folder, verdict, weights_present

import headscan

# Clark et al.'s best heads (notebook output): Stanford relation -> (UD relation or None, accuracy %, layer,
# head (0-indexed), direction, baseline %, baseline offset)
CLARK = {
    "all": ("all", 34.7, 6, 5, "dependent_to_head", 26.7, 1),
    "prep": (None, 66.7, 6, 3, "dependent_to_head", 61.8, -1),
    "pobj": (None, 76.3, 8, 5, "head_to_dependent", 34.6, -2),
    "det": ("det", 94.3, 7, 10, "dependent_to_head", 51.7, 1),
    "nn": ("compound", 70.4, 3, 9, "dependent_to_head", 70.2, 1),
    "nsubj": ("nsubj", 58.5, 7, 1, "dependent_to_head", 45.5, 1),
    "amod": ("amod", 75.6, 3, 9, "dependent_to_head", 68.3, 1),
    "dobj": ("obj", 86.8, 7, 9, "dependent_to_head", 40.0, -2),
    "advmod": ("advmod", 48.8, 6, 5, "dependent_to_head", 40.2, 1),
    "aux": ("aux", 81.1, 3, 9, "dependent_to_head", 71.5, 1),
    "num": ("nummod", 67.4, 7, 10, "dependent_to_head", 56.4, 1),
    "cc": (None, 47.8, 6, 4, "dependent_to_head", 41.2, -1),
    "conj": ("conj", 53.3, 6, 0, "dependent_to_head", 26.8, -2),
    "poss": (None, 80.5, 6, 5, "dependent_to_head", 47.7, 1),
    "ccomp": ("ccomp", 48.8, 7, 0, "dependent_to_head", 12.4, -2),
    "xcomp": ("xcomp", 57.3, 4, 6, "dependent_to_head", 47.1, -2),
    "mark": ("mark", 50.7, 7, 1, "dependent_to_head", 14.5, 2),
    "cop": ("cop", 72.2, 6, 5, "dependent_to_head", 40.5, 1),
    "advcl": ("advcl", 29.5, 4, 3, "dependent_to_head", 4.6, -3),
    "appos": ("appos", 30.5, 6, 0, "dependent_to_head", 28.3, -3),
}
# Relations of the report's syntactic section, in this order; the ones Clark has no row for follow his.
RELATIONS = ["all", "nsubj", "obj", "det", "amod", "advmod", "case", "nmod", "aux", "mark", "compound", "conj",
             "punct", "cc", "nummod", "ccomp", "xcomp", "cop", "advcl", "appos", "obl", "acl"]
CHECKED = ("det", "obj", "nsubj")


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="default: minilm, and bert-base-uncased where cached")
    parser.add_argument("--corpus", default=None, help="a CoNLL-U file (default: EWT dev)")
    parser.add_argument("--limit", type=int, default=500, help="sentences (default 500)")
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None, help="default: reports/experiments/clark_syntax")
    return parser.parse_args(argv)


def clark_rows() -> pd.DataFrame:
    rows = []
    for stanford, (ud, accuracy, layer, head, direction, baseline, offset) in CLARK.items():
        rows.append({"relation": ud or f"({stanford})", "clark_relation": stanford, "clark_head": f"L{layer}H{head}",
                     "clark_paper_label": f"{layer + 1}-{head + 1}", "clark_direction": direction,
                     "clark_accuracy": accuracy / 100, "clark_baseline": baseline / 100, "clark_offset": offset})
    return pd.DataFrame(rows)


def best_heads(syntax: pd.DataFrame) -> pd.DataFrame:
    """Per model and relation, the head and direction with the highest accuracy (ties: earlier layer, head)."""
    rows = syntax[syntax["relation"].isin(RELATIONS) & syntax["value"].notna()]
    rows = rows.sort_values(["model", "relation", "value", "layer", "head"], ascending=[True, True, False, True, True])
    best = rows.groupby(["model", "relation"], sort=False).head(1)
    best = best.assign(beats_baseline=best["ci_low"] > best["baseline"], count=best["count"].astype(int))
    order = {r: i for i, r in enumerate(RELATIONS)}
    best = best.sort_values(["model", "relation"], key=lambda c: c.map(order) if c.name == "relation" else c)
    return best[["model", "relation", "label", "direction", "value", "ci_low", "ci_high", "count", "baseline",
                 "baseline_offset", "beats_baseline"]].reset_index(drop=True)


def draw(best: pd.DataFrame, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(best["model"]))
    fig, axes = plt.subplots(len(models), 1, figsize=(10, 3.2 * len(models)), squeeze=False)
    for ax, model in zip(axes[:, 0], models):
        rows = best[best.model == model].reset_index(drop=True)
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], rows.value, width=0.4, color="#2471a3", label="best head",
               yerr=[rows.value - rows.ci_low, rows.ci_high - rows.value], capsize=2)
        ax.bar([i + 0.2 for i in x], rows.baseline, width=0.4, color="#bdc3c7", label="best fixed offset")
        for i, row in rows.iterrows():
            ax.text(i - 0.2, 0.02, row.label, rotation=90, fontsize=6, color="white", va="bottom", ha="center")
        ax.set_xticks(list(x), rows.relation, rotation=45, fontsize=8)
        ax.set(ylim=(0, 1), ylabel="accuracy", title=model)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse(argv)
    out = out_folder("clark_syntax", args.out)
    corpus = args.corpus or ewt_dev()
    if not str(corpus).endswith(".conllu"):
        print(f"clark_syntax needs a CoNLL-U treebank (gold heads); got {corpus}. Pass --corpus path/to/file.conllu")
        return 2
    specs = args.model or ["minilm", "bert-base-uncased"]
    parts, checks = [], []
    for spec in specs:
        if not weights_present(spec):
            print(f"SKIP {spec}: weights not on this machine")
            continue
        tables = headscan.sweep(spec, corpus, limit=args.limit, max_len=args.max_len, device=args.device)
        best = best_heads(tables["syntax"])
        parts.append(best)
        for relation in CHECKED:
            row = best[best.relation == relation].iloc[0]
            ok = bool(row.beats_baseline)
            checks.append({"model": spec, "relation": relation, "head": row.label, "direction": row.direction,
                           "accuracy": row.value, "ci_low": row.ci_low, "baseline": row.baseline,
                           "offset": row.baseline_offset, "check": verdict(ok)})
            print(f"{verdict(ok)} {spec} {relation}: {row.label} {row.direction} {row.value:.3f} "
                  f"[{row.ci_low:.3f}, {row.ci_high:.3f}] vs offset {row.baseline_offset:+d} baseline {row.baseline:.3f}")
    if not parts:
        print("no model could be scored")
        return 1
    best = pd.concat(parts, ignore_index=True)
    table = best.merge(clark_rows(), on="relation", how="left")
    table.to_csv(out / "best_heads.csv", index=False)
    draw(best, out / "best_heads.png")
    checks = pd.DataFrame(checks)
    shown = table[["model", "relation", "label", "direction", "value", "ci_low", "ci_high", "count", "baseline",
                   "baseline_offset", "clark_relation", "clark_head", "clark_paper_label", "clark_accuracy",
                   "clark_baseline"]]
    unmapped = clark_rows()[clark_rows().relation.str.startswith("(")]
    (out / "README.md").write_text(
        "# Syntactic heads (Clark et al. 2019)\n\n"
        f"Corpus: `{corpus_name(corpus)}`, first {args.limit} sentences, max_len {args.max_len}. Accuracy: the share of "
        "dependents whose gold head the head picks (best direction); baseline: the best fixed offset in -3..2 "
        "on the same words. Clark's numbers are BERT-base on PTB WSJ with Stanford dependencies.\n\n"
        "## Checks\n\n" + markdown_table(checks) + "\n## Best head per relation\n\n" + markdown_table(shown) +
        "\nClark's relations with no UD counterpart of the same attachment, not compared:\n\n" +
        markdown_table(unmapped.drop(columns=["relation"])) + "\n![best heads against the baseline](best_heads.png)\n")
    print(f"wrote {out}")
    return 1 if (checks.check == "FAIL").any() else 0


if __name__ == "__main__":
    sys.exit(main())
