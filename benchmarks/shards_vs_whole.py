#!/usr/bin/env python
"""N shards swept one after another plus `headscan merge`, against one unsharded sweep of the same corpus.

The same model and segments, side by side in one process, in alternating order; each run publishes its
tables to a temporary folder, as `headscan sweep --out` does. Prints the medians, the ratio, and the largest
difference between the merged and the unsharded tables (values and interval ends).

    HF_HUB_OFFLINE=1 python benchmarks/shards_vs_whole.py --corpus ../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from headscan.scan import merge, sweep  # noqa: E402

EWT = Path(__file__).resolve().parents[2] / "shared/data/ud-english-ewt/en_ewt-ud-dev.conllu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--corpus", default=str(EWT))
    parser.add_argument("--limit", type=int, default=512)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    settings = dict(device="cpu", limit=args.limit, bootstrap_unit="document")
    root = Path(tempfile.mkdtemp(prefix="headscan-shards-"))

    def whole(rep: int):
        return sweep(args.model, args.corpus, root / f"whole-{rep}", **settings)

    def sharded(rep: int):
        parts = [root / f"part-{rep}-{k}" for k in range(args.shards)]
        for k, part in enumerate(parts):
            sweep(args.model, args.corpus, part, shard=f"{k}/{args.shards}", **settings)
        return merge(parts, root / f"merged-{rep}")

    runs = {"whole": whole, "shards+merge": sharded}
    times = {name: [] for name in runs}
    results = {}
    for rep in range(args.reps):
        for name in runs if rep % 2 == 0 else reversed(list(runs)):
            started = time.perf_counter()
            results[name] = runs[name](rep)
            times[name].append(time.perf_counter() - started)
    median = {name: statistics.median(values) for name, values in times.items()}
    a, b = results["whole"].heads, results["shards+merge"].heads
    print(f"model={args.model} segments={args.limit} shards={args.shards} reps={args.reps} (each run publishes to disk)")
    for name, value in median.items():
        print(f"  {name:13} median {value:7.2f} s   (all: {', '.join(f'{t:.2f}' for t in times[name])})")
    print(f"ratio shards+merge / whole = {median['shards+merge'] / median['whole']:.2f}")
    for column in ("value", "ci_low", "ci_high"):
        print(f"  largest |merged - whole| {column}: {np.nanmax(np.abs(a[column].to_numpy() - b[column].to_numpy())):.1e}")


if __name__ == "__main__":
    main()
