#!/usr/bin/env python
"""What `torch.compile` would give the sweep's per-layer reduction on this machine: a trial, not a code path.

Captures the first group of layers a default minilm sweep scores (a real `AttentionBatch` of 16 EWT sentences,
as many layers stacked as `headscan.scan.layers.STACK_BYTES` allows), then times every attention metric the sweep runs on it, each on a fresh copy of the
batch (so the quantities metrics share are computed anew, as in a sweep):

  eager      the metric functions as the sweep calls them;
  compiled   the same functions through ``torch.compile(dynamic=True)`` (inductor, CPU), after compiling;
  compile    seconds the first compiled call took (tracing and code generation; a warm on-disk cache cuts it).

and prints per-batch milliseconds, the largest difference between the two (float32), and how many batches a
sweep must score before compiling pays for itself. headscan compiles nothing by default: see docs/speed.md
for the numbers this printed and why.

    python benchmarks/compile_trial.py
    python benchmarks/compile_trial.py --model smollm2 --repeats 20
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from headscan import SweepConfig  # noqa: E402
from headscan.corpus import read_corpus  # noqa: E402
from headscan.models import load_model  # noqa: E402
from headscan.scan import layers as scan_layers  # noqa: E402
from headscan.scan import sweep_model  # noqa: E402

EWT = Path(__file__).resolve().parents[2] / "shared/data/ud-english-ewt/en_ewt-ud-dev.conllu"


def captured_batch(model_name: str, corpus_path: Path, batch_size: int):
    """The AttentionBatch of the first group of layers a default sweep scores, and the columns it scores."""
    kept = {}
    score = scan_layers._score

    def keep(batches, columns, *args, **kwargs):
        kept.setdefault("batch", batches["attention"])
        kept.setdefault("columns", columns)
        return score(batches, columns, *args, **kwargs)

    scan_layers._score = keep
    try:
        corpus = read_corpus(corpus_path, limit=batch_size)
        sweep_model(load_model(model_name, device="cpu"), corpus,
                    SweepConfig(device="cpu", batch_size=batch_size, limit=batch_size, values=False))
    finally:
        scan_layers._score = score
    return kept["batch"], kept["columns"]


def run_all(functions, batch):
    fresh = dataclasses.replace(batch)  # no cached shared quantities: each run computes them, as a sweep does
    return [function(fresh) for function in functions]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--corpus", type=Path, default=EWT)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()

    batch, columns = captured_batch(args.model, args.corpus, args.batch_size)
    metrics = [m for m in dict.fromkeys(m for m, _, table in columns if table != "value") if not m.needs]
    functions = [m.function for m in metrics]
    print(f"{args.model}: pattern {tuple(batch.pattern.shape)} (layers x batch, head, q, k), "
          f"{len(functions)} metrics: {', '.join(m.name for m in metrics)}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")

    # each metric compiled apart, falling back to eager where inductor fails (as a sweep would have to)
    compiled_functions, failed, compile_s = [], [], 0.0
    for metric in metrics:
        candidate = torch.compile(metric.function, dynamic=True)
        start = time.perf_counter()
        try:
            candidate(dataclasses.replace(batch))
            compiled_functions.append(candidate)
        except Exception as error:  # e.g. inductor's C++ compile failing; the eager function stands in
            failed.append(f"{metric.name} ({type(error).__name__})")
            compiled_functions.append(metric.function)
        compile_s += time.perf_counter() - start
    compiled_all = functools.partial(run_all, compiled_functions)
    eager_out, compiled_out = run_all(functions, batch), compiled_all(batch)
    differences = {metric.name: max(float((a - b).abs().nan_to_num().max()) for a, b in zip(e, c))
                   for metric, e, c in zip(metrics, eager_out, compiled_out)}
    worst = max(differences, key=differences.get)
    if failed:
        print(f"  inductor failed on {len(failed)}, run eager instead: {', '.join(failed)}")

    def per_call(function) -> float:
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            function(batch)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    eager = per_call(lambda b: run_all(functions, b))
    compiled = per_call(compiled_all)
    saved = eager - compiled
    print(f"  eager     {1e3 * eager:8.2f} ms per group of layers")
    print(f"  compiled  {1e3 * compiled:8.2f} ms per group of layers   ratio compiled / eager = {compiled / eager:.2f}")
    print(f"  compile   {compile_s:8.2f} s for the first calls (all metrics)")
    print(f"  largest difference {differences[worst]:.2e} ({worst}; sums over a batch's queries, float32)")
    if saved > 0:
        print(f"  compiling pays for itself after {compile_s / saved:,.0f} groups of layers "
              f"(a 256-sentence minilm sweep scores 16)")
    else:
        print("  compiling never pays for itself here")


if __name__ == "__main__":
    main()
