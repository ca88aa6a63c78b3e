"""Every document's own sums and counts per (layer, head, column): the data of experiments/interval_coverage.py.

    python experiments/unit_sums.py minilm ../shared/data/ud-english-ewt/en_ewt-ud-test.conllu out/unit_sums/minilm-test.npz
    python experiments/unit_sums.py smollm2 repeat-random:count=300 out/unit_sums/smollm2-repeat-random.npz

The model is loaded once and each document of the corpus (its ``# newdoc`` blocks; each segment for a corpus
without documents) is swept alone, with the sweep's own accumulation (`headscan.scan.reduce.accumulate`, no
bootstrap), so that a document's sums and counts are exactly what a sweep adds up for it. A part of N documents
is then the sum of their rows, and its intervals are what a sweep of those documents alone gives
(`interval_coverage.part_state`). Every column of the plan is kept (heads, offsets, positions, value, syntax);
the weights table is not a sum over documents and is left out.

With ``--importance`` the model is instead swept once over the whole corpus with ``--importance ablate`` (units:
documents, no bootstrap) and each document's importance sums are taken from the sweep's windows as they are added
up (`headscan.scan.reduce.Totals.add` sees every window's per-unit sums), so they are exactly what the sweep adds
for it. One difference from a sweep of a part alone: mean ablation's head means and resample ablation's donors
are drawn from the whole split, not from the part. ``--ablate-top N`` ablates only the N heads of largest |AtP|
exactly (smollm2's 270 heads x 3 methods are hours on 2 cores); the other heads' exact rows have count 0 and drop
out of the coverage.

    python experiments/unit_sums.py minilm ../shared/data/ud-english-ewt/en_ewt-ud-test.conllu out/unit_sums/minilm-test-importance.npz --importance

Writes an ``.npz`` with ``sums`` and ``counts`` (document, layer, head, column), float64, and ``columns``, the
JSON list of (metric, key, table) of each column, with the revision and settings in ``meta``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from headscan.config import SweepConfig
from headscan.corpus import read_corpus
from headscan.models import load_model
from headscan.scan import reduce
from headscan.scan.plan import plan_sweep
from headscan.scan.reduce import accumulate

ROOT = Path(__file__).resolve().parents[1]


def unit_sums(model_spec: str, corpus_source: str, *, max_len: int = 128, limit: int | None = None):
    """(sums, counts, columns) over every document of the corpus, one sweep per document."""
    model = load_model(model_spec, device="cpu")
    corpus = read_corpus(corpus_source, limit=limit)
    config = SweepConfig(max_len=max_len, bootstrap=0, bootstrap_unit="document" if corpus.kind == "conllu" else
                         "segment", values=True)
    documents = corpus.segment_documents
    first = None
    sums, counts = [], []
    for document in np.unique(documents):
        part = dataclasses.replace(corpus, segments=tuple(corpus.segments[i]
                                                          for i in np.flatnonzero(documents == document)))
        plan = plan_sweep(model, part, config, unit_why="every document alone")
        columns = [(metric.name, list(key), table) for metric, key, table in plan.columns]
        if first is None:
            first = columns
        elif columns != first:
            raise SystemExit(f"document {document}: its columns differ from the first document's")
        state = accumulate(model, part, plan)
        sums.append(state.sums.astype(np.float64))
        counts.append(state.counts.astype(np.float64))
    return np.stack(sums), np.stack(counts), first


def importance_sums(model_spec: str, corpus_source: str, *, max_len: int = 128, limit: int | None = None,
                    ablate_top: int | None = None):
    """(sums, counts, columns) of the importance columns per document, from one sweep over the whole corpus."""
    model = load_model(model_spec, device="cpu")
    corpus = read_corpus(corpus_source, limit=limit)
    config = SweepConfig(max_len=max_len, bootstrap=0, bootstrap_unit="document" if corpus.kind == "conllu" else
                         "segment", importance="ablate", ablate_top=ablate_top, examples=0,
                         composition="off")
    plan = plan_sweep(model, corpus, config)
    keep = [i for i, (_, _, table) in enumerate(plan.columns) if table == "importance"]
    columns = [(metric.name, list(key), table) for metric, key, table in (plan.columns[i] for i in keep)]
    per_unit: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    add = reduce.Totals.add

    def recording(totals, window, config):  # every window's own per-unit sums, before they are added up
        for unit, row in window.units.items():
            per_unit[unit] = (window.sums[:, row][..., keep].double().cpu().numpy(),
                              window.counts[:, row][..., keep].double().cpu().numpy())
        return add(totals, window, config)

    reduce.Totals.add = recording
    try:
        accumulate(model, corpus, plan, progress=True)
    finally:
        reduce.Totals.add = add
    units = sorted(per_unit)
    return (np.stack([per_unit[u][0] for u in units]), np.stack([per_unit[u][1] for u in units]), columns)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("corpus")
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--importance", action="store_true", help="the importance columns, from one whole sweep")
    parser.add_argument("--ablate-top", type=int, default=None, help="with --importance: exact for the top N only")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.importance:
        sums, counts, columns = importance_sums(args.model, args.corpus, max_len=args.max_len, limit=args.limit,
                                                ablate_top=args.ablate_top)
    else:
        sums, counts, columns = unit_sums(args.model, args.corpus, max_len=args.max_len, limit=args.limit)
    revision = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    meta = {"model": args.model, "corpus": args.corpus, "max_len": args.max_len, "limit": args.limit,
            "importance": args.importance, "ablate_top": args.ablate_top,
            "git_revision": revision.strip() or None, "seconds": round(time.perf_counter() - started, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_name(args.out.name + ".partial.npz")
    np.savez(partial, sums=sums, counts=counts, columns=json.dumps(columns), meta=json.dumps(meta))
    partial.replace(args.out)  # never a half-written file
    print(f"{args.out}: {sums.shape[0]} documents x {sums.shape[1]} layers x {sums.shape[2]} heads x "
          f"{sums.shape[3]} columns in {meta['seconds']} s", file=sys.stderr)


if __name__ == "__main__":
    main()
