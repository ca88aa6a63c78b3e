"""Chance levels: what uniform attention scores, counted by hand from the tokens, against the sweep's column.

Claim. A head that spreads its attention evenly over the keys each query can see scores well above 0 on some
metrics: on natural text, `induction` and `duplicate_token` reward any attention on the few keys that repeat
the query's token, and uniform attention puts 1/n on each. So a head is an induction head only where its
interval lies above that level. The sweep's ``chance`` column gives it for every row; this script counts it
again from the very token ids the sweep read, with plain Python loops over queries and keys, independent of
headscan's closed forms, and checks that both agree and count the same queries.

Expectation (with minilm's tokenizer and headscan's target rule): on EWT dev, minilm's uniform attention
scores about 0.137 on `induction` and 0.142 on
`duplicate_token`; every "top induction head" of minilm there (0.112-0.140) is at or below it. On
repeat-random, where the second copy's queries see up to 100 keys and one target, chance is about 0.013, and
smollm2's induction heads lie far above it.

    python experiments/chance_levels.py reports/runs/ewt-dev reports/runs/repeat-random

Reads each run's tables and corpus (the corpus path recorded in run.json, or ``--corpus``), tokenises it for
each model as the sweep did, and writes ``reports/experiments/chance_levels/README.md``.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd
from _common import ewt_dev, markdown_table, out_folder, verdict

import headscan
from headscan.corpus import encode, read_corpus

METRICS = ("induction", "duplicate_token", "prev_token", "first_token")


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="sweep output folders")
    parser.add_argument("--corpus", default=None, help="default: the corpus each run recorded (EWT dev for a .conllu)")
    parser.add_argument("--out", default=None, help="default: reports/experiments/chance_levels")
    return parser.parse_args(argv)


def by_hand(ids: list[int], causal: bool) -> dict[str, tuple[float, int]]:
    """One segment's uniform-attention sums and query counts per metric, by loops over queries and keys.

    Every token counts (specials kept, the default); a query sees the keys at or before it (causal) or all of
    them. Targets as the metrics define them: other occurrences of the query's token (earlier ones only when
    causal); the key after such an occurrence, neither q-1 nor q, for induction.
    """
    n = len(ids)
    out = {metric: [0.0, 0] for metric in METRICS}
    for q in range(n):
        seen = list(range(q + 1)) if causal else list(range(n))
        others = [j for j in seen if j != q and ids[j] == ids[q]]
        if others:
            out["duplicate_token"][0] += len(others) / len(seen)
            out["duplicate_token"][1] += 1
        targets = {j + 1 for j in others if j + 1 < n and j + 1 in seen and j + 1 not in (q - 1, q)}
        if causal:
            targets = {k for k in targets if k <= q}
        if targets:
            out["induction"][0] += len(targets) / len(seen)
            out["induction"][1] += 1
        if q >= 1:
            out["prev_token"][0] += 1 / len(seen)
            out["prev_token"][1] += 1
            out["first_token"][0] += 1 / len(seen)
            out["first_token"][1] += 1
    return {metric: (total, count) for metric, (total, count) in out.items()}


def check(run_path: str, corpus_arg: str | None) -> list[dict]:
    run = headscan.load(run_path)
    config = run.provenance.config
    source = corpus_arg or run.provenance.corpus.source
    if str(source).endswith(".conllu") and not corpus_arg:
        source = ewt_dev()
    corpus = read_corpus(source, limit=config.get("limit"))
    rows = []
    for name in run.models:
        model = headscan.load_model(name, device="cpu")
        encoded = encode(corpus, model, config.get("max_len", 128), long=config.get("long", "truncate"))
        totals = {metric: [0.0, 0] for metric in METRICS}
        for ids in encoded.token_ids:
            for metric, (total, count) in by_hand(list(ids), model.causal).items():
                totals[metric][0] += total
                totals[metric][1] += count
        heads = run.heads[run.heads["model"] == name]
        for metric in METRICS:
            part = heads[heads["metric"] == metric]
            table_chance, table_count = float(part["chance"].iloc[0]), float(part["count"].iloc[0])
            hand_chance = totals[metric][0] / totals[metric][1] if totals[metric][1] else float("nan")
            strongest = part.sort_values("value", ascending=False).iloc[0]
            above = int((part["ci_low"] > part["chance"]).sum())
            rows.append({"run": run_path.rstrip("/").split("/")[-1], "model": name, "metric": metric,
                         "chance (table)": table_chance, "chance (by hand)": hand_chance,
                         "queries (table)": int(table_count), "queries (by hand)": totals[metric][1],
                         "strongest head": f"{strongest['label']} {strongest['value']:.3f} "
                                           f"[{strongest['ci_low']:.3f}, {strongest['ci_high']:.3f}]",
                         "heads above chance": f"{above} of {len(part)}",
                         "check": verdict(abs(table_chance - hand_chance) < 1e-9
                                          and int(table_count) == totals[metric][1])})
        del model
    return rows


def main(argv=None) -> int:
    args = parse(argv)
    out = out_folder("chance_levels", args.out)
    rows = [row for run in args.runs for row in check(run, args.corpus)]
    table = pd.DataFrame(rows)
    for row in rows:
        print(f"{row['check']} {row['run']} {row['model']} {row['metric']}: chance {row['chance (table)']:.4f} "
              f"(by hand {row['chance (by hand)']:.4f}), {row['queries (table)']} queries "
              f"({row['queries (by hand)']} by hand); strongest {row['strongest head']}; "
              f"{row['heads above chance']} heads' intervals above chance")
    (out / "README.md").write_text(
        "# Chance levels\n\nUniform attention over the keys each query sees, on the queries each metric counts: "
        "the sweep's `chance` column against plain loops over the same token ids (specials kept). A head's "
        "interval must lie above it for the head to be claimed.\n\n" + markdown_table(table, floats="{:.4f}"))
    print(f"wrote {out}")
    return 1 if (table["check"] == "FAIL").any() else 0


if __name__ == "__main__":
    sys.exit(main())
