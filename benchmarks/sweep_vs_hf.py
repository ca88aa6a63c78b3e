#!/usr/bin/env python
"""The whole headscan sweep against a plain Hugging Face forward over the same batches, as a ratio.

For one model and the first N sentences of a corpus (default: minilm, 256 UD-EWT dev sentences), each
repetition times, one after another and in alternating order:

  hf_attn      Hugging Face eager forward of the model without its output head (BertModel / LlamaModel),
               output_attentions=True, under torch.inference_mode(): the least work that yields every
               layer's attention pattern;
  hf_full      the same with the output head (BertForMaskedLM / LlamaForCausalLM): what the bridge wraps;
  hooks_only   the bridge's hooked forward as the sweep runs it (the sweep's own hook points: patterns, and
               with values the value hooks, plus head outputs and the final residual where dla is captured),
               each hook doing nothing: the floor no sweep through the bridge can go below;
  sweep        headscan.scan.sweep_model: tokenising, the bridge's hooked forward, every metric on every
               layer, bootstrap replicates, and building the tables.
  unscored     the same sweep with no metric computed (the layer scorer returns nothing, so every column is
               0 and its chance NaN): every hook, the value norms and head outputs, the bootstrap accumulation,
               the weights table and the intervals. The floor that faster metrics alone cannot go below.

Both HF baselines run over the very batches the sweep makes (same grouping, same padding). Prints medians
and the ratios sweep / hf_attn (the targets: 1.3 for minilm, 1.2 for smollm2, 1.1 with --no-values over
plain text; also paired, each repetition's sweep over its own hf_attn), unscored / hf_attn, hooks_only /
hf_attn and sweep / hf_full.

`--cpu-time` runs on one thread and times the process's CPU time instead of the wall clock: steadier on a
shared machine, where other jobs take the cores (one thread can shift the ratios a little against two).

`--plain` sweeps the same sentences as plain text (one per line, no syntax table); `--no-values` turns value
weighting and direct logit attribution off; `--composition off` leaves out the composition scores (their
random-matrix null is a fixed cost per model, whatever the corpus).

`benchmarks/previous.py` (`make benchmark-previous REV=...`) runs this script of two revisions side by side.

    python benchmarks/sweep_vs_hf.py --corpus ../shared/data/ud-english-ewt/en_ewt-ud-dev.conllu
    python benchmarks/sweep_vs_hf.py --model smollm2 --limit 128 --reps 2
    python benchmarks/sweep_vs_hf.py --plain --no-values
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from headscan import SweepConfig
from headscan.corpus import batches, encode, read_corpus  # noqa: E402
from headscan.models import ALIASES, load_model, pattern_forward
from headscan.models.hub import quiet  # noqa: E402
from headscan.scan import layers, reduce, sweep_model  # noqa: E402

EWT = Path(__file__).resolve().parents[2] / "shared/data/ud-english-ewt/en_ewt-ud-dev.conllu"


def hf_models(name: str):
    """Fresh Hugging Face copies (the bridge rewires its own): (with head, without head)."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    path = ALIASES[name].locate() if name in ALIASES else Path(name)
    with quiet():
        if path.suffix == ".gguf":
            full = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, attn_implementation="eager")
        else:
            try:
                full = AutoModelForMaskedLM.from_pretrained(path, attn_implementation="eager")
            except ValueError:
                full = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager")
    full.eval()
    return full, full.base_model


def timed(function, clock=time.perf_counter) -> float:
    """Seconds `function` takes by `clock` (wall time, or time.process_time under --cpu-time)."""
    start = clock()
    function()
    return clock() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--corpus", default=str(EWT))
    parser.add_argument("--limit", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--plain", action="store_true", help="the same sentences as plain text: no syntax table")
    parser.add_argument("--no-values", action="store_true", help="no value weighting and no dla")
    parser.add_argument("--cpu-time", action="store_true", help="one thread, timed by the process's CPU time")
    parser.add_argument("--composition", choices=("auto", "on", "off"), default="auto",
                        help="composition scores, as the sweep's --composition (default: auto, the sweep's)")
    args = parser.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    if args.cpu_time:
        torch.set_num_threads(1)

    config = SweepConfig(device="cpu", batch_size=args.batch_size, max_len=args.max_len, limit=args.limit,
                         values=not args.no_values, composition=args.composition)
    corpus = read_corpus(args.corpus, limit=args.limit)
    if args.plain:
        text = Path(tempfile.mkdtemp()) / "sentences.txt"
        text.write_text("".join(segment.text + "\n" for segment in corpus.segments), encoding="utf-8")
        corpus = read_corpus(str(text), limit=args.limit)
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

    # the very hook points the sweep attaches (values for value weighting; head outputs and the final residual
    # only where dla is captured: a causal model with a final norm), each doing nothing
    weights, unread = reduce.read_weights(model)
    sweep_hooks = layers.LayerHooks(model, config, [], layers.capture_for(model, config, weights, unread)[0], False)

    def hooks_only():
        def nothing(*args, **kwargs):
            return None

        internals = {kind: dict.fromkeys(by_layer, nothing) for kind, by_layer in sweep_hooks.internals().items()}
        with pattern_forward(model, dict.fromkeys(range(model.n_layers), nothing), internals=internals) as forward:
            for batch in fixed:
                forward(batch.input_ids, batch.attention_mask.bool())

    def unscored():
        score = layers._score
        layers._score = lambda *args, **kwargs: {}  # no metric, no chance: columns come out 0 and NaN
        try:
            sweep_model(model, corpus, config)
        finally:
            layers._score = score

    runs = {"hf_attn": hf(headless), "hf_full": hf(full), "hooks_only": hooks_only, "unscored": unscored,
            "sweep": lambda: sweep_model(model, corpus, config)}
    for run in runs.values():  # warm up every path once
        run()
    times = {name: [] for name in runs}
    for rep in range(args.reps):
        order = list(runs) if rep % 2 == 0 else list(reversed(runs))
        for name in order:
            times[name].append(timed(runs[name], clock))

    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"model={args.model} segments={len(corpus.segments)} tokens={encoded.n_tokens} batches={len(fixed)}x{config.batch_size} "
          f"corpus={corpus.kind} values={config.values} threads={torch.get_num_threads()} reps={args.reps} "
          f"clock={'cpu' if args.cpu_time else 'wall'}")
    for name, value in median.items():
        print(f"  {name:10} median {value:7.3f} s   (all: {', '.join(f'{t:.3f}' for t in times[name])})")
    # each repetition's own ratio, then their median and range: a slow spell of the machine slows both runs of
    # one repetition, so paired ratios spread less than the medians' ratio drifts from day to day
    paired = sorted(s / h for s, h in zip(times["sweep"], times["hf_attn"]))
    print(f"ratio sweep / hf_attn = {median['sweep'] / median['hf_attn']:.2f}   (paired by repetition: median "
          f"{statistics.median(paired):.2f}, range {paired[0]:.2f}-{paired[-1]:.2f})")
    print(f"ratio unscored / hf_attn = {median['unscored'] / median['hf_attn']:.2f}   (every metric free: the floor "
          f"for faster metrics)")
    print(f"ratio hooks_only / hf_attn = {median['hooks_only'] / median['hf_attn']:.2f}   (the bridge's floor)")
    print(f"ratio sweep / hf_full = {median['sweep'] / median['hf_full']:.2f}")


if __name__ == "__main__":
    main()
