"""How often heads that learned nothing lie beyond uniform attention: why a run without controls makes no finding.

    python experiments/untrained_vs_uniform.py reports/runs/ewt-dev --package

Reads a sweep with random-init controls (``--control random-init --control-seeds 5``) and counts, per model and
metric, the controls' heads whose 95% interval lies beyond uniform attention on the metric's striking side
(``ci_low > chance`` where high is striking, ``ci_high < chance`` where low is): what "beyond chance" would call a
head of an untrained network. Writes ``untrained.csv`` and ``untrained.md`` into ``--out``
(``reports/experiments/untrained_vs_uniform``) and, with ``--package``, ``headscan/data/untrained_vs_uniform.csv``,
which a report of a run without controls cites.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

import headscan
from headscan.config import split_control
from headscan.metrics import describe

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "experiments" / "untrained_vs_uniform"
PACKAGED = ROOT / "headscan" / "data" / "untrained_vs_uniform.csv"


def untrained_beyond_uniform(heads: pd.DataFrame, run: str) -> pd.DataFrame:
    """``model, metric, heads, beyond, share, run``: per trained model and metric, its random-init controls' rows
    beyond uniform attention on the striking side, out of all of their rows with a value and a chance."""
    rows = heads[heads["model"].map(lambda m: split_control(str(m))[1] == "random-init")]
    rows = rows[rows["chance"].notna() & rows["value"].notna() & rows["ci_low"].notna()]
    high = rows["metric"].map(lambda m: describe(m).striking == "high").astype(bool)
    beyond = (high & (rows["ci_low"] > rows["chance"])) | (~high & (rows["ci_high"] < rows["chance"]))
    frame = rows.assign(beyond=beyond, model=rows["model"].map(lambda m: split_control(str(m))[0]))
    out = frame.groupby(["model", "metric"], sort=False).agg(heads=("beyond", "size"), beyond=("beyond", "sum"))
    out = out.reset_index().assign(share=lambda t: (t["beyond"] / t["heads"]).round(4), run=run)
    return out.astype({"heads": int, "beyond": int})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a sweep with --control random-init")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--package", action="store_true", help=f"also write {PACKAGED}")
    args = parser.parse_args(argv)
    table = untrained_beyond_uniform(headscan.load(args.run).heads, Path(args.run).name)
    if table.empty:
        sys.exit(f"{args.run} has no random-init controls: sweep it with --control random-init")
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "untrained.csv", index=False)
    lines = ["# Untrained heads beyond uniform attention", "",
             f"Made by `python experiments/untrained_vs_uniform.py {' '.join(sys.argv[1:])}`: the random-init controls' "
             "heads whose 95% interval lies beyond uniform attention on the metric's striking side, per model and "
             "metric (metrics where none does are left out).", "", "| model | metric | beyond uniform | of heads |",
             "|---|---|---|---|"]
    lines += [f"| {r.model} | {r.metric} | {r.beyond} | {r.heads} |" for r in table[table["beyond"] > 0].itertuples()]
    (args.out / "untrained.md").write_text("\n".join(lines) + "\n")
    if args.package:
        table.to_csv(PACKAGED, index=False)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
