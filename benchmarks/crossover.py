#!/usr/bin/env python
"""Eager against chunked attention at ordinary lengths: where `--attention auto` should switch.

For each model, length and mode, a fresh process loads the model, sweeps two segments to warm up, then sweeps
the first `--sentences` UD-EWT dev sentences packed into segments of the length (``--pack sentences``: every
segment holds `length` tokens, so the same tokens are swept at every length) with the default tables and
``batch_size = max(1, --batch-tokens // length)``. It reports the sweep's seconds and its peak resident memory
above what the process held before the sweep (``VmHWM`` reset through ``/proc/self/clear_refs``, as
benchmarks/long_context.py does), and then, per length, chunked over eager for both.

    python benchmarks/crossover.py
    python benchmarks/crossover.py --model smollm2 --lengths 128 512 2048 --query-chunk 64
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
EWT = HERE.parents[1] / "shared/data/ud-english-ewt/en_ewt-ud-dev.conllu"
sys.path.insert(0, str(HERE))

from long_context import peak, reset_peak  # noqa: E402  (the same peak-memory reading)


def child(model_name: str, length: int, mode: str, sentences: int, batch_tokens: int, query_chunk: int | None) -> dict:
    from headscan import SweepConfig
    from headscan.corpus import pack_corpus, read_corpus
    from headscan.models import load_model
    from headscan.scan import sweep_model

    model = load_model(model_name, device="cpu")
    batch_size = max(1, batch_tokens // length)
    chunk = {"query_chunk": query_chunk} if query_chunk else {}
    config = SweepConfig(device="cpu", max_len=length, pack="sentences", batch_size=batch_size, attention=mode, **chunk)
    # packed here: sweep_model sweeps the corpus it is given (the CLI and headscan.sweep pack), and unpacked
    # sentences of ~25 tokens never reach the length (what this benchmark measured before, at every length)
    sweep_model(model, pack_corpus(read_corpus(EWT, limit=2 * length // 8), "sentences", length), config)  # warm-up
    corpus = pack_corpus(read_corpus(EWT, limit=sentences), "sentences", length)
    before = reset_peak()
    start = time.perf_counter()
    sweep_model(model, corpus, config)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "extra_mib": peak() - before, "batch_size": batch_size,
            "segments": len(corpus.segments)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024, 2048])
    parser.add_argument("--sentences", type=int, default=400)
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--query-chunk", type=int, default=None, help="default: SweepConfig's")
    parser.add_argument("--child", nargs=2, metavar=("LENGTH", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = child(args.model, int(args.child[0]), args.child[1], args.sentences, args.batch_tokens,
                       args.query_chunk)
        print(json.dumps(result))
        return
    print(f"{args.model}: {args.sentences} EWT dev sentences packed, {args.batch_tokens} tokens per batch, "
          f"query chunk {args.query_chunk or 'default'}")
    print("| tokens | batch | eager s | chunked s | time ratio | eager extra MiB | chunked extra MiB | memory ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for length in args.lengths:
        results = {}
        for mode in ("eager", "chunked"):
            command = [sys.executable, __file__, "--model", args.model, "--sentences", str(args.sentences),
                       "--batch-tokens", str(args.batch_tokens), "--child", str(length), mode]
            if args.query_chunk:
                command += ["--query-chunk", str(args.query_chunk)]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                print(f"{length} {mode} failed: {done.stderr.strip().splitlines()[-1:]}")
                break
            results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        if len(results) < 2:
            continue
        eager, chunked = results["eager"], results["chunked"]
        print(f"| {length:,} | {eager['batch_size']} | {eager['seconds']:.1f} | {chunked['seconds']:.1f} | "
              f"{chunked['seconds'] / eager['seconds']:.2f} | {eager['extra_mib']:,.0f} | "
              f"{chunked['extra_mib']:,.0f} | {chunked['extra_mib'] / max(eager['extra_mib'], 1):.2f} |", flush=True)


if __name__ == "__main__":
    main()
