#!/usr/bin/env python
"""What head importance costs: a plain sweep, the same sweep with ``importance="atp"`` and with
``importance="ablate"``, side by side in one process.

For each model (default: minilm and smollm2) the model is loaded once, a warm-up batch is swept, then the first
`--limit` sentences of the UD-EWT dev treebank (``../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu``, or the
folder or file in ``HEADSCAN_EWT``) are swept on the CPU with importance off, atp and ablate (``--ablate-top``
heads, or every head where the target has no AtP to rank them by: minilm's hidden_change), alternating, `--repeats`
times; the fastest of each is kept. It prints

    model | target | plain s | atp s | ablate s (heads) | atp / plain | ablate / plain | one head / plain

"one head" is the exact ablation of one head, mean and zero, over the same sentences: (ablate - atp) / heads.
Every head of a model costs about (atp / plain) + heads x (one head / plain) plain sweeps.

    python benchmarks/importance.py
    python benchmarks/importance.py --model smollm2 --limit 32 --ablate-top 4 --repeats 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

EWT = Path(__file__).resolve().parents[2] / "shared/data/ud-english-ewt/en_ewt-ud-dev.conllu"


def timed(model, corpus, config) -> tuple[float, object]:
    from headscan.scan import sweep_model

    started = time.perf_counter()
    run = sweep_model(model, corpus, config)
    return time.perf_counter() - started, run


def fastest(model, corpus, warm, configs: dict, repeats: int) -> tuple[dict, dict]:
    """Each setting of `configs` swept over `corpus`, alternating, `repeats` times after one warm-up sweep of `warm`
    each: the fastest seconds and the last run of each setting."""
    for config in configs.values():
        timed(model, warm, config)  # first-call costs (weights read, probes, allocator) out of the timing
    seconds = {setting: [] for setting in configs}
    runs = {}
    for _ in range(repeats):
        for setting, config in configs.items():  # alternating: load on a shared machine hits each alike
            took, runs[setting] = timed(model, corpus, config)
            seconds[setting].append(took)
    return {setting: min(times) for setting, times in seconds.items()}, runs


def ewt_corpus(given: Path | None) -> Path:
    """`given`, or EWT dev found through ``HEADSCAN_EWT`` (a folder or the file) or beside the repository; exits
    with one line when there is none."""
    corpus = given
    if corpus is None:
        found = Path(os.environ.get("HEADSCAN_EWT", EWT)).expanduser()
        corpus = found / "en_ewt-ud-dev.conllu" if found.is_dir() else found
    if not corpus.is_file():
        sys.exit(f"corpus not found: {corpus} (pass --corpus or set HEADSCAN_EWT)")
    return corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", help="model spec (repeatable; default minilm and smollm2)")
    parser.add_argument("--corpus", type=Path, default=None, help="a corpus file (default: EWT dev)")
    parser.add_argument("--limit", type=int, default=32, help="sentences swept (default 32)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--ablate-top", type=int, default=4, help="heads ablated exactly (default 4)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per setting, alternating; the fastest is kept")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import torch

    from headscan.config import SweepConfig
    from headscan.corpus import read_corpus
    from headscan.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    corpus = ewt_corpus(args.corpus)
    sentences = read_corpus(corpus, limit=args.limit)
    warm = read_corpus(corpus, limit=2)
    print(f"corpus {corpus.name}, {args.limit} sentences, batch {args.batch_size}, CPU, {torch.get_num_threads()} "
          f"torch threads on {os.cpu_count()} cores; fastest of {args.repeats}")
    print("| model | target | plain s | atp s | ablate s (heads) | atp / plain | ablate / plain | one head / plain |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.model or ["minilm", "smollm2"]:
        model = load_model(name, device="cpu")
        base = dict(batch_size=args.batch_size, bootstrap=200, values=True)
        configs = {"plain": SweepConfig(**base), "atp": SweepConfig(**base, importance="atp"),
                   "ablate": SweepConfig(**base, importance="ablate", ablate_top=args.ablate_top)}
        best, runs = fastest(model, sentences, warm, configs, args.repeats)
        notes = runs["ablate"].provenance.models[0].extra["importance"]
        heads = len(notes["ablated"])
        one = (best["ablate"] - best["atp"]) / heads / best["plain"]
        print(f"| {name} | {notes['target']} | {best['plain']:.1f} | {best['atp']:.1f} | {best['ablate']:.1f} ({heads}) "
              f"| {best['atp'] / best['plain']:.2f} | {best['ablate'] / best['plain']:.2f} | {one:.2f} |", flush=True)
        del model


if __name__ == "__main__":
    main()
