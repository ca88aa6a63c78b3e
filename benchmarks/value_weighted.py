#!/usr/bin/env python
"""What value weighting and direct logit attribution cost: the same sweep with ``values`` off and on, side by side.

For each model (default: minilm and smollm2) and each setting, a fresh Python process loads the model, sweeps the
first `--limit` sentences of the UD-EWT dev treebank (``../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu``, or
the folder or file in ``HEADSCAN_EWT``) on the CPU, and reports the sweep's wall time (after a warm-up batch) and
its peak resident memory above the loaded model (max RSS during the sweep minus RSS before it). Then it prints

    model | values off: s, MiB | values on: s, MiB | time ratio | memory ratio

The target: values on costs at most 1.5x the attention-only sweep, in the same single pass.

    python benchmarks/value_weighted.py
    python benchmarks/value_weighted.py --model minilm --limit 200 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

EWT = Path(__file__).resolve().parents[2] / "shared/data/ud-english-ewt/en_ewt-ud-dev.conllu"

CHILD = r"""
import json, resource, sys, time, warnings
warnings.filterwarnings("ignore")
from headscan.config import SweepConfig
from headscan.corpus import read_corpus
from headscan.models import load_model
from headscan.scan import sweep_model

name, corpus, limit, values, batch_size, bootstrap = sys.argv[1:7]
model = load_model(name, device="cpu")
first = read_corpus(corpus, limit=int(batch_size))
corpus = read_corpus(corpus, limit=int(limit))
config = SweepConfig(limit=int(limit), values=values == "on", batch_size=int(batch_size), bootstrap=int(bootstrap))
sweep_model(model, first, config)  # first-call costs (weights read, allocator) out of the timing
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096  # noqa: E731
before = rss()
started = time.perf_counter()
sweep_model(model, corpus, config)
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": seconds, "peak_mib": max(peak - before, 0) / 2**20}))
"""


def measure(model: str, corpus: Path, limit: int, values: str, batch_size: int, bootstrap: int) -> dict:
    result = subprocess.run([sys.executable, "-c", CHILD, model, str(corpus), str(limit), values, str(batch_size),
                             str(bootstrap)], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", help="model spec (repeatable; default minilm and smollm2)")
    parser.add_argument("--corpus", type=Path, default=None, help="a corpus file (default: EWT dev)")
    parser.add_argument("--limit", type=int, default=200, help="sentences swept (default 200)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--bootstrap", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=1, help="runs per setting, alternating; the fastest is kept")
    args = parser.parse_args()
    corpus = args.corpus
    if corpus is None:
        found = Path(os.environ.get("HEADSCAN_EWT", EWT)).expanduser()
        corpus = found / "en_ewt-ud-dev.conllu" if found.is_dir() else found
    if not corpus.is_file():
        sys.exit(f"corpus not found: {corpus} (pass --corpus or set HEADSCAN_EWT)")
    print(f"corpus {corpus.name}, {args.limit} sentences, batch {args.batch_size}, {args.bootstrap} bootstrap "
          f"replicates, CPU, {os.cpu_count()} cores; fastest of {args.repeats}")
    print("| model | values off: s | values off: MiB | values on: s | values on: MiB | time ratio | memory ratio |")
    print("|---|---|---|---|---|---|---|")
    for model in args.model or ["minilm", "smollm2"]:
        runs = {"off": [], "on": []}
        for _ in range(args.repeats):
            for values in ("off", "on"):  # alternating: load on a shared machine hits both alike
                runs[values].append(measure(model, corpus, args.limit, values, args.batch_size, args.bootstrap))
        off = min(runs["off"], key=lambda r: r["seconds"])
        on = min(runs["on"], key=lambda r: r["seconds"])
        memory = on["peak_mib"] / off["peak_mib"] if off["peak_mib"] else float("nan")
        print(f"| {model} | {off['seconds']:.1f} | {off['peak_mib']:.0f} | {on['seconds']:.1f} | {on['peak_mib']:.0f} "
              f"| {on['seconds'] / off['seconds']:.2f} | {memory:.2f} |", flush=True)


if __name__ == "__main__":
    main()
