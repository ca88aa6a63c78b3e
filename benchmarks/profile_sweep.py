"""Where a sweep's time goes: each stage's share of a default sweep, from Python's profiler.

Runs `headscan.scan.sweep_model` once under cProfile (after one unprofiled warm-up batch) and splits its time
by who called what, so that nothing is counted twice:

- ``forward``: the model's own forward passes, less the hooks that run inside them;
- each metric (``metric prev_token`` ...): its function's time when the layer scorer calls it, and ``chance``
  the null-head sums beside them;
- ``pattern hook (rest)``: the per-layer hook less its metrics (masks, the batch of shared quantities, stacking
  the scores);
- ``value weighting``, ``head outputs (dla)``, ``final residual (dla)``: the value, head-output and residual
  hooks;
- ``syntax baseline``: the fixed-offset baseline per batch; ``bootstrap accumulation``: per-unit sums into
  replicates and moments, once per window;
- ``weights``: reading each head's weights for the weights table; ``tables and intervals``: the tables and
  every row's interval from the accumulated sums, once at the end; ``other``: the rest (tokenising, batching).

cProfile adds a cost per Python call, so the shares of Python-heavy stages are upper bounds; the torch kernels
that dominate are timed as they run. Shares, not seconds, are the result: a loaded machine scales them alike.

    HEADSCAN_EWT=../shared/data/ud-english-ewt python benchmarks/profile_sweep.py --model minilm --limit 256
    python benchmarks/profile_sweep.py --model smollm2 --limit 64 --top 25
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def _key(stats: pstats.Stats, path_part: str, name: str):
    """The profiler's key of the function `name` defined in a file whose path ends with `path_part`."""
    found = [k for k in stats.stats if k[0].replace(os.sep, "/").endswith(path_part) and k[2] == name]
    return found[0] if found else None


def _cumulative(stats: pstats.Stats, key) -> float:
    return stats.stats[key][3] if key in stats.stats else 0.0


def _from(stats: pstats.Stats, caller) -> dict:
    """{callee: cumulative seconds when called by `caller`}."""
    out = {}
    for callee, (_, _, _, _, callers) in stats.stats.items():
        if caller in callers:
            out[callee] = callers[caller][3]
    return out


def stages(stats: pstats.Stats, total: float) -> list[tuple[str, float]]:
    """(stage, seconds), disjoint, adding up to `total`."""
    k = lambda path, name: _key(stats, path, name)  # noqa: E731
    sweep_window = k("scan/reduce.py", "_sweep_window")
    hooks = {name: k("scan/layers.py", name) for name in ("pattern", "values", "head_outputs", "final_residual",
                                                          "start", "finish")}
    score = k("scan/layers.py", "_score")
    rows = []
    metric_time = 0.0
    if score is not None:
        chance = 0.0
        for callee, seconds in sorted(_from(stats, score).items(), key=lambda item: -item[1]):
            label = callee[2]
            if label.startswith("<"):  # a builtin the scorer calls itself (dict.fromkeys)
                continue
            if label in ("chance_sums", "_first_layer"):  # _first_layer: the rows the plain null head reads
                chance += seconds
            else:
                rows.append((f"metric {label}", seconds))
            metric_time += seconds
        rows.insert(0, ("chance (null-head sums)", chance))
    pattern = _cumulative(stats, hooks["pattern"])
    rows.append(("pattern hook (rest: masks, shared quantities, stacking)", max(pattern - metric_time, 0.0)))
    rows.append(("value weighting (value hook)", _cumulative(stats, hooks["values"])))
    rows.append(("head outputs (dla)", _cumulative(stats, hooks["head_outputs"])))
    rows.append(("final residual (dla)", _cumulative(stats, hooks["final_residual"])))
    rows.append(("batch start and finish (masks, stacking sums)", _cumulative(stats, hooks["start"]) +
                 _cumulative(stats, hooks["finish"])))
    in_hooks = sum(_cumulative(stats, hooks[n]) for n in ("pattern", "values", "head_outputs", "final_residual"))
    forward_keys = [callee for callee in _from(stats, sweep_window) if callee[2] in ("forward", "<lambda>", "run")
                    or "forward" in callee[2]]
    forward_total = sum(_from(stats, sweep_window)[c] for c in forward_keys)
    rows.insert(0, ("forward (the model, less the hooks inside it)", max(forward_total - in_hooks, 0.0)))
    rows.append(("syntax baseline", _cumulative(stats, k("metrics/syntax.py", "offset_baseline"))))
    rows.append(("bootstrap accumulation", _cumulative(stats, k("scan/reduce.py", "_add_window"))))
    rows.append(("weights (weights table)", _cumulative(stats, k("scan/reduce.py", "_read_weights")) +
                 _cumulative(stats, k("scan/reduce.py", "_weight_scores"))))
    rows.append(("tables and intervals (from the sums, once)", _cumulative(stats, k("scan/finish.py", "publish")) +
                 _cumulative(stats, k("scan/reduce.py", "_store"))))
    counted = sum(seconds for _, seconds in rows)
    rows.append(("other (tokenising, batching, progress)", max(total - counted, 0.0)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--corpus", default=None, help="default: EWT dev ($HEADSCAN_EWT or ../shared), else builtin")
    parser.add_argument("--limit", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--attention", default="eager", choices=("eager", "chunked"))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE / "experiments"))
    from _common import ewt_dev

    import headscan
    from headscan.corpus import read_corpus
    from headscan.scan import sweep_model

    source = args.corpus or ewt_dev()
    model = headscan.load_model(args.model, device="cpu")
    config = headscan.SweepConfig(device="cpu", batch_size=args.batch_size, attention=args.attention)
    sweep_model(model, read_corpus(source, limit=args.batch_size), config)  # warm-up: first-call costs
    corpus = read_corpus(source, limit=args.limit)
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    sweep_model(model, corpus, config)
    profiler.disable()
    wall = time.perf_counter() - started
    stats = pstats.Stats(profiler)
    total = _cumulative(stats, _key(stats, "scan/reduce.py", "sweep_model"))
    print(f"{model.name} over {len(corpus.segments)} segments of {source}, batch {args.batch_size}, "
          f"{args.attention} attention: {total:.1f} s profiled ({wall:.1f} s wall)\n")
    print("| stage | seconds | share |\n|---|---|---|")
    for name, seconds in stages(stats, total):
        if seconds >= 0.0005 * total:
            print(f"| {name} | {seconds:.2f} | {seconds / total:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
