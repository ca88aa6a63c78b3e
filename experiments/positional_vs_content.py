"""Positional or content: do a head's previous/next-token scores survive when the words stop making sense?

Claim. A positional head looks where it looks whatever the words are: its previous-token (or next-token)
score is about the same on natural sentences, on the same sentences with their words shuffled, and on random
tokens. The test is two-sided: a head whose score falls there was reading content (a word that usually sits
next to it), and a head whose score rises there was reading content too (it looks back more when the words
make no sense, so what it looks at depends on them); only a head within a factor of 1.25 either way on both
scrambled versions is called positional.

Literature (0-indexed ``L{layer}H{head}``; the paper's own label in quotes): Voita et al. (2019) call an
encoder head positional when at least 90% of its queries attend most to one fixed neighbour; Clark et al.
(2019) find BERT-base's next-token head L2H0 ("3-1") and previous-token heads in early layers; GPT-2
small's L4H11 ("4.11", Wang et al. 2022) is a previous-token head. None of them reports this shuffle test, so
the expectation is the definition's: the strongest previous-token head of each model (and the strongest
next-token head of an encoder) keeps its natural-text score within a factor of 1.25 (at least 80% of it, at
most 125%) on shuffled words and on random tokens. Committed EWT dev sweep of the embedded models: minilm L0H2 prev 0.9996, minilm L1H8 next 0.657,
smollm2 L16H0 prev 0.784.

Conditions, on the first ``--limit`` sentences of EWT dev (else builtin):

- ``natural``: the sentences as written;
- ``shuffled``: the same words in a random order (seeded), one space between them;
- ``random``: per model, as many tokens as the natural sentence has, drawn uniformly from its vocabulary
  (special tokens excluded) and decoded to text (re-tokenising decoded text gives nearly the same tokens).

The shuffled and random texts are written beside the results so the run can be repeated exactly.

    python experiments/positional_vs_content.py               # minilm and smollm2, about 3 minutes on 2 cores
    python experiments/positional_vs_content.py --model gpt2  # any model whose weights are on this machine

Writes ``reports/experiments/positional_vs_content/``: ``heads.csv`` (every head's prev/next score under
each condition, and its kind), ``scatter.png`` (natural against shuffled and random) and ``README.md``.
"""

from __future__ import annotations

import argparse
import re
import sys
import unicodedata

import numpy as np
import pandas as pd
from _common import EMBEDDED, corpus_name, ewt_dev, markdown_table, out_folder, verdict, weights_present

import headscan
from headscan.corpus import read_corpus
from headscan.scan import sweep_model

CONDITIONS = ("natural", "shuffled", "random")
KEEPS = 0.8  # a positional head keeps at least this share of its natural-text score, and at most its inverse
STRONG = 0.3  # heads scoring at least this on natural text are classified


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help=f"default: {', '.join(EMBEDDED)}")
    parser.add_argument("--corpus", default=None, help="default: EWT dev, else builtin")
    parser.add_argument("--limit", type=int, default=150, help="sentences (default 150)")
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None, help="default: reports/experiments/positional_vs_content")
    return parser.parse_args(argv)


def one_line(text: str) -> str:
    """`text` on one line of printable characters: decoded random tokens can hold newlines, NUL and other controls."""
    text = "".join(ch if unicodedata.category(ch)[0] != "C" else " " for ch in text)
    return re.sub(r"\s+", " ", text).strip()


def shuffled_texts(sentences, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    texts = []
    for sentence in sentences:
        words = list(sentence.words) or sentence.text.split()
        texts.append(" ".join(words[i] for i in rng.permutation(len(words))))
    return texts


def random_texts(model, sentences, seed: int) -> list[str]:
    """As many random tokens as each natural sentence has for `model`, decoded to one line of text."""
    tokenizer = model.tokenizer
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    vocab = np.array([i for i in range(min(model.vocab_size, len(tokenizer))) if i not in special])
    rng = np.random.default_rng(seed)
    texts = []
    for sentence in sentences:
        n = len(tokenizer(sentence.text, add_special_tokens=False)["input_ids"])
        texts.append(one_line(tokenizer.decode(rng.choice(vocab, size=max(n, 2)).tolist())) or "x")
    return texts


def scores(model, corpus_path, args) -> pd.DataFrame:
    config = headscan.SweepConfig(device=args.device, max_len=args.max_len, bootstrap=0)
    heads = sweep_model(model, read_corpus(corpus_path, limit=args.limit), config).heads
    rows = heads[heads.metric.isin(["prev_token", "next_token"])]
    return rows[["model", "family", "layer", "head", "label", "metric", "value"]]


def kind(row) -> str:
    """positional: both scrambled scores within a factor 1/KEEPS of the natural one; rises: one is above that
    (the head looks there more when the words make no sense); content: one falls below half; mixed otherwise."""
    if row.natural < STRONG:
        return ""
    low = min(row.shuffled, row.random) / row.natural
    high = max(row.shuffled, row.random) / row.natural
    if low >= KEEPS and high <= 1 / KEEPS:
        return "positional"
    if low < 0.5:
        return "content"
    return "rises" if high > 1 / KEEPS else "mixed"


def draw(table: pd.DataFrame, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(table["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(4 * len(models), 3.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = table[table.model == model]
        for metric, colour in (("prev_token", "#2471a3"), ("next_token", "#c0392b")):
            part = rows[rows.metric == metric]
            if part.empty or (part.family.iloc[0] == "causal" and metric == "next_token"):
                continue  # structurally 0 for a causal model
            ax.scatter(part.natural, part.shuffled, s=14, marker="o", color=colour, alpha=0.7,
                       label=f"{metric}: shuffled words")
            ax.scatter(part.natural, part.random, s=18, marker="x", color=colour, alpha=0.7,
                       label=f"{metric}: random tokens")
        ax.plot([0, 1], [0, 1], color="black", lw=0.6)
        ax.plot([0, 1], [0, KEEPS], color="grey", lw=0.6, ls="--")
        ax.plot([0, 1 / KEEPS], [0, 1], color="grey", lw=0.6, ls="--")  # two-sided: within 1/KEEPS above too
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="score on natural text", ylabel="score on scrambled text", title=model)
        ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse(argv)
    out = out_folder("positional_vs_content", args.out)
    source = args.corpus or ewt_dev()
    sentences = read_corpus(source, limit=args.limit).segments
    (out / "natural.txt").write_text("\n".join(one_line(s.text) for s in sentences) + "\n")
    (out / "shuffled.txt").write_text("\n".join(shuffled_texts(sentences, args.seed)) + "\n")
    parts, checks = [], []
    for spec in args.model or EMBEDDED:
        if not weights_present(spec):
            print(f"SKIP {spec}: weights not on this machine")
            continue
        model = headscan.load_model(spec, device=args.device)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", spec.rstrip("/").split("/")[-1])
        (out / f"random-{name}.txt").write_text("\n".join(random_texts(model, sentences, args.seed)) + "\n")
        files = {"natural": "natural.txt", "shuffled": "shuffled.txt", "random": f"random-{name}.txt"}
        per_condition = {condition: scores(model, out / files[condition], args) for condition in CONDITIONS}
        del model
        wide = per_condition["natural"].rename(columns={"value": "natural"})
        for condition in CONDITIONS[1:]:
            other = per_condition[condition][["layer", "head", "metric", "value"]].rename(columns={"value": condition})
            wide = wide.merge(other, on=["layer", "head", "metric"], validate="one_to_one")
        wide["model"] = spec
        wide["kind"] = [kind(row) for row in wide.itertuples()]
        parts.append(wide)
        for metric in ("prev_token", "next_token"):
            rows = wide[wide.metric == metric]
            if wide.family.iloc[0] == "causal" and metric == "next_token":
                continue
            best = rows.sort_values("natural", ascending=False).iloc[0]
            ok = kind(best) == "positional"
            checks.append({"model": spec, "metric": metric, "label": best.label, "natural": best.natural,
                           "shuffled": best.shuffled, "random": best.random, "check": verdict(ok)})
            print(f"{verdict(ok)} {spec} strongest {metric} head {best.label}: natural {best.natural:.3f}, "
                  f"shuffled {best.shuffled:.3f}, random {best.random:.3f} (within {KEEPS:.0%} to {1 / KEEPS:.0%} "
                  "expected)")
    if not parts:
        print("no model could be scored")
        return 1
    table = pd.concat(parts, ignore_index=True)
    table.to_csv(out / "heads.csv", index=False)
    draw(table, out / "scatter.png")
    checks = pd.DataFrame(checks)
    strong = table[table.kind != ""][["model", "label", "metric", "natural", "shuffled", "random", "kind"]]
    counts = strong.groupby(["model", "metric", "kind"]).size().rename("heads").reset_index()
    (out / "README.md").write_text(
        "# Positional or content\n\n"
        f"Corpus: `{corpus_name(source)}`, first {args.limit} sentences (natural, words shuffled, random tokens; seed "
        f"{args.seed}), max_len {args.max_len}. A head is *positional* when both scrambled scores lie within "
        f"{KEEPS:.0%} to {1 / KEEPS:.0%} of its natural-text score (two-sided), *rises* when one lies above "
        f"that (it looks there more when the words make no sense), *content* when one falls below half, "
        f"*mixed* otherwise; heads scoring below {STRONG} on natural text are not classified.\n\n"
        "## The strongest heads\n\n" + markdown_table(checks) +
        "\n## Every head scoring at least 0.3 on natural text\n\n" + markdown_table(strong.sort_values(
            ["model", "metric", "natural"], ascending=[True, True, False])) +
        "\n" + markdown_table(counts) + "\n![natural against scrambled](scatter.png)\n")
    print(f"wrote {out}")
    return 1 if (checks.check == "FAIL").any() else 0


if __name__ == "__main__":
    sys.exit(main())
