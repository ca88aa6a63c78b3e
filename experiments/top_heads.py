"""Print the top heads of sweep outputs as Markdown tables, with their 95% intervals, chance, and why a head
carries no claim (at chance, thin support).

    python experiments/top_heads.py reports/runs/ewt-dev reports/runs/repeat-random \
        --metric prev_token --metric next_token --metric induction --metric duplicate_token --top 3
"""

import argparse

import headscan
from headscan.analysis.ranking import top_heads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--metric", action="append", default=None)
    parser.add_argument("--top", type=int, default=3)
    args = parser.parse_args()
    for run in args.runs:
        tables = headscan.load(run)
        corpus = tables.provenance.corpus.source or run
        print(f"\n### {run} (corpus: {corpus})\n")
        print("| model | metric | rank | head | value | 95% interval | chance | no claim | queries |")
        print("|---|---|---|---|---|---|---|---|---|")
        for metric in args.metric or ["prev_token", "next_token", "induction", "duplicate_token"]:
            for model, rows in top_heads(tables.heads, metric, args.top, keep_flat=True).groupby("model", sort=False):
                for rank, row in enumerate(rows.itertuples(), start=1):
                    print(f"| {model} | {metric} | {rank} | {row.label} | {row.value:.3f} | "
                          f"[{row.ci_low:.3f}, {row.ci_high:.3f}] | {row.chance:.3f} | {row.unsupported} | "
                          f"{row.count:.0f} |")


if __name__ == "__main__":
    main()
