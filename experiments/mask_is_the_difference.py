"""What the mask does: an encoder looks ahead, a decoder structurally cannot.

Claim. The causal mask makes one difference between the two families by construction: an encoder's heads put
a real share of their attention on later positions in every layer, a decoder's put exactly 0 there (a
structural zero, not a measured one). Split by where each head looks most, an encoder has heads that look
ahead; a decoder's heads look back, at themselves, or at a sink. The models differ in much else too (how
many heads sit on a sink, say); with one model of each family, trained on other data and of other sizes,
nothing here says which of those differences the mask causes.

Literature (0-indexed layers; the paper's own 1-indexed labels in quotes): Clark et al. (2019, Section 3 and
Figure 2) find that much of BERT-base's attention goes to [CLS] and [SEP], over half of it to [SEP] in
layers "6-10" (L5-L9 here), and that its early layers hold previous- and next-token heads; Xiao et al.
(2023, "attention sinks") find decoders' attention piling up on the first token. A decoder's share on later
positions is 0 by construction of the mask.

How, from the public API only: a sweep with ``max_offset = max_len - 1`` has the whole offset profile, and
since every real query has a real key at offset 0, a head's share on later positions is exactly
``sum over d > 0 of sum_d / count_0`` (likewise for earlier positions and itself). A head's *sink* share is its
``first_token`` plus ``sep`` score. Each head is then put in one class: ``sink`` when the sink share is at
least 0.5, else the largest of ``back`` (earlier positions less the first-token share), ``self`` and
``ahead`` (later positions less the [SEP] share). The first-token score averages over queries after the
first and the shares over all queries, so the split is approximate near the boundaries.

Checks (PASS/FAIL where the weights are present): every decoder head's share ahead is at most 1e-6; every
encoder layer's mean share ahead is above 0.1; for bert-base-uncased, when cached, the mean [SEP] share
exceeds 0.5 in at least one of L5-L9.

    python experiments/mask_is_the_difference.py          # minilm and smollm2 (+ gpt2, BERT where cached)

Writes ``reports/experiments/mask_is_the_difference/``: ``layers.csv`` (per model and layer: shares back,
self, ahead, sink), ``heads.csv`` (per head, with its class), ``layers.png`` and ``README.md``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd
from _common import EMBEDDED, corpus_name, ewt_dev, markdown_table, out_folder, verdict, weights_present

import headscan

LITERATURE = ("gpt2", "bert-base-uncased")
CLASSES = ("back", "self", "ahead", "sink")


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help=f"default: {', '.join(EMBEDDED)}")
    parser.add_argument("--no-literature", action="store_true", help="leave out gpt2 and bert-base-uncased")
    parser.add_argument("--corpus", default=None, help="default: EWT dev, else builtin")
    parser.add_argument("--limit", type=int, default=150, help="sentences (default 150)")
    parser.add_argument("--max-len", type=int, default=64, help="tokens a segment (default 64; offsets reach it)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None, help="default: reports/experiments/mask_is_the_difference")
    return parser.parse_args(argv)


def shares(tables) -> pd.DataFrame:
    """Per head: the shares of attention on earlier positions, itself, later positions and sinks, and its class."""
    offsets, heads = tables.offsets, tables.heads
    keys = ["model", "family", "layer", "head", "label"]
    total = offsets[offsets.offset == 0].set_index(keys)["count"]  # every real query
    side = np.sign(offsets["offset"]).map({-1: "back", 0: "self", 1: "ahead"})
    frame = (offsets.assign(side=side).groupby(keys + ["side"])["sum"].sum().unstack("side")
             .div(total, axis=0).reset_index())
    wide = heads[heads.metric.isin(["first_token", "sep"])].pivot_table(index=keys, columns="metric", values="value")
    wide = wide.reindex(columns=["first_token", "sep"]).fillna(0.0).reset_index()
    frame = frame.merge(wide, on=keys)
    frame["sink"] = frame.first_token + frame.sep
    lean = pd.DataFrame({"back": frame.back - frame.first_token, "self": frame["self"], "ahead": frame.ahead - frame.sep})
    frame["class"] = np.where(frame.sink >= 0.5, "sink", lean.idxmax(axis=1))
    return frame


def draw(layers: pd.DataFrame, heads: pd.DataFrame, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for model, rows in layers.groupby("model", sort=False):
        depth = rows.layer / max(rows.layer.max(), 1)
        left.plot(depth, rows.ahead, marker="o", ms=3, label=f"{model} ({rows.family.iloc[0]})")
    left.set(xlabel="layer (0 = first, 1 = last)", ylabel="mean share of attention on later positions", ylim=(0, 1))
    left.legend(fontsize=7)
    split = heads.groupby(["model", "class"]).size().unstack("class").reindex(columns=CLASSES).fillna(0)
    split = split.div(split.sum(axis=1), axis=0)
    split.plot.barh(stacked=True, ax=right, color=["#2471a3", "#7f8c8d", "#c0392b", "#f39c12"])
    right.set(xlabel="share of heads", ylabel="")
    right.legend(fontsize=7, ncols=4, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse(argv)
    out = out_folder("mask_is_the_difference", args.out)
    corpus = args.corpus or ewt_dev()
    specs = list(args.model or EMBEDDED) + ([] if args.no_literature else list(LITERATURE))
    parts, checks = [], []
    for spec in specs:
        if not weights_present(spec):
            print(f"SKIP {spec}: weights not on this machine")
            continue
        tables = headscan.sweep(spec, corpus, limit=args.limit, max_len=args.max_len, max_offset=args.max_len - 1,
                                bootstrap=0, device=args.device)
        frame = shares(tables).assign(model=spec)
        parts.append(frame)
        if frame.family.iloc[0] == "causal":
            worst = frame.ahead.max()
            checks.append({"model": spec, "check": "largest share ahead of any head <= 1e-6", "value": worst,
                           "result": verdict(worst <= 1e-6)})
        else:
            lowest = frame.groupby("layer").ahead.mean().min()
            checks.append({"model": spec, "check": "every layer's mean share ahead > 0.1", "value": lowest,
                           "result": verdict(lowest > 0.1)})
            if spec == "bert-base-uncased":
                sep = frame[frame.layer.between(5, 9)].groupby("layer").sep.mean().max()
                checks.append({"model": spec, "check": "[SEP] share > 0.5 in one of L5-L9 (Clark's 6-10)",
                               "value": sep, "result": verdict(sep > 0.5)})
    if not parts:
        print("no model could be scored")
        return 1
    for check in checks:
        print(f"{check['result']} {check['model']}: {check['check']} ({check['value']:.3g})")
    heads = pd.concat(parts, ignore_index=True)
    layers = heads.groupby(["model", "family", "layer"], sort=False)[["back", "self", "ahead", "first_token", "sep", "sink"]]
    layers = layers.mean().reset_index()
    heads.to_csv(out / "heads.csv", index=False)
    layers.to_csv(out / "layers.csv", index=False)
    draw(layers, heads, out / "layers.png")
    split = heads.groupby(["model", "class"]).size().unstack("class").reindex(columns=CLASSES).fillna(0).astype(int)
    checks = pd.DataFrame(checks)
    (out / "README.md").write_text(
        "# The mask is the difference\n\n"
        f"Corpus: `{corpus_name(corpus)}`, first {args.limit} segments, max_len {args.max_len} (offsets up to {args.max_len - 1}, "
        "so the shares are exact). Shares are means over real queries, special tokens kept.\n\n"
        "## Checks\n\n" + markdown_table(checks, "{:.4g}") +
        "\n## Mean share per layer\n\n" + markdown_table(layers) +
        "\n## Heads by where they look most\n\n" + markdown_table(split.reset_index()) +
        "\n![share ahead per layer, and the split of heads](layers.png)\n")
    print(f"wrote {out}")
    return 1 if (checks.result == "FAIL").any() else 0


if __name__ == "__main__":
    sys.exit(main())
