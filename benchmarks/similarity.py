#!/usr/bin/env python
"""What head similarity costs: a plain sweep and the same sweep with ``similarity_sample=N``, side by side in one
process, and the tables it leaves for a look at the head families.

For each model (default: minilm and smollm2) the model is loaded once, a warm-up batch is swept, then the first
`--limit` sentences of the UD-EWT dev treebank (``../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu``, or the
folder or file in ``HEADSCAN_EWT``) are swept on the CPU with similarity off and with a sample of `--sample`
segments, alternating, `--repeats` times; the fastest of each is kept. It prints

    model | heads | pairs | sampled queries | plain s | similarity s | similarity / plain | s per sampled segment

and, with ``--out DIR``, writes the last similarity run's tables there (for `headscan report`).

    python benchmarks/similarity.py --limit 64 --sample 64
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import warnings
from pathlib import Path

from importance import ewt_corpus, fastest  # this folder's: the same corpus and timing as the importance benchmark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", help="model spec (repeatable; default minilm and smollm2)")
    parser.add_argument("--corpus", type=Path, default=None, help="a corpus file (default: EWT dev)")
    parser.add_argument("--limit", type=int, default=64, help="sentences swept (default 64)")
    parser.add_argument("--sample", type=int, default=64, help="--similarity-sample (default 64)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1, help="runs per setting, alternating; the fastest is kept")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--out", type=Path, default=None, help="write the similarity runs' tables here")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import torch

    from headscan.config import SweepConfig
    from headscan.corpus import read_corpus
    from headscan.models import load_model
    from headscan.tables import side_by_side, write

    if args.threads:
        torch.set_num_threads(args.threads)
    corpus = ewt_corpus(args.corpus)
    sentences = read_corpus(corpus, limit=args.limit)
    warm = read_corpus(corpus, limit=2)
    print(f"corpus {corpus.name}, {args.limit} sentences, sample {args.sample}, batch {args.batch_size}, CPU, "
          f"{torch.get_num_threads()} torch threads on {os.cpu_count()} cores; fastest of {args.repeats}")
    print("| model | heads | pairs | sampled queries | plain s | similarity s | similarity / plain | s per sampled segment |")
    print("|---|---|---|---|---|---|---|---|")
    kept = []
    for name in args.model or ["minilm", "smollm2"]:
        model = load_model(name, device="cpu")
        base = dict(batch_size=args.batch_size, bootstrap=200, values=True)
        configs = {"plain": SweepConfig(**base), "similarity": SweepConfig(**base, similarity_sample=args.sample)}
        best, runs = fastest(model, sentences, warm, configs, args.repeats)
        table = runs["similarity"]["similarity"]
        sampled = runs["similarity"].provenance.models[0].extra["similarity"]["sample_n"]
        heads = model.n_layers * model.n_heads
        print(f"| {name} | {heads} | {heads * (heads - 1) // 2:,} | {int(table['count'].max()):,} | {best['plain']:.1f} "
              f"| {best['similarity']:.1f} | {best['similarity'] / best['plain']:.2f} "
              f"| {(best['similarity'] - best['plain']) / sampled:.3f} |", flush=True)
        kept.append(runs["similarity"])
        del model
    if args.out is not None:
        models = tuple(m for run in kept for m in run.provenance.models)
        tables = side_by_side(kept, dataclasses.replace(kept[0].provenance, models=models))
        write(tables, args.out, overwrite=True)
        print(f"tables written to {args.out}")


if __name__ == "__main__":
    main()
