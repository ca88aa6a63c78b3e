#!/usr/bin/env python
"""The composition null (`headscan.models.composition`): what it costs a sweep, and how many random pairs pass it.

For random-init models of GPT-2 small's shape (d_model 768, 12 heads of 64) and smollm2's (d_model 576, 9 query
heads of 64 over 3 key/value heads), Hugging Face's own initialisation, it prints

- the null's time in this process, cold (the Haar corners drawn) and warm (the corners cached), its draws and its
  99th percentile's bootstrap standard error;
- the pairs beyond that percentile over the three modes, with a 95% Clopper-Pearson interval (scipy). The pairs of
  one model share heads, so the count varies more than a binomial's: read the interval as a lower bound on the
  spread, and several seeds beside it.

Usage (one thread, so that a shared machine's load moves the times less):
  OMP_NUM_THREADS=1 python benchmarks/composition_null.py                     # 12 layers, seed 1
  OMP_NUM_THREADS=1 python benchmarks/composition_null.py --layers 4 --seeds 11 12 13
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import binomtest

from headscan.models import load_model
from headscan.models.composition import composition_null, composition_rows, composition_scores, composition_weights
from headscan.testing import build_architecture_checkpoint, build_tiny_checkpoint


def random_llama(folder: Path, *, n_layers: int, seed: int) -> Path:
    """smollm2's attention shape with Hugging Face's initialisation and the tiny llama's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    build_architecture_checkpoint(folder, "llama")
    config = LlamaConfig.from_pretrained(folder)
    config.update({"num_hidden_layers": n_layers, "num_attention_heads": 9, "num_key_value_heads": 3,
                   "hidden_size": 576, "head_dim": 64, "intermediate_size": 64})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        LlamaForCausalLM(config).eval().save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    args = parser.parse_args()
    for shape in ("gpt2", "smollm2"):
        for seed in args.seeds:
            folder = Path(tempfile.mkdtemp()) / shape
            if shape == "gpt2":
                build_tiny_checkpoint(folder, "gpt2", n_layers=args.layers, n_heads=12, d_model=768, seed=seed)
            else:
                random_llama(folder, n_layers=args.layers, seed=seed)
            matrices, _, d_residual = composition_weights(load_model(str(folder), device="cpu"))
            times = []
            for _ in range(2):  # cold, then warm
                started = time.perf_counter()
                null = composition_null(*matrices, d_residual)
                times.append(time.perf_counter() - started)
            scores = composition_scores(*matrices)
            rows = composition_rows(np.stack([scores[m].numpy() for m in "QKV"]), np.stack([null[m] for m in "QKV"]))
            beyond, pairs = int(rows["beyond"].sum()), len(rows)
            interval = binomtest(beyond, pairs).proportion_ci(0.95)
            print(f"{shape}-shaped, {args.layers} layers, seed {seed}: null {len(null['Q']):,} draws, "
                  f"{times[0]:.2f} s cold, {times[1]:.2f} s warm, 99th percentile SE {rows['null_se'].max():.2e}; "
                  f"beyond it {beyond} of {pairs:,} pairs = {beyond / pairs:.2%} "
                  f"[{interval.low:.2%}, {interval.high:.2%}]")


if __name__ == "__main__":
    main()
