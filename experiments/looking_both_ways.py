"""Looking both ways: a causal model's previous-token head and an encoder's next-token head are mirror images.

Claim. A decoder has a head that puts most of its attention on the previous token; an encoder, which can see
both ways, also has one that puts most of it on the *next* token. Their offset profiles are mirror images.

Literature (labels here are 0-indexed ``L{layer}H{head}``; the paper's own label in quotes):

- GPT-2 small, L4H11: a previous-token head (Wang et al. 2022, "Interpretability in the Wild", who also
  index from 0 and call it "4.11"; with "2.2" the two previous-token heads of their IOI circuit).
- BERT-base uncased, L2H0: Clark et al. (2019)'s "head 3-1" (1-indexed), drawn in their Figure 1 as
  attending to the next token; they count five heads that put over 50% of their attention on the next token
  and four on the previous one.
- Expected: both above 0.5 (``prev_token`` for GPT-2's L4H11, ``next_token`` for BERT's L2H0).

The embedded pair (offline): smollm2's strongest previous-token head against minilm's strongest next-token
head, both expected above 0.5 (committed EWT dev sweep: smollm2 L16H0 0.784, minilm L1H8 0.657).

The check prints PASS or FAIL for each model whose weights are on this machine (gpt2 and bert-base-uncased
only when already in the Hugging Face cache; nothing is downloaded) and SKIP for the others.

    python experiments/looking_both_ways.py                # embedded pair, plus gpt2/BERT where cached
    python experiments/looking_both_ways.py --limit 400    # more sentences

Writes ``reports/experiments/looking_both_ways/``: ``heads.csv`` (each model's head, score, interval, check),
``profiles.csv`` (its offset profile), ``profiles.png`` (the mirror images) and ``README.md``.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd
from _common import EMBEDDED, corpus_name, ewt_dev, markdown_table, out_folder, verdict, weights_present

import headscan

# Literature heads: model -> (layer, head, metric, the paper's label)
LITERATURE = {
    "gpt2": (4, 11, "prev_token", 'Wang et al. 2022 "4.11"'),
    "bert-base-uncased": (2, 0, "next_token", 'Clark et al. 2019 "3-1"'),
}
THRESHOLD = 0.5


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help=f"a model to add (default: {', '.join(EMBEDDED)})")
    parser.add_argument("--no-literature", action="store_true", help="leave out gpt2 and bert-base-uncased")
    parser.add_argument("--corpus", default=None, help="default: EWT dev, else builtin")
    parser.add_argument("--limit", type=int, default=200, help="sentences (default 200)")
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None, help="default: reports/experiments/looking_both_ways")
    return parser.parse_args(argv)


def score(spec: str, corpus: str, args) -> tuple[pd.Series, pd.DataFrame]:
    """The model's head for the comparison (the literature's, or its strongest) and that head's offset profile."""
    tables = headscan.sweep(spec, corpus, limit=args.limit, max_len=args.max_len, device=args.device)
    heads, offsets = tables.heads, tables.offsets
    family = heads["family"].iloc[0]
    metric = "prev_token" if family == "causal" else "next_token"
    rows = heads[heads.metric == metric]
    if spec in LITERATURE:
        layer, head, metric, _ = LITERATURE[spec]
        rows = heads[heads.metric == metric]
        row = rows[(rows.layer == layer) & (rows["head"] == head)].iloc[0]
    else:
        row = rows.sort_values(["value", "layer", "head"], ascending=[False, True, True]).iloc[0]
    profile = offsets[(offsets.layer == row.layer) & (offsets["head"] == row["head"])][["offset", "value"]]
    return row, profile.assign(model=spec, label=row.label)


def draw(profiles: pd.DataFrame, rows: pd.DataFrame, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(profiles["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(3.2 * len(models), 2.8), sharey=True, squeeze=False)
    for ax, model in zip(axes[0], models):
        profile = profiles[profiles.model == model]
        row = rows[rows.model == model].iloc[0]
        colours = ["#c0392b" if d == (-1 if row.metric == "prev_token" else 1) else "#95a5a6" for d in profile.offset]
        ax.bar(profile.offset, profile.value, color=colours)
        ax.axvline(0, color="black", lw=0.5)
        ax.set_title(f"{model} {row.label}\n{row.metric} {row.value:.2f}", fontsize=9)
        ax.set_xlabel("offset k - q")
    axes[0][0].set_ylabel("mean attention A[q, q + offset]")
    axes[0][0].set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse(argv)
    out = out_folder("looking_both_ways", args.out)
    corpus = args.corpus or ewt_dev()
    specs = list(args.model or EMBEDDED) + ([] if args.no_literature else list(LITERATURE))
    rows, profiles = [], []
    for spec in specs:
        source = "literature" if spec in LITERATURE else "embedded" if spec in EMBEDDED else "given"
        if not weights_present(spec):
            print(f"SKIP {spec}: weights not on this machine (download once where there is a network: "
                  f"python -c \"from huggingface_hub import snapshot_download; snapshot_download('{spec}')\")")
            rows.append({"model": spec, "source": source, "check": "SKIP"})
            continue
        row, profile = score(spec, corpus, args)
        ok = row.value > THRESHOLD
        expected = LITERATURE[spec][3] if spec in LITERATURE else "strongest head of its family"
        rows.append({"model": spec, "source": source, "family": row.family, "label": row.label, "metric": row.metric,
                     "value": row.value, "ci_low": row.ci_low, "ci_high": row.ci_high, "chance": row.chance,
                     "expected": expected,
                     "check": verdict(ok)})
        profiles.append(profile)
        print(f"{verdict(ok)} {spec} {row.label} {row.metric} = {row.value:.3f} "
              f"[{row.ci_low:.3f}, {row.ci_high:.3f}], chance {row.chance:.3f} (expected > {THRESHOLD})")
    table = pd.DataFrame(rows)
    table.to_csv(out / "heads.csv", index=False)
    scored = table[table.check != "SKIP"]
    if profiles:
        profiles = pd.concat(profiles, ignore_index=True)
        profiles.to_csv(out / "profiles.csv", index=False)
        draw(profiles, scored, out / "profiles.png")
    shown = table.drop(columns=[c for c in ("source",) if c in table])
    (out / "README.md").write_text(
        "# Looking both ways\n\n"
        f"Corpus: `{corpus_name(corpus)}`, first {args.limit} segments, max_len {args.max_len}. "
        "Each causal model's previous-token head against each encoder's next-token head "
        f"(expected > {THRESHOLD}).\n\n" + markdown_table(shown) + "\n![offset profiles](profiles.png)\n")
    print(f"wrote {out}")
    return 1 if (scored.check == "FAIL").any() else 0


if __name__ == "__main__":
    sys.exit(main())
