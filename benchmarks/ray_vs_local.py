#!/usr/bin/env python
"""One sweep run plainly and on a local Ray instance, side by side: wall times and their ratio.

The same sweep (default: minilm over the first 256 UD-EWT dev sentences, batch 16, on the CPU) runs as
``headscan.sweep(...)`` in this process (headscan, torch and transformers imported beforehand), and as
``headscan.sweep(..., ray=True)`` on a local Ray instance with `--cpus` CPUs: one actor per CPU, each with
one torch thread, each starting a Python that imports torch and loading the model, all of which the Ray
time counts; the instance's own start is printed apart. With ``--reps`` above 1 the order alternates and
medians are shown. Also prints how far the two runs' values are apart (float32 noise: the batches differ).

    python benchmarks/ray_vs_local.py
    python benchmarks/ray_vs_local.py --limit 1024 --reps 3
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

EWT = Path(__file__).resolve().parents[2] / "shared/data/ud-english-ewt/en_ewt-ud-dev.conllu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--corpus", default=str(EWT))
    parser.add_argument("--limit", type=int, default=256, help="segments to sweep (default 256)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance (default 2)")
    parser.add_argument("--reps", type=int, default=1, help="runs of each, in alternating order (default 1)")
    args = parser.parse_args()
    settings = dict(limit=args.limit, batch_size=args.batch_size, device="cpu")

    import ray
    import torch

    import headscan.scan.cluster  # imports headscan.scan and models: torch, transformers

    logs = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    start = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, _temp_dir=logs, log_to_driver=False,
             logging_level=logging.WARNING)
    init_s = time.perf_counter() - start
    times: dict[str, list[float]] = {"plain": [], "ray": []}
    runs = {}
    try:
        for rep in range(args.reps):
            for kind in ("plain", "ray") if rep % 2 == 0 else ("ray", "plain"):
                start = time.perf_counter()
                runs[kind] = headscan.sweep(args.model, args.corpus, None, ray=kind == "ray", **settings)
                times[kind].append(time.perf_counter() - start)
    finally:
        ray.shutdown()
        shutil.rmtree(logs, ignore_errors=True)
    plain, on_ray = runs["plain"], runs["ray"]
    plain_s, ray_s = statistics.median(times["plain"]), statistics.median(times["ray"])

    shards = on_ray.provenance.extra["ray"]["shards"]
    gap = np.nanmax(np.abs(plain.heads["value"].to_numpy() - on_ray.heads["value"].to_numpy()))
    n_tokens = plain.provenance.models[0].n_tokens
    print(f"{args.model}, {args.limit} segments ({n_tokens:,} tokens) of {Path(args.corpus).name}, batch "
          f"{args.batch_size}, {os.cpu_count()} cores here" + (f"; medians of {args.reps}" if args.reps > 1 else ""))
    print(f"{'plain sweep':<34}{plain_s:8.1f} s   (one process, {torch.get_num_threads()} torch threads)")
    print(f"{'ray sweep':<34}{ray_s:8.1f} s   ({args.cpus} actors of one CPU, {shards} shards)")
    print(f"{'ray / plain':<34}{ray_s / plain_s:8.2f}")
    if args.reps > 1:
        print(f"{'each run (plain; ray)':<34}{', '.join(f'{t:.1f}' for t in times['plain'])}; "
              f"{', '.join(f'{t:.1f}' for t in times['ray'])} s")
    print(f"{'ray.init (not in the ratio)':<34}{init_s:8.1f} s")
    print(f"{'largest |value| difference':<34}{gap:8.1e}")


if __name__ == "__main__":
    main()
