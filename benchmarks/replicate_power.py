#!/usr/bin/env python
"""What the replicates' power sums (which the studentized interval needs) cost the sweep, as ratios.

Times, one after another and in alternating order, in one process:

  before       `headscan.scan.sweep_model` with a window step without them (replicate totals and the units'
               power sums, no `replicate_power`);
  after        the same sweep with the real window step, which adds sum_u w_bu s_u^2, s_u c_u, c_u^2 per replicate.

and the window step alone (`headscan.scan.reduce._add_window`, before and after) on a window of random sums of
the model's shape. Prints medians and the ratios after / before.

    python benchmarks/replicate_power.py                        # minilm, 128 EWT dev sentences
    python benchmarks/replicate_power.py --model smollm2 --limit 64 --reps 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from headscan import SweepConfig, intervals  # noqa: E402
from headscan.corpus import read_corpus  # noqa: E402
from headscan.models import load_model  # noqa: E402
from headscan.scan import reduce, sweep_model  # noqa: E402
from headscan.scan.plan import columns_of, resolve_unit  # noqa: E402

EWT = Path(__file__).resolve().parents[2] / "shared/data/ud-english-ewt/en_ewt-ud-dev.conllu"


def add_window_before(totals: dict, window, config: SweepConfig) -> None:
    """`reduce._add_window` without the replicates' power sums (the baseline)."""
    sums = window.sums.transpose(0, 1)
    counts = window.counts.transpose(0, 1)
    totals["sums"] += sums.sum(0)
    totals["counts"] += counts.sum(0)
    if config.bootstrap:
        weights = torch.from_numpy(intervals.bootstrap_weights(list(window.units), config.bootstrap, config.seed))
        weights = weights.to(sums.device)
        totals["replicate_sums"] += (weights @ sums.flatten(1)).view_as(totals["replicate_sums"])
        totals["replicate_counts"] += (weights @ counts.flatten(1)).view_as(totals["replicate_counts"])
    totals["moments"] = intervals.combine_moments(totals["moments"], intervals.unit_moments(sums, counts))
    totals["chance"] += window.chance
    totals["baseline"] += window.baseline


def time_sweeps(model, corpus, config: SweepConfig, reps: int) -> dict[str, list[float]]:
    real = reduce._add_window
    out: dict[str, list[float]] = {"before": [], "after": []}
    for rep in range(reps):
        for name in (("before", "after") if rep % 2 == 0 else ("after", "before")):
            reduce._add_window = add_window_before if name == "before" else real
            try:
                started = time.perf_counter()
                sweep_model(model, corpus, config)
                out[name].append(time.perf_counter() - started)
            finally:
                reduce._add_window = real
    return out


def time_window_step(shape: tuple[int, int, int], units: int, config: SweepConfig, reps: int) -> dict[str, list[float]]:
    layers, heads, columns = shape
    generator = torch.Generator().manual_seed(0)
    sums = torch.rand((layers, units, heads, columns), generator=generator, dtype=torch.float64)
    window = reduce.Window({u: u for u in range(units)}, sums, sums + 1, torch.zeros(shape, dtype=torch.float64),
                           torch.zeros((2, 0, 0), dtype=torch.float64))
    B = config.bootstrap
    totals = {"sums": torch.zeros(shape, dtype=torch.float64), "counts": torch.zeros(shape, dtype=torch.float64),
              "replicate_sums": torch.zeros((B, *shape), dtype=torch.float64),
              "replicate_counts": torch.zeros((B, *shape), dtype=torch.float64),
              "replicate_power": torch.zeros((3, B, *shape), dtype=torch.float64),
              "moments": torch.zeros((len(intervals.MOMENT_TERMS), *shape), dtype=torch.float64),
              "chance": torch.zeros(shape, dtype=torch.float64), "baseline": torch.zeros((2, 0, 0), dtype=torch.float64)}
    out: dict[str, list[float]] = {"before": [], "after": []}
    for rep in range(reps):
        for name in (("before", "after") if rep % 2 == 0 else ("after", "before")):
            step = add_window_before if name == "before" else reduce._add_window
            started = time.perf_counter()
            step(totals, window, config)
            out[name].append(time.perf_counter() - started)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--corpus", default=str(EWT))
    parser.add_argument("--limit", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--units", type=int, default=32, help="units in the window of the window-step timing")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    corpus = read_corpus(args.corpus, limit=args.limit)
    config = SweepConfig(device="cpu", limit=args.limit)
    model = load_model(args.model, device="cpu")
    shape = (model.n_layers, model.n_heads, len(columns_of(resolve_unit(corpus, config)[0], True,
                                                                causal=model.causal)))
    sweep_model(model, corpus, config)  # warm up: weights read, kernels loaded

    def report(what: str, times: dict[str, list[float]]) -> None:
        before, after = statistics.median(times["before"]), statistics.median(times["after"])
        print(f"{what}: before {before:.3f} s, after {after:.3f} s, ratio after / before {after / before:.3f} "
              f"(medians of {len(times['after'])})")

    report(f"{args.model} sweep of {args.limit} sentences", time_sweeps(model, corpus, config, args.reps))
    report(f"window step, {args.units} units, {shape} (layer, head, column), {config.bootstrap} replicates",
           time_window_step(shape, args.units, config, max(5, args.reps)))


if __name__ == "__main__":
    main()
