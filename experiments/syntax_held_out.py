"""Syntactic heads held out: minilm's EWT-dev syntax findings, cross-fitted, re-estimated on EWT test.

Claim. A syntax finding of the report (a relation and direction whose best head beats the best fixed offset
beyond its paired 95% interval, with an interval above chance, support that is not thin and the row's own
verdict, `headscan.analysis.syntax.best_heads`) rests on the cross-fitted comparison: the head and the offset
are chosen on one half of the documents and scored on the other (`headscan.scan.passes.baseline.cross_fit`).
Chosen and scored on the same documents (in sample) the best of 72 heads against the best of six offsets is
optimistic, the winner's curse. So the findings of EWT dev should keep their paired interval above 0 on EWT test
for at least 90% of them: the same head against the same offset (both named on the whole of dev), its paired
difference on the same test dependents, the delta-method interval over test documents.

It sweeps minilm over EWT dev and EWT test (its first 320 sentences, 26 documents, and the whole of it), takes
the dev findings held out and, for comparison, in sample (the verdicts made again from the in-sample columns, as
headscan made them before it cross-fitted), and re-estimates each on test. Power and curse apart: a held-out dev
estimate free of the curse should be about as large as the test one on average; an in-sample one larger.

    python experiments/syntax_held_out.py                   # minilm (5 controls): EWT dev -> test (320, all)
    python experiments/syntax_held_out.py --test-limit 320  # only the 320 sentences

Writes ``reports/experiments/syntax_held_out/``: ``findings.csv`` (per relation and direction that is a dev
finding held out or in sample: the head and offset named on dev, its dev differences held out and in sample, and
on each test sample its paired difference and interval) and ``README.md`` (the shares kept, the check).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from _common import corpus_name, ewt_dev, markdown_table, out_folder, verdict

import headscan
from headscan.analysis.syntax import VISIBLE, best_heads, offset_text
from headscan.corpus import read_corpus
from headscan.metrics.nulls import add_findings
from headscan.models import load_model
from headscan.scan import accumulate, plan_sweep, publish
from headscan.scan.finish import run_provenance
from headscan.scan.passes.baseline import paired_difference

TARGET = 0.9  # the share of dev findings whose interval stays above 0 on test
IN_SAMPLE = {"baseline": "baseline_in_sample", "vs_baseline": "vs_baseline_in_sample",
             "vs_baseline_low": "vs_baseline_in_sample_low", "vs_baseline_high": "vs_baseline_in_sample_high"}


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--dev", default=None, help="the CoNLL-U file the findings are made on (default: EWT dev)")
    parser.add_argument("--dev-limit", type=int, default=None, help="sentences of dev (default: all)")
    parser.add_argument("--test", default=None, help="the CoNLL-U file they are re-estimated on (default: EWT test)")
    parser.add_argument("--test-limit", type=int, action="append",
                        help="sentences of test (repeatable; default: 320 and the whole file)")
    parser.add_argument("--control-seeds", type=int, default=5,
                        help="random-init controls of the dev sweep, the findings' null (default 5, as the committed "
                             "ewt-dev run; 0: none)")
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None, help="default: reports/experiments/syntax_held_out")
    return parser.parse_args(argv)


def swept(spec: str, path: str, config: headscan.SweepConfig):
    """The tables of `spec` over `path` and the baseline pass's state (what a re-estimate with fixed choices
    needs): `headscan.scan.sweep_model`, keeping the state."""
    model, corpus = load_model(spec, device=config.device), read_corpus(path, limit=config.limit)
    plan = plan_sweep(model, corpus, config)
    state = accumulate(model, corpus, plan)
    tables = publish([state], plan.config, run_provenance(corpus, plan.config, unit_why=plan.unit_why))
    return tables, state.passes["baseline"], corpus


def findings(best: pd.DataFrame) -> pd.Series:
    """The rows of `best_heads` the report states as findings."""
    return best["beats"] & (best["unsupported"].fillna("") == "")


def in_sample_best(tables) -> pd.DataFrame:
    """`best_heads` as headscan made it before it cross-fitted: every verdict from the in-sample comparison."""
    syntax = tables["syntax"]
    old = syntax.assign(**{c: syntax[i] for c, i in IN_SAMPLE.items()}).drop(
        columns=[c for c in syntax.columns if c.startswith("best_") or c in IN_SAMPLE.values()])
    frames = {name: tables[name] for name in ("heads", "value") if name in tables.frames} | {"syntax": old}
    return best_heads(add_findings(frames, q=tables.provenance.config["fdr"])[0]["syntax"])


def reestimate(chosen: pd.DataFrame, syntax: pd.DataFrame, state) -> pd.DataFrame:
    """Each chosen (head, relation, direction, offset) on another corpus: the head's accuracy and its paired
    difference from that same offset on the same dependents, with the delta-method interval over its units."""
    direction = [VISIBLE[d] if seen else d for d, seen in zip(chosen["direction"], chosen["visible"])]
    keys = chosen[["layer", "head", "relation"]].assign(direction=direction)
    rows = keys.merge(syntax, on=["layer", "head", "relation", "direction"], how="left", validate="one_to_one")
    rows = rows.assign(baseline_offset=chosen["baseline_offset"].to_numpy())
    value, low, high = paired_difference(rows, state)
    return pd.DataFrame({"accuracy": rows["value"].to_numpy(float), "count": rows["count"].to_numpy(float),
                         "vs": value, "low": low, "high": high, "units": rows["units"].to_numpy(float)})


def main(argv=None) -> int:
    args = parse(argv)
    out = out_folder("syntax_held_out", args.out)
    dev = args.dev or ewt_dev()
    test = args.test or str(Path(dev).with_name("en_ewt-ud-test.conllu"))
    for path in (dev, test):
        if not str(path).endswith(".conllu") or not Path(path).is_file():
            print(f"syntax_held_out needs CoNLL-U treebanks (gold heads); no {path}. Pass --dev and --test")
            return 2
    limits = args.test_limit or [320, None]
    config = headscan.SweepConfig(device=args.device, max_len=args.max_len, examples=0)
    started = time.perf_counter()
    # the dev sweep with its random-init controls, the findings' null (models of their own in the tables)
    controls = {"control": ("random-init",), "control_seeds": args.control_seeds} if args.control_seeds else {}
    tables = headscan.sweep(args.model, dev, config=dataclasses.replace(config, limit=args.dev_limit, **controls))
    dev_corpus = read_corpus(dev, limit=args.dev_limit)
    dev_seconds = time.perf_counter() - started
    best = best_heads(tables["syntax"])
    best = best[best["model"] == args.model].reset_index(drop=True)
    old = in_sample_best(tables)
    old = old[old["model"] == args.model].reset_index(drop=True)
    keys = ["model", "relation", "direction"]
    verdicts = old[keys].assign(finding_in_sample=findings(old).to_numpy())
    table = best.assign(finding_held_out=findings(best).to_numpy()).merge(verdicts, on=keys, how="left",
                                                                           validate="one_to_one")
    table = table[table["finding_held_out"] | table["finding_in_sample"]].reset_index(drop=True)
    table = table.assign(offsets=_offset_halves(table, tables["syntax"]))
    columns = {"model": "model", "relation": "relation", "direction": "direction", "label": "head",
               "baseline_offset": "offset", "offsets": "offset_halves", "halves": "halves", "finding_held_out": "finding_held_out",
               "finding_in_sample": "finding_in_sample", "accuracy": "dev_accuracy",
               "accuracy_held_out": "dev_accuracy_held_out", "vs_baseline": "dev_vs",
               "vs_baseline_low": "dev_low", "vs_baseline_in_sample": "dev_vs_in_sample",
               "vs_baseline_in_sample_low": "dev_low_in_sample"}
    result = table[list(columns)].rename(columns=columns)
    samples, timings = [], {"dev": dev_seconds}
    for limit in limits:
        name = f"test{limit}" if limit else "test"
        started = time.perf_counter()
        test_tables, state, corpus = swept(args.model, test, dataclasses.replace(config, limit=limit))
        timings[name] = time.perf_counter() - started
        again = reestimate(table, test_tables["syntax"], state)
        result = result.assign(**{f"{name}_accuracy": again["accuracy"], f"{name}_vs": again["vs"],
                                  f"{name}_low": again["low"], f"{name}_high": again["high"],
                                  f"{name}_kept": again["low"] > 0})
        samples.append((name, len(corpus.segments), int(np.unique(corpus.segment_documents).size)))
    result.to_csv(out / "findings.csv", index=False)
    write_readme(out, result, samples, timings, dev, test, dev_corpus, args)
    print(f"wrote {out}")
    return 0 if _passed(result, samples) else 1


def _offset_halves(chosen: pd.DataFrame, syntax: pd.DataFrame) -> list[str]:
    """The offsets the cross-fit's two halves chose for each chosen row ("+1", or "-2 / -1" for the even then the
    odd units' choice)."""
    direction = [VISIBLE[d] if seen else d for d, seen in zip(chosen["direction"], chosen["visible"])]
    keys = chosen[["model", "layer", "head", "relation"]].assign(direction=direction)
    rows = keys.merge(syntax, on=["model", "layer", "head", "relation", "direction"], how="left")
    even, odd = (rows[f"baseline_offset_{half}"].map(offset_text) for half in ("even", "odd"))
    return [e if e == o else f"{e} / {o}" for e, o in zip(even, odd)]


def _shares(result: pd.DataFrame, name: str) -> dict[str, tuple[int, int]]:
    """Per way of making findings, (kept on test, findings)."""
    return {way: (int(result.loc[result[f"finding_{way}"], f"{name}_kept"].sum()), int(result[f"finding_{way}"].sum()))
            for way in ("held_out", "in_sample")}


def _passed(result: pd.DataFrame, samples) -> bool:
    kept, total = _shares(result, samples[-1][0])["held_out"]
    return total > 0 and kept / total >= TARGET


def _bias(result: pd.DataFrame, name: str) -> str:
    """Mean dev minus test point estimate of the paired difference, per way, over that way's findings."""
    parts = []
    for way, column in (("held_out", "dev_vs"), ("in_sample", "dev_vs_in_sample")):
        rows = result[result[f"finding_{way}"]]
        gap = 100 * (rows[column] - rows[f"{name}_vs"]).mean()
        fell = 100 * (rows["dev_accuracy_held_out" if way == "held_out" else "dev_accuracy"]
                      - rows[f"{name}_accuracy"]).mean()
        lost = rows[~rows[f"{name}_kept"]]
        width = 100 * (rows[f"{name}_high"] - rows[f"{name}_low"]).median()
        parts.append(f"{way.replace('_', '-')}: dev minus test {gap:+.1f} points on the difference, {fell:+.1f} on "
                     f"the head's accuracy; {len(lost)} lost, {int((lost[f'{name}_vs'] > 0).sum())} of them still "
                     f"above 0 on test as a point estimate; the test intervals' median width {width:.1f} points")
    return "; ".join(parts)


def write_readme(out: Path, result: pd.DataFrame, samples, timings, dev, test, dev_corpus, args) -> None:
    lines = ["# Syntax findings held out: EWT dev -> EWT test", "",
             f"`{args.model}` swept over `{corpus_name(dev)}` ({len(dev_corpus.segments)} sentences, "
             f"{np.unique(dev_corpus.segment_documents).size} documents; "
             + (f"with {args.control_seeds} random-init controls, the findings' null" if args.control_seeds else
                "without random-init controls: the findings' null is the best offset alone")
             + f") and `{corpus_name(test)}`, max_len "
             f"{args.max_len}, headscan's default settings otherwise; bootstrap unit: the document. A dev finding is a "
             "relation and direction whose best head beats the best fixed offset beyond its paired 95% interval and "
             "may carry a claim (the report's rule, `best_heads`): *held out*, by the cross-fitted difference (head "
             "and offset chosen on one half of the documents, by index parity, scored on the other), *in sample* by "
             "the difference with both chosen on every dev document (every verdict made again from the in-sample "
             "columns, as headscan made them before it cross-fitted). Each is re-estimated on test with the head "
             "and the offset named on the whole of dev held fixed: kept when its paired interval over test "
             "documents lies above 0.", "", "## Kept on test", "",
             "| test sample | sentences | documents | held out: kept / findings | in sample: kept / findings |",
             "|---|---|---|---|---|"]
    for name, n_sentences, n_documents in samples:
        shares = _shares(result, name)
        cells = [f"{k} / {n} ({k / n:.0%})" if n else "0 / 0" for k, n in shares.values()]
        lines.append(f"| {name} | {n_sentences} | {n_documents} | {cells[0]} | {cells[1]} |")
    last = samples[-1][0]
    kept, total = _shares(result, last)["held_out"]
    lines += ["", f"Check, on {last}: at least {TARGET:.0%} of the held-out findings kept: "
              f"**{verdict(total > 0 and kept / total >= TARGET)}** ({kept} of {total}).", "",
              "## Power or curse", ""]
    for name, *_ in samples:
        lines.append(f"- {name}: {_bias(result, name)}.")
    split = result[result["finding_held_out"] & result["offset_halves"].astype(str).str.contains("/")]
    if len(split):
        gap = 100 * (split["dev_vs"] - split["dev_vs_in_sample"]).mean()
        lines.append(f"- Where the halves chose different offsets ({', '.join(split['relation'] + ' ' + split['direction'])}), "
                     "each half is scored with an offset that is not its own best, so the held-out difference is "
                     f"{gap:+.1f} points above the in-sample one on average; on test, with dev's offset held fixed: "
                     + ", ".join(f"{name} {100 * (split['dev_vs'] - split[f'{name}_vs']).mean():+.1f}"
                                 for name, *_ in samples) + " points (dev held out minus test).")
    lines += ["", "Where the held-out dev estimate is about the test one on average, what a finding loses on test "
              "is power (a small test sample), not the curse; a finding whose test point estimate stays above 0 "
              "while its interval reaches 0 was not refuted.", "", "## Findings", "",
              markdown_table(result.drop(columns=["model"])), "",
              "Columns: offset, the best fixed offset on the whole of dev (held fixed on test); offset_halves and "
              "halves, the offsets and heads the two halves of dev chose (even units / odd units where they differ); dev_vs and dev_low, the cross-fitted difference and "
              "its interval's low end; dev_vs_in_sample, dev_low_in_sample, the in-sample ones; per test sample, "
              "the head's accuracy, its paired difference from the offset with its interval, and kept (low > 0).",
              "", "Seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()) + " (this machine, CPU).", "",
              f"    python experiments/syntax_held_out.py --control-seeds {args.control_seeds}", ""]
    (out / "README.md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
