"""Long contexts: eager against chunked attention on smollm2, wall time and peak memory side by side.

Each (length, mode) runs in a fresh subprocess, which loads smollm2, runs one forward pass of one segment of
that many tokens (the builtin corpus, repeated) with every layer hooked and every heads/offsets/positions
metric computed on every layer, as a sweep does, and reports the seconds of that forward pass and its peak
memory: on CPU the process's peak resident set (``VmHWM``, reset to the current size just before the pass through
``/proc/self/clear_refs``, so loading never counts), both in all and above what the process held before the
pass; on a GPU ``torch.cuda.max_memory_allocated``. Eager runs whose estimated attention
memory (`headscan.scan.budget.eager_bytes`) would push the machine past ``--memory-limit`` GiB are skipped with
the reason printed, rather than run into the out-of-memory killer.

``--task retrieval`` runs one retrieval trial instead (`headscan retrieval`): a prefill of the prompt and 10 greedy
steps reading each step's attention rows, headscan's chunked decoding (the prompt prefilled in pieces of
`headscan.models.decode.PREFILL_CHUNK` tokens) against Wu et al.'s loop (Hugging Face's eager attention, one
prefill pass, ``output_attentions`` at each step). Its checksum, the sum over steps, layers and heads of the
most-attended key's index, is printed for both and must agree, so the memory ratio compares runs that computed
the same thing.

``--query-chunk`` defaults to each task's own default (`SweepConfig.query_chunk`, `RetrievalConfig.query_chunk`).

Run it (about 15 minutes on 2 CPU cores for the default lengths; smollm2 must be installed)::

    .venv/bin/python benchmarks/long_context.py                       # 1k, 2k, 4k, 8k
    .venv/bin/python benchmarks/long_context.py --task retrieval      # the same lengths, one retrieval trial
    .venv/bin/python benchmarks/long_context.py --child chunked 8192 --task retrieval   # one mode, one length
    .venv/bin/python benchmarks/long_context.py --lengths 1024 16384 32768 --query-chunk 256
    .venv/bin/python benchmarks/long_context.py --device cuda          # where a GPU is present

Goal on a CPU: at 8k tokens chunked needs at most a tenth of eager's peak memory above the loaded model
(the last lines say, per length, whether it does) and at most 1.3x its time, and chunked runs at lengths
where eager cannot.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GOAL = 0.1  # chunked's extra memory over eager's


def _status_mib(field: str) -> float | None:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def reset_peak() -> float:
    """The resident set now, in MiB, after resetting the peak to it where Linux allows (``clear_refs`` 5): the peak
    read by `peak` then counts only what follows, not the loading of a model that was freed since."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:  # not Linux, or not allowed: the peak since the start (ru_maxrss) is the best there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return _status_mib("VmRSS")


def peak() -> float:
    """The peak resident set in MiB since `reset_peak` (or since the start where it could not reset)."""
    hwm = _status_mib("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(length: int, mode: str, query_chunk: int | None, device: str) -> dict:
    import torch

    from headscan.corpus import read_corpus
    from headscan.metrics import METRICS, AttentionBatch
    from headscan.models import load_model, pattern_forward
    from headscan.models.hooks import QueryBlock

    torch.manual_seed(0)
    model = load_model("smollm2", device=device)
    text = " ".join(segment.text for segment in read_corpus("builtin").segments)
    ids = model.token_ids([text])[0]
    ids = (ids * (length // len(ids) + 1))[:length]
    input_ids = torch.tensor([ids], device=model.device)
    mask = torch.ones_like(input_ids)
    # the pattern metrics (syntax needs words; moved, dla and retrieval read what this pass does not capture)
    metrics = [m for m in METRICS.values() if m.table not in ("syntax", "importance") and not m.needs]
    totals = {}
    now = {}  # the input of the pass under way

    def hook_for(layer):
        def hook(pattern, hook):
            start = hook.start if isinstance(hook, QueryBlock) else 0
            stop = start + pattern.shape[-2]
            real = now["real"]
            batch = AttentionBatch(pattern.float(), real[:, start:stop], real, now["ids"], torch.zeros_like(real),
                                   model.causal, 8, query_start=start, max_len=length)
            for metric in metrics:
                sums, counts = metric.function(batch)
                totals[(layer, metric.name)] = totals.get((layer, metric.name), 0) + sums.double().sum()

        return hook

    hooks = {layer: hook_for(layer) for layer in range(model.n_layers)}
    kwargs = {"attention": mode, "query_chunk": query_chunk}
    now.update(ids=input_ids[:, :64], real=mask[:, :64].bool())
    with pattern_forward(model, hooks, **kwargs) as forward:  # warm up on a short input (and run the probe)
        forward(input_ids[:, :64], mask[:, :64])
    now.update(ids=input_ids, real=mask.bool())
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    before_rss = reset_peak()
    started = time.perf_counter()
    with pattern_forward(model, hooks, **kwargs) as forward:
        forward(input_ids, mask)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    peak_rss = peak()
    result = {"length": length, "mode": mode, "seconds": seconds, "peak_mib": peak_rss,
              "extra_mib": peak_rss - before_rss, "checksum": float(sum(totals.values()))}
    if device.startswith("cuda"):
        result["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
        result["extra_mib"] = (torch.cuda.max_memory_allocated() - before) / 2**20
    return result


def retrieval_child(length: int, mode: str, query_chunk: int, device: str, steps: int = 10) -> dict:
    """One retrieval trial's decoding, as ``headscan retrieval`` runs it (chunked: `greedy_decode`, the prefill in
    blocks of queries and one row per step) or as Wu et al.'s code does (eager: Hugging Face's eager attention for
    the prefill, ``output_attentions`` at each step), `steps` greedy steps after a prompt of `length` tokens."""
    import gc

    import torch

    from headscan.corpus import read_corpus
    from headscan.models import load_model
    from headscan.models.decode import PREFILL_CHUNK, greedy_decode

    model = load_model("smollm2", device=device)
    text = " ".join(segment.text for segment in read_corpus("builtin").segments)
    ids = model.token_ids([text])[0]
    ids = (ids * (length // len(ids) + 1))[:length]
    tops = []
    lm = None
    if mode == "eager":  # Wu et al.'s setting: the plain Hugging Face model, eager attention
        from transformers import AutoModelForCausalLM

        from headscan.models import ALIASES

        path = ALIASES["smollm2"].locate()
        lm = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, attn_implementation="eager")
        lm = lm.to(device).eval()
        del model

    def keep(step):
        tops.append([int(step.rows[layer][0, :, 0].argmax(-1).sum()) for layer in range(model.n_layers)])

    def eager():
        from transformers import DynamicCache

        with torch.inference_mode():
            cache = DynamicCache(config=lm.config)
            lm(input_ids=torch.tensor([ids[:-1]], device=device), cache=cache, use_cache=True, logits_to_keep=1)
            fed = torch.tensor([ids[-1:]], device=device)
            for _ in range(steps):
                out = lm(input_ids=fed, cache=cache, use_cache=True, output_attentions=True, logits_to_keep=1)
                tops.append([int(a[0, :, -1].argmax(-1).sum()) for a in out.attentions])
                fed = out.logits[:, -1:].argmax(-1)

    warm = ids[:64]
    if mode == "chunked":
        greedy_decode(model, warm, lambda step: None, max_new_tokens=1, stop=lambda t: False, query_chunk=query_chunk)
    gc.collect()  # the eager side freed headscan's copy of the model: it must not count as the pass's
    before_rss = reset_peak()
    started = time.perf_counter()
    if mode == "chunked":
        greedy_decode(model, ids, keep, max_new_tokens=steps, stop=lambda t: False, query_chunk=query_chunk)
    else:
        eager()
    seconds = time.perf_counter() - started
    peak_rss = peak()
    result = {"length": length, "mode": mode, "seconds": seconds, "peak_mib": peak_rss,
              "extra_mib": peak_rss - before_rss, "checksum": int(sum(map(sum, tops))), "steps": len(tops)}
    if mode == "chunked":
        result.update(query_chunk=query_chunk, prefill_chunk=PREFILL_CHUNK)
    return result


def run(length: int, mode: str, query_chunk: int | None, device: str, timeout: float, task: str = "sweep") -> dict:
    command = [sys.executable, __file__, "--child", mode, str(length), "--device", device, "--task", task]
    if query_chunk is not None:  # None: the sweep's blocks sized by bytes (headscan.models.chunked.block_rows)
        command += ["--query-chunk", str(query_chunk)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=os.path.dirname(HERE))
    except subprocess.TimeoutExpired:
        return {"length": length, "mode": mode, "skipped": f"over {timeout:.0f} s"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["killed"])[-1]
        return {"length": length, "mode": mode, "skipped": f"failed ({done.returncode}): {last[:100]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--query-chunk", type=int, default=None,
                        help="queries per block in chunked mode (default: the task's own default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--memory-limit", type=float, default=20.0, help="GiB an eager run may be expected to take")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--task", choices=("sweep", "retrieval"), default="sweep",
                        help="sweep: one forward pass with every metric; retrieval: one retrieval trial's prefill and "
                             "10 greedy steps, headscan's chunked decoding against Wu et al.'s eager loop")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.query_chunk is None:
        from headscan.config import SweepConfig
        from headscan.retrieval_config import RetrievalConfig

        args.query_chunk = (RetrievalConfig if args.task == "retrieval" else SweepConfig).query_chunk
    if args.child:
        mode, length = args.child
        work = retrieval_child if args.task == "retrieval" else child
        print(json.dumps(work(int(length), mode, args.query_chunk, args.device)))
        return

    from headscan.scan.budget import eager_bytes

    n_heads, model_gib = 9, 1.0  # smollm2: 9 query heads a layer; about 1 GiB resident once loaded
    rows = []
    print(f"smollm2 on {args.device}, " + ("one segment per forward pass, every layer and metric" if args.task ==
          "sweep" else "one retrieval trial: prefill and 10 greedy steps") + f", query_chunk {args.query_chunk}",
          flush=True)
    for length in args.lengths:
        results = {}
        for mode in ("eager", "chunked"):
            needed = eager_bytes(n_heads, 1, length) / 2**30 + model_gib
            if mode == "eager" and args.device == "cpu" and needed > args.memory_limit:
                results[mode] = {"length": length, "mode": mode,
                                 "skipped": f"needs about {needed:.0f} GiB > --memory-limit {args.memory_limit:g}"}
            else:
                results[mode] = run(length, mode, args.query_chunk, args.device, args.timeout, args.task)
            print(f"  {length} {mode}: {results[mode]}", file=sys.stderr, flush=True)
        rows.append(results)
    print()
    print(f"{'tokens':>7} {'mode':>8} {'seconds':>9} {'peak MiB':>9} {'extra MiB':>10} {'time x':>7} {'extra x':>8}")
    for results in rows:
        eager = results["eager"]
        for mode in ("eager", "chunked"):
            r = results[mode]
            if "skipped" in r:
                print(f"{r['length']:>7} {mode:>8}   skipped: {r['skipped']}")
                continue
            ratios = ""
            if mode == "chunked" and "skipped" not in eager:
                ratios = f"{r['seconds'] / eager['seconds']:>7.2f} {r['extra_mib'] / max(eager['extra_mib'], 1):>8.3f}"
            print(f"{r['length']:>7} {mode:>8} {r['seconds']:>9.1f} {r['peak_mib']:>9.0f} {r['extra_mib']:>10.0f} {ratios}")
    print("\ntime x, extra x: chunked over eager (extra: peak memory above the loaded model, in the " +
          ("forward pass)" if args.task == "sweep" else "prefill and decoding)"))
    for results in rows:
        eager, chunked = results["eager"], results["chunked"]
        if "skipped" in eager or "skipped" in chunked:
            continue
        ratio = chunked["extra_mib"] / max(eager["extra_mib"], 1)
        verdict = "within" if ratio <= GOAL else "NOT within"
        same = "the same" if math.isclose(eager["checksum"], chunked["checksum"], rel_tol=1e-6) else "DIFFERENT"
        print(f"{eager['length']} tokens: chunked {chunked['extra_mib']:.0f} MiB, eager {eager['extra_mib']:.0f} MiB "
              f"above the loaded model: {ratio:.3f}, {verdict} a tenth of eager's; checksums {same} "
              f"(eager {eager['checksum']}, chunked {chunked['checksum']})")


if __name__ == "__main__":
    main()
