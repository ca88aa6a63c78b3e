"""Chunked attention equals eager attention: the blocks against a direct softmax, every metric's block sums
against its whole-pattern sums, and whole models (minilm, smollm2, tiny GPT-2, planted checkpoints) run both ways
with padding, batch 3 and chunk sizes that do not divide the sequence length."""

import numpy as np
import pytest
import torch
from test_metrics import make_batch

from headscan.errors import ModelLoadError
from headscan.metrics import METRICS, AttentionBatch, buckets
from headscan.models import chunked, chunked_refusal, pattern_forward
from headscan.models.hooks import QueryBlock
from headscan.scan import budget

CHUNKS = [1, 5, 7, 1000]  # 5 and 7 divide none of the lengths below; 1000 is one block
SCORED = [m for m in METRICS.values() if m.table not in ("syntax", "importance") and not m.needs]  # syntax needs CoNLL-U words; moved and dla
# need captured internals (their chunked == eager tests are in test_value_sweep.py)
TEXTS = ["The quick brown fox jumps over the lazy dog, and the dog sleeps on.",
         "A short one.",
         "Colourless green ideas sleep furiously; the ideas sleep."]


# --- one layer's attention, block by block -----------------------------------------------------------------


def eager_reference(query, key, mask, scaling, causal, softcap=None):
    group = query.shape[1] // key.shape[1]
    scores = query.double() @ key.double().repeat_interleave(group, 1).transpose(-1, -2) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    n_q, n_k = scores.shape[-2:]
    if mask is None and causal:
        mask = torch.ones(n_q, n_k, dtype=torch.bool).tril()
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask
    return scores.softmax(-1)


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("kv_heads, softcap, masking", [(4, None, "none-causal"), (2, None, "bool"), (1, 30.0, "float"),
                                                        (4, None, "none-full"), (2, 5.0, "bool")])
def test_blocks_equal_a_direct_softmax(chunk, kv_heads, softcap, masking):
    torch.manual_seed(chunk)
    query, key = torch.randn(3, 4, 13, 8) * 2, torch.randn(3, kv_heads, 13, 8) * 2
    lengths = torch.tensor([13, 9, 4])
    real = torch.arange(13)[None, :] < lengths[:, None]  # (batch, k)
    causal = masking != "none-full"
    mask = None
    if masking == "bool":
        mask = (real[:, None, None, :] & torch.ones(13, 13, dtype=torch.bool).tril())  # (batch, 1, q, k)
    elif masking == "float":
        mask = torch.where(real[:, None, None, :], 0.0, torch.finfo(torch.float32).min).expand(3, 1, 13, 13)
    blocks = list(chunked.attention_blocks(query, key, mask, scaling=8 ** -0.5, causal=causal, chunk=chunk,
                                           softcap=softcap))
    assert [(start, stop) for start, stop, _ in blocks] == [(s, min(s + chunk, 13)) for s in range(0, 13, chunk)]
    got = torch.cat([w for _, _, w in blocks], -2)
    want = eager_reference(query, key, mask, 8 ** -0.5, causal, softcap)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)


# --- every metric over blocks of queries -------------------------------------------------------------------


def block_sums(batch: AttentionBatch, metric, chunk: int, max_len=None):
    """A metric's (sums, counts) added up over blocks of `chunk` queries, as a chunked sweep adds them."""
    n = batch.pattern.shape[-2]
    sums = counts = 0
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        block = AttentionBatch(batch.pattern[:, :, start:stop], batch.query_mask[:, start:stop], batch.key_mask,
                               batch.tokens, batch.sep_mask, batch.causal, batch.max_offset, query_start=start,
                               max_len=max_len)
        s, c = metric.function(block)
        sums, counts = sums + s, counts + c
    return sums, counts


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("causal", [False, True])
def test_metric_block_sums_equal_whole_pattern_sums(chunk, causal):
    batch = make_batch([11, 4, 1, 9], n_heads=3, causal=causal, seed=chunk, sep_id=2, max_offset=3)
    whole = AttentionBatch(batch.pattern, batch.query_mask, batch.key_mask, batch.tokens, batch.sep_mask, causal, 3,
                           max_len=16)
    for metric in SCORED:
        want = metric.function(whole)
        got = block_sums(whole, metric, chunk, max_len=16)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10, msg=metric.name)


def test_position_buckets_add_up_to_their_metric():
    batch = make_batch([11, 6, 9], n_heads=2, causal=True, seed=4)
    whole = AttentionBatch(batch.pattern, batch.query_mask, batch.key_mask, batch.tokens, batch.sep_mask, True, 3,
                           max_len=11)
    on_first = (batch.pattern[..., 0] * torch.arange(11)).sum(-1)  # (batch, head): sum_q A[q, 0] |q - 0|
    for by_position, metric, less in (("first_token_by_position", "first_token", 0.0),
                                      ("distance_by_position", "distance", on_first)):
        sums, counts = METRICS[by_position].function(whole)
        assert sums.shape == (3, 2, len(buckets(11)))
        want_sums, want_counts = METRICS[metric].function(whole)
        torch.testing.assert_close(sums.sum(-1), want_sums - less)  # distance_by_position leaves the first token out
        torch.testing.assert_close(counts.sum(-1), want_counts)
    # bucket 4 holds positions 4..7: the mean distance of those queries past the first token, by hand for
    # segment 0, head 0
    sums, counts = METRICS["distance_by_position"].function(whole)
    pattern = batch.pattern[0, 0]
    by_hand = sum(float((pattern[q, 1:] * (q - torch.arange(1, 11)).abs()).sum()) for q in range(4, 8))
    assert counts[0, 0, 3] == 4 and sums[0, 0, 3].item() == pytest.approx(by_hand)


# --- whole models, eager against chunked -------------------------------------------------------------------


def padded(model, texts):
    ids = model.token_ids(texts)
    n = max(map(len, ids))
    pad = model.special_token_ids["pad"] or 0
    input_ids = torch.tensor([row + [pad] * (n - len(row)) for row in ids])
    mask = torch.tensor([[1] * len(row) + [0] * (n - len(row)) for row in ids])
    return input_ids, mask


def scores(model, texts, layers, attention, query_chunk=512):
    """{(layer, metric): (sums, counts)} over the batch, as a sweep would add them up."""
    input_ids, mask = padded(model, texts)
    real = mask.bool()
    sep = model.special_token_ids["sep"]
    sep_mask = input_ids == sep if sep is not None else torch.zeros_like(real)
    totals = {}

    def hook_for(layer):
        def hook(pattern, hook):
            start = hook.start if isinstance(hook, QueryBlock) else 0
            stop = start + pattern.shape[-2]
            batch = AttentionBatch(pattern.float(), real[:, start:stop], real, input_ids, sep_mask, model.causal, 4,
                                   query_start=start, max_len=input_ids.shape[1])
            for metric in SCORED:
                s, c = metric.function(batch)
                old = totals.get((layer, metric.name), (0, 0))
                totals[(layer, metric.name)] = (old[0] + s.double(), old[1] + c.double())

        return hook

    with pattern_forward(model, {layer: hook_for(layer) for layer in layers}, attention=attention,
                               query_chunk=query_chunk) as forward:
        forward(input_ids, mask)
    return totals


def assert_same_scores(model, layers, chunks=CHUNKS):
    assert chunked_refusal(model) is None
    eager = scores(model, TEXTS, layers, "eager")
    assert len(eager) == len(layers) * len(SCORED)
    for chunk in chunks:
        got = scores(model, TEXTS, layers, "chunked", chunk)
        assert got.keys() == eager.keys()
        for key, (want_sums, want_counts) in eager.items():
            np.testing.assert_allclose(got[key][0].numpy(), want_sums.numpy(), rtol=1e-5, atol=1e-5,
                                       err_msg=f"{model.name} chunk {chunk} layer {key[0]} {key[1]}")
            np.testing.assert_array_equal(got[key][1].numpy(), want_counts.numpy())


def test_tiny_gpt2_chunked_equals_eager(tiny_models):
    assert_same_scores(tiny_models["gpt2"], [0, 1])


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_planted_chunked_equals_eager(arch, tmp_path):
    from headscan.models import load_model
    from headscan.testing import build_planted_checkpoint

    folder, _ = build_planted_checkpoint(tmp_path, arch)
    assert_same_scores(load_model(str(folder)), [0, 1])


def test_minilm_chunked_equals_eager(minilm):
    assert_same_scores(minilm, list(range(minilm.n_layers)), chunks=[1, 7, 1000])


def test_smollm2_chunked_equals_eager(smollm2):
    # every layer runs chunked (each feeds the next); a few are scored, the first and last among them
    assert_same_scores(smollm2, [0, 1, 17, smollm2.n_layers - 1], chunks=[7, 1000])


# --- the forward pass itself ---------------------------------------------------------------------------------


def test_blocks_tile_the_queries_in_order_and_eager_is_untouched(tiny_models):
    model = tiny_models["gpt2"]
    input_ids, mask = padded(model, TEXTS)
    seen, eager = [], {}

    def record(pattern, hook):
        seen.append((hook, tuple(pattern.shape)))

    def keep(pattern, hook):
        eager.setdefault(len(eager), pattern.clone())

    with pattern_forward(model, {0: keep}) as forward:
        forward(input_ids, mask)
    with pattern_forward(model, {1: record}, attention="chunked", query_chunk=5) as forward:
        forward(input_ids, mask)
    n = input_ids.shape[1]
    assert [where for where, _ in seen] == [QueryBlock(1, s, min(s + 5, n), n) for s in range(0, n, 5)]
    assert all(shape == (3, model.n_heads, where.size, n) for where, shape in seen)
    with pattern_forward(model, {0: keep}) as forward:  # eager mode is restored after a chunked pass
        forward(input_ids, mask)
    torch.testing.assert_close(eager[0], eager[1], atol=0, rtol=0)



@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_chunked_passes_run_the_bridges_norms_as_eager_passes_do(tiny_models, arch):
    # TransformerLens' norms compute statistics for hook points nobody hooks; both modes skip that (a tenth of a
    # small model's forward), and put the norms back after the pass
    from transformer_lens.model_bridge.generalized_components.normalization import NormalizationBridge

    model = tiny_models[arch]
    if model.path != "transformer_lens":
        pytest.skip(f"{arch} is not hooked through the bridge")
    norms = [m for m in model.bridge.modules() if isinstance(m, NormalizationBridge)]
    input_ids, mask = padded(model, TEXTS[:2])
    replaced = {}

    def count(mode):
        def hook(pattern, hook):
            replaced.setdefault(mode, sum("forward" in vars(norm) for norm in norms))
        return hook

    for mode in ("eager", "chunked"):
        with pattern_forward(model, {1: count(mode)}, attention=mode) as forward:
            forward(input_ids, mask)
    assert replaced["chunked"] == replaced["eager"]
    assert replaced["eager"] > 0 or arch == "gpt2"  # TransformerLens runs GPT-2's norms on its python path: kept
    assert not any("forward" in vars(norm) for norm in norms)

def test_blocks_without_a_query_chunk_are_sized_by_bytes(tiny_models, monkeypatch):
    """query_chunk=None: as few blocks as keep each one's float32 weights within BLOCK_BYTES (at least MIN_BLOCK
    rows), of about equal size, counted by hand here; a whole layer when it fits."""
    model = tiny_models["gpt2"]
    input_ids, mask = padded(model, TEXTS[:3])
    n = input_ids.shape[1]
    row = 4 * 3 * model.n_heads * n  # bytes of one query row of weights: float32, (batch, head, 1, k)
    three = -(-n // -(-n // 3))  # at most 3 rows a block, spread evenly: n // 3 rounded up blocks
    four = -(-n // -(-n // 4))
    assert n > 4 and three <= 3 and four <= 4
    for block_bytes, minimum, rows in ((row * 3, 1, three), (row * 3, 4, four), (row * n * 2, 1, n)):
        monkeypatch.setattr(chunked, "BLOCK_BYTES", block_bytes)
        monkeypatch.setattr(chunked, "MIN_BLOCK", minimum)
        seen = []
        with pattern_forward(model, {1: lambda pattern, hook: seen.append(hook)}, attention="chunked") as forward:
            forward(input_ids, mask)
        assert seen == [QueryBlock(1, s, min(s + rows, n), n) for s in range(0, n, rows)], (block_bytes, minimum)


def test_internals_hand_over_values_and_head_outputs(smollm2):
    model = smollm2
    input_ids, mask = padded(model, TEXTS[:2])
    got = {}
    internals = {"v": {2: lambda v, layer: got.setdefault("v", v.clone())},
                 "z": {2: lambda z, layer: got.setdefault("z", z.clone())}}
    with pattern_forward(model, {}, attention="chunked", query_chunk=4, internals=internals) as forward:
        forward(input_ids, mask)
    d_head = model.d_model // model.n_heads
    assert got["v"].shape == (2, input_ids.shape[1], model.n_kv_heads, d_head)
    assert got["z"].shape == (2, input_ids.shape[1], model.n_heads, d_head)
    eager = {}
    internals = {"v": {2: lambda v, layer: eager.setdefault("v", v.clone())},
                 "z": {2: lambda z, layer: eager.setdefault("z", z.clone())}}
    with pattern_forward(model, {}, internals=internals) as forward:  # eager, on the bridge: the same tensors
        forward(input_ids, mask)
    real = mask[:, :, None, None]
    for kind in ("v", "z"):
        torch.testing.assert_close(eager[kind] * real, got[kind] * real, atol=1e-5, rtol=1e-5)


def test_a_model_whose_scores_cannot_be_reproduced_is_refused(tmp_path):
    from headscan.models import load_model
    from headscan.testing import build_architecture_checkpoint

    model = load_model(str(build_architecture_checkpoint(tmp_path, "bloom")))
    assert "ALiBi" in chunked_refusal(model)
    with (pytest.raises(ModelLoadError, match=r"cannot run chunked attention: .*ALiBi.*; use --attention eager"),
          pattern_forward(model, {0: lambda pattern, hook: None}, attention="chunked")):
        pass
    assert budget.choose(model, batch_size=64, max_len=100_000, budget_mib=1) == "eager"  # auto falls back


def test_auto_goes_chunked_past_the_budget(tiny_models):
    model = tiny_models["gpt2"]
    assert budget.eager_bytes(model.n_heads, 2, 1024) > budget.chunked_bytes(model.n_heads, 2, 1024, 128)
    assert budget.choose(model, batch_size=2, max_len=64, budget_mib=1) == "eager"
    assert budget.choose(model, batch_size=2, max_len=4096, budget_mib=1) == "chunked"
    assert budget.choose(model, batch_size=2, max_len=4096, attention="eager") == "eager"
    assert budget.default_budget_mib("cpu") >= 1


# --- the attention function itself, against a direct softmax ---------------------------------------------------


class _Attention(torch.nn.Module):
    is_causal = True  # as a decoder's attention module says


def _direct(query, key, value, causal_offset=None):
    """softmax(q k^T / sqrt(d)) v with an optional causal mask where query i sits at position offset + i."""
    scores = query @ key.transpose(-1, -2) / query.shape[-1] ** 0.5  # (batch, head, q, k)
    if causal_offset is not None:
        q_pos = torch.arange(query.shape[2])[:, None] + causal_offset
        scores = scores.masked_fill(torch.arange(key.shape[2])[None, :] > q_pos, float("-inf"))
    return (scores.softmax(-1) @ value).transpose(1, 2)  # (batch, q, head, d_head)


def _session(cache=False):
    return chunked._Session(hooks={}, internals={}, query_chunk=2, last=None, cache=cache)


def test_the_attention_function_follows_is_causal_and_a_cache():
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 4, generator=generator) for n in (5, 5, 5))
    module = _Attention()
    chunked._SESSIONS.append(_session())
    try:
        causal, _ = chunked._attention(module, q, k, v, None)
        full, _ = chunked._attention(module, q, k, v, None, is_causal=False)  # the call overrides the module
        with pytest.raises(chunked.Unsupported, match="differ in length"):  # cross-attention, no cache
            chunked._attention(module, q[:, :, :2], k, v, None)
    finally:
        chunked._SESSIONS.pop()
    torch.testing.assert_close(causal, _direct(q, k, v, causal_offset=0))
    torch.testing.assert_close(full, _direct(q, k, v))
    chunked._SESSIONS.append(_session(cache=True))
    try:  # decoding: the last two positions' queries against every cached key
        last, _ = chunked._attention(module, q[:, :, 3:], k, v, None)
    finally:
        chunked._SESSIONS.pop()
    torch.testing.assert_close(last, _direct(q[:, :, 3:], k, v, causal_offset=3))


def test_models_whose_attention_skips_transformers_functions_are_refused_on_the_hooks_path():
    from types import SimpleNamespace

    from transformers import GPT2Config

    hf_model = SimpleNamespace(config=GPT2Config(), _supports_attention_backend=False)
    assert "attention functions" in chunked.static_refusal(SimpleNamespace(hf_model=hf_model, path="hf_hooks"))
    assert chunked.static_refusal(SimpleNamespace(hf_model=hf_model, path="transformer_lens")) is None


@pytest.mark.parametrize("name", ["gemma2", "modernbert"])
def test_sliding_window_models_sweep_chunked_as_eager(name, tmp_path):
    """Gemma 2 (a causal window on layer 0, none on layer 1: layers of two windows in one batch) and ModernBERT (a
    window on both sides): blocks of 3 queries give eager's values and chance levels, whose null heads see only
    the window."""
    from headscan import SweepConfig
    from headscan.corpus import Corpus, Segment
    from headscan.models import load_model
    from headscan.scan import sweep_model
    from headscan.testing import build_architecture_checkpoint

    model = load_model(str(build_architecture_checkpoint(tmp_path, name)), device="cpu")
    assert any(window is not None for window in model.windows)
    corpus = Corpus("t", "text", "", tuple(Segment(text, i + 1) for i, text in enumerate(TEXTS)))
    eager = sweep_model(model, corpus, SweepConfig(device="cpu", batch_size=2, bootstrap=0, attention="eager"))
    chunked = sweep_model(model, corpus, SweepConfig(device="cpu", batch_size=2, bootstrap=0, attention="chunked",
                                                     query_chunk=3))
    for table in ("heads", "value"):
        for column in ("value", "chance"):
            np.testing.assert_allclose(chunked.frames[table][column].to_numpy(float),
                                       eager.frames[table][column].to_numpy(float), rtol=1e-6, atol=1e-6,
                                       err_msg=f"{table} {column}")
