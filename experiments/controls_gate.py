"""The first hour's run, judged: 400 EWT dev sentences of minilm with random-init controls.

Claim. On the first 400 sentences of EWT dev, swept with ``--control random-init``, minilm's L0H2
(0-indexed) previous-token head is a finding, and the untrained controls, each tested against the others as
a held-out draw of an untrained network, make at most 5% of the trained model's findings per metric.

It sweeps minilm twice over the same sentences: with one random-init control (the flag's default, what a new
user types: the control is the null and is not itself tested, having no other control to be tested against)
and with five (``--control-seeds 5``: each control tested against the other four). It writes
``reports/experiments/controls_gate/``: ``findings.csv`` (per run, model, table and metric: rows and findings) and ``README.md`` (the check, and how many rows calibration keeps from being findings).

    python experiments/controls_gate.py            # minilm, 400 sentences (about 3 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

import headscan
from headscan.config import split_control

ROOT = Path(__file__).resolve().parents[1]
EWT_DEV = ROOT.parent / "shared" / "data" / "ud-english-ewt" / "en_ewt-ud-dev.conllu"
OUT = ROOT / "reports" / "experiments" / "controls_gate"
TABLES = ("heads", "value", "syntax")


def finding_counts(frames: dict[str, pd.DataFrame], run: str) -> pd.DataFrame:
    """``run, model, trained, table, metric, rows, findings``: per model and metric."""
    out = []
    for table in TABLES:
        frame = frames.get(table)
        if frame is None or frame.empty:
            continue
        metric = frame["metric"] if "metric" in frame else frame["relation"].map(lambda _: "syntax")
        found = frame["finding"].fillna(False).astype(bool)
        part = pd.DataFrame({"model": frame["model"], "metric": metric, "found": found})
        grouped = part.groupby(["model", "metric"], sort=False).agg(
            rows=("found", "size"), findings=("found", "sum")).reset_index()
        out.append(grouped.assign(table=table))
    table = pd.concat(out, ignore_index=True)
    table["trained"] = table["model"].map(lambda m: split_control(str(m))[1] is None)
    return table.assign(run=run)[["run", "model", "trained", "table", "metric", "rows", "findings"]]


def check(counts: pd.DataFrame) -> pd.DataFrame:
    """Per run, table and metric: the trained model's findings and the most any one control makes, and whether
    that is at most 5% of the trained model's."""
    trained = counts[counts["trained"]].set_index(["run", "table", "metric"])["findings"]
    controls = counts[~counts["trained"]].groupby(["run", "table", "metric"])["findings"].max()
    both = pd.DataFrame({"trained": trained, "most_by_a_control": controls}).fillna(0).astype(int).reset_index()
    both["ok"] = both["most_by_a_control"] <= 0.05 * both["trained"]
    return both


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=EWT_DEV)
    parser.add_argument("--limit", type=int, default=400)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    counts, l0h2, seconds, kept = [], {}, {}, {}
    for run, seeds in (("one control", 1), ("five controls", 5)):
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as folder:
            tables = headscan.sweep(args.model, str(args.corpus), Path(folder) / "run", limit=args.limit,
                                    control=("random-init",), control_seeds=seeds)
            summary = json.loads((Path(folder) / "run" / "run.json").read_text())["findings"]["by_table"]
        seconds[run] = time.perf_counter() - start
        # rows with q <= 0.05 on the bootstrap's own interval that the calibrated one keeps from being findings
        kept[run] = sum(t["kept_by_calibration"] for t in summary[args.model].values())
        counts.append(finding_counts(tables.frames, run))
        heads = tables.heads
        row = heads[(heads["model"] == args.model) & (heads["label"] == "L0H2") & (heads["metric"] == "prev_token")]
        l0h2[run] = row.iloc[0]
    counts = pd.concat(counts, ignore_index=True)
    verdicts = check(counts)
    args.out.mkdir(parents=True, exist_ok=True)
    counts.to_csv(args.out / "findings.csv", index=False)
    lines = ["# The first hour's run, judged: controls make no trained model's findings", "",
             f"`{' '.join(['python experiments/controls_gate.py', *sys.argv[1:]])}`: {args.model} over the first "
             f"{args.limit} sentences of `{args.corpus.name}`, swept with one random-init control (the flag's "
             "default) and with five (`--control-seeds 5`). Heads are 0-indexed (L0H2 is layer 0, head 2).", "",
             "## L0H2 prev_token", "", "| run | value | 95% interval | calibrated | null | q | verdict |",
             "|---|---|---|---|---|---|---|"]
    for run, r in l0h2.items():
        lines.append(f"| {run} | {r.value:.4f} | [{r.ci_low:.4f}, {r.ci_high:.4f}] | [{r.cal_low:.4f}, "
                     f"{r.cal_high:.4f}] | {r.null_kind} [{r.null_low:.4f}, {r.null_high:.4f}] | {r.q_value:.2g} | "
                     f"{r.verdict} |")
    lines += ["", "## Findings per metric: the trained model and the most any one control makes", "",
              "With one control the control is the null and is not tested itself (no other control to test it "
              "against), so its count is 0 by construction; with five, each control is tested against the other "
              "four, a held-out draw of an untrained network. Check: at most 5% of the trained model's findings.",
              "", "| run | table | metric | trained | most by a control | ok |", "|---|---|---|---|---|---|"]
    lines += [f"| {r.run} | {r.table} | {r.metric} | {r.trained} | {r.most_by_a_control} | {'yes' if r.ok else 'NO'} |"
              for r in verdicts.itertuples() if r.trained or r.most_by_a_control]
    lines += ["", "Rows of the trained model with q <= 0.05 on the bootstrap's own interval that calibration keeps "
              "from being findings: " + "; ".join(f"{run} {n}" for run, n in kept.items()) + ".", "",
              "Seconds (this machine, CPU): " + "; ".join(f"{run} {s:.0f}" for run, s in seconds.items()) + ".",
              "", f"Check: L0H2 prev_token a finding in both runs: "
              f"**{'PASS' if all(bool(r.finding) for r in l0h2.values()) else 'FAIL'}**; controls at most 5% per "
              f"metric: **{'PASS' if verdicts['ok'].all() else 'FAIL'}**."]
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
