#!/usr/bin/env python
"""The whole headscan sweep against a plain Hugging Face forward over the same batches, as a ratio.

For one model and the first N sentences of a corpus (default: minilm, 256 UD-EWT dev sentences), each
repetition times, one after another and in alternating order:

  hf_attn      Hugging Face eager forward of the model without its output head (BertModel / LlamaModel),
               output_attentions=True, under torch.inference_mode(): the least work that yields every
               layer's attention pattern;
  hf_full      the same with the output head (BertForMaskedLM / LlamaForCausalLM): what the bridge wraps;
  sweep        headscan.scan.sweep_model: tokenising, the bridge's hooked forward, every metric on every
               layer, bootstrap replicates, and building the tables.

Both HF baselines run over the very batches the sweep makes (same grouping, same padding). Prints medians
and the ratios sweep / hf_attn (the goal: 1.25 or lower) and sweep / hf_full.

    python benchmarks/sweep_vs_hf.py --corpus ../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu
    python benchmarks/sweep_vs_hf.py --model smollm2 --limit 128 --reps 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from headscan.corpus import batches, encode, read_corpus  # noqa: E402
from headscan.models import ALIASES, load_model
from headscan.models.specs import _quiet  # noqa: E402
from headscan import SweepConfig
from headscan.scan import sweep_model  # noqa: E402

EWT = Path(__file__).resolve().parents[2] / "shared/data/ud-english-ewt/en_ewt-ud-dev.conllu"


def hf_models(name: str):
    """Fresh Hugging Face copies (the bridge rewires its own): (with head, without head)."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    path = ALIASES[name].locate() if name in ALIASES else Path(name)
    with _quiet():
        if path.suffix == ".gguf":
            full = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, attn_implementation="eager")
        else:
            try:
                full = AutoModelForMaskedLM.from_pretrained(path, attn_implementation="eager")
            except ValueError:
                full = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    full.eval()
    return full, full.base_model


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--corpus", default=str(EWT))
    parser.add_argument("--limit", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    config = SweepConfig(device="cpu", batch_size=args.batch_size, max_len=args.max_len, limit=args.limit)
    corpus = read_corpus(args.corpus, limit=args.limit)
    model = load_model(args.model, device="cpu")
    full, headless = hf_models(args.model)
    encoded = encode(corpus, model, config.max_len)
    pad = model.special_token_ids["pad"] if model.special_token_ids["pad"] is not None else 0
    fixed = list(batches(encoded, config.batch_size, pad))

    def hf(forward):
        def run():
            with torch.inference_mode():
                for batch in fixed:
                    forward(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True)

        return run

    runs = {"hf_attn": hf(headless), "hf_full": hf(full), "sweep": lambda: sweep_model(model, corpus, config)}
    for run in runs.values():  # warm up every path once
        run()
    times = {name: [] for name in runs}
    for rep in range(args.reps):
        order = list(runs) if rep % 2 == 0 else list(reversed(runs))
        for name in order:
            times[name].append(timed(runs[name]))

    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"model={args.model} segments={len(corpus.segments)} tokens={encoded.n_tokens} batches={len(fixed)}x{config.batch_size} "
          f"threads={torch.get_num_threads()} reps={args.reps}")
    for name, value in median.items():
        print(f"  {name:8} median {value:7.3f} s   (all: {', '.join(f'{t:.3f}' for t in times[name])})")
    print(f"ratio sweep / hf_attn = {median['sweep'] / median['hf_attn']:.2f}   (goal <= 1.25)")
    print(f"ratio sweep / hf_full = {median['sweep'] / median['hf_full']:.2f}")


if __name__ == "__main__":
    main()
