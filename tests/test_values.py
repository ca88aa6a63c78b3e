"""Value-weighted attention and direct logit attribution: known answers, plain-loop references, completeness."""

import pytest
import torch

from headscan.metrics import AttentionBatch, values
from headscan.metrics.attention import first_token, prev_token
from headscan.models import weights as circuits
from headscan.testing import build_planted_checkpoint

SENTENCES = ["The cat sat on the mat.", "Dogs bark at night, and birds sing.", "It rained."]


def attention(pattern, mask, causal):
    """An AttentionBatch over right-padded segments, every real token counting."""
    tokens = torch.zeros(mask.shape, dtype=torch.long)
    return AttentionBatch(pattern, mask, mask, tokens, torch.zeros_like(mask), causal)


def padded(model, sentences):
    """(batch, k) right-padded ids and their mask, as a sweep feeds them."""
    rows = model.token_ids(sentences)
    n = max(map(len, rows))
    ids = torch.tensor([row + [0] * (n - len(row)) for row in rows])
    mask = torch.tensor([[i < len(row) for i in range(n)] for row in rows])
    return ids, mask


# --- the functions on synthetic input ----------------------------------------------------------------------


def test_value_norms_match_the_product_per_query_head_under_gqa():
    generator = torch.Generator().manual_seed(0)
    v = torch.randn(2, 5, 3, 4, generator=generator)  # (batch, k, kv_head, d_head)
    W_O = torch.randn(6, 4, 10, generator=generator)  # (head, d_head, d_model): heads 0-1 read kv 0, ...
    before = v.clone(), W_O.clone()
    norms = values.value_norms(v, W_O)
    expected = torch.stack([(v[:, :, h // 2].double() @ W_O[h].double()).norm(dim=-1) for h in range(6)], dim=1)
    assert norms.shape == (2, 6, 5)
    assert torch.allclose(norms.double(), expected, rtol=1e-5)
    assert torch.equal(v, before[0]) and torch.equal(W_O, before[1])


def test_value_weighted_rows_sum_to_one_zero_rows_stay_zero_and_inputs_are_untouched():
    generator = torch.Generator().manual_seed(1)
    pattern = torch.softmax(torch.randn(2, 3, 4, 4, generator=generator), -1)
    norms = torch.rand(2, 3, 4, generator=generator)
    norms[0, 1] = 0.0  # head 1 of segment 0 moves nothing
    before = pattern.clone(), norms.clone()
    weighted = values.value_weighted(pattern, norms)
    assert torch.allclose(weighted.sum(-1)[[1, 0, 0], [0, 0, 2]], torch.ones(3, 4))  # (batch, head) pairs: every row
    assert torch.equal(weighted[0, 1], torch.zeros(4, 4))
    assert torch.equal(pattern, before[0]) and torch.equal(norms, before[1])
    mask = torch.tensor([[True, True, True, False]] * 2)
    masked = values.value_weighted(pattern, norms, key_mask=mask)
    assert torch.equal(masked[..., 3], torch.zeros(2, 3, 4)) and torch.allclose(masked[1].sum(-1), torch.ones(3, 4))


def test_uniform_norms_leave_the_pattern_unchanged():
    pattern = torch.softmax(torch.randn(1, 2, 3, 3), -1)
    assert torch.allclose(values.value_weighted(pattern, torch.full((1, 2, 3), 7.0)), pattern, atol=1e-6)


# --- a planted previous-token head that moves nothing ------------------------------------------------------


@pytest.fixture(scope="module")
def planted_gpt2(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path, heads = build_planted_checkpoint(tmp_path_factory.mktemp("planted"), "gpt2", n_layers=1)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    return model, heads


def capture_layer0(hf_model, ids, mask):
    """Layer 0's pattern (batch, head, q, k) and value vectors (batch, k, head, d_head), from HF forward hooks."""
    seen = {}
    attn = hf_model.transformer.h[0].attn
    d_model, n_heads = hf_model.config.n_embd, hf_model.config.n_head

    def on_qkv(module, args, output):
        seen["v"] = output[..., 2 * d_model:].unflatten(-1, (n_heads, -1))  # (batch, k, head, d_head), bias included

    def on_attention(module, args, output):
        seen["pattern"] = output[1]

    handles = [attn.c_attn.register_forward_hook(on_qkv), attn.register_forward_hook(on_attention)]
    try:
        with torch.no_grad():
            hf_model(input_ids=ids, attention_mask=mask.long())
    finally:
        for handle in handles:
            handle.remove()
    return seen["pattern"], seen["v"]


def test_previous_token_head_without_value_weights_scores_zero_when_value_weighted(planted_gpt2):
    import copy

    model, heads = planted_gpt2
    layer, head = heads["prev_token"]
    ids = torch.randint(1, 900, (3, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(3, 12, dtype=torch.bool)
    mask[2, 9:] = False
    silenced = copy.deepcopy(model)
    d_model, d_head = model.config.n_embd, model.config.n_embd // model.config.n_head
    value_columns = slice(2 * d_model + head * d_head, 2 * d_model + (head + 1) * d_head)
    with torch.no_grad():
        silenced.transformer.h[0].attn.c_attn.weight[:, value_columns] = 0.0
        silenced.transformer.h[0].attn.c_attn.bias[value_columns] = 0.0
    W_O = model.transformer.h[0].attn.c_proj.weight.detach().reshape(model.config.n_head, d_head, d_model)

    pattern, v = capture_layer0(silenced, ids, mask)
    plain = prev_token(attention(pattern, mask, causal=True))
    weighted = prev_token(attention(values.value_weighted(pattern, values.value_norms(v, W_O), mask), mask, True))
    score = lambda pair: (pair[0].sum(0) / pair[1].sum(0))  # noqa: E731  (head,) over the batch
    assert score(plain)[head] > 0.999
    assert score(weighted)[head] == 0.0
    assert score(weighted)[heads["offset_-2"][1]] < 0.1  # other heads keep their own picture (q = 1 has no q - 2)

    # the same with the output weights zeroed instead, at the function level, on the unchanged model
    pattern, v = capture_layer0(model, ids, mask)
    no_output = W_O.clone()
    no_output[head] = 0.0
    weighted = prev_token(attention(values.value_weighted(pattern, values.value_norms(v, no_output), mask), mask, True))
    assert score(weighted)[head] == 0.0
    first = first_token(attention(values.value_weighted(pattern, values.value_norms(v, W_O), mask), mask, True))
    assert score(first)[heads["first_token"][1]] > 0.99  # a planted head with live weights keeps its score


# --- plain-loop reference from Hugging Face hidden states and weights --------------------------------------


def reference_body(name, model):
    """The Hugging Face model (without its head) to read hidden states and weights from.

    minilm: a fresh BertModel, since the bridge's original_model of a BERT does not reproduce the model when
    called on its own (its layers from 1 on differ; the bridge itself matches a fresh BertModel exactly).
    smollm2: the bridge's original_model, which does (and a second GGUF load would take a while).
    """
    if name == "minilm":
        from transformers import AutoModel

        from headscan.models import ALIASES

        return AutoModel.from_pretrained(ALIASES["minilm"].locate(), attn_implementation="eager").eval()
    return model.hf_model.model


def hf_value_weights(model, body, layer):
    """(kv_head, d_model, d_head) W_V, (kv_head, d_head) b_V, (head, d_head, d_model) W_O and the input norm,
    read straight from the Hugging Face modules (not through headscan.circuits)."""
    heads, kv, d = model.n_heads, model.n_kv_heads, model.d_model
    if hasattr(body, "encoder"):
        module = body.encoder.layer[layer].attention
        value, dense = module.self.value, module.output.dense
        norm = None  # post-norm: attention reads the hidden state as it is
    else:
        block = body.layers[layer]
        value, dense = block.self_attn.v_proj, block.self_attn.o_proj
        norm = block.input_layernorm
    W_V = value.weight.detach().double().T.reshape(d, kv, -1).transpose(0, 1)
    b_V = torch.zeros(kv, W_V.shape[-1], dtype=torch.float64) if value.bias is None else value.bias.detach().double().reshape(kv, -1)
    W_O = dense.weight.detach().double().T.reshape(heads, -1, d)
    return W_V, b_V, W_O, norm


def loop_reference(model, body, hidden, pattern, mask, layer):
    """Value norms and value-weighted attention, one head, key and query at a time, in float64."""
    W_V, b_V, W_O, norm = hf_value_weights(model, body, layer)
    group = model.n_heads // model.n_kv_heads
    batch, heads, n, _ = pattern.shape
    norms = torch.zeros(batch, heads, n, dtype=torch.float64)
    weighted = torch.zeros(batch, heads, n, n, dtype=torch.float64)
    for b in range(batch):
        real = int(mask[b].sum())
        x = hidden[b].double()
        if norm is not None:  # Llama's RMSNorm, by hand
            x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon) * norm.weight.detach().double()
        for h in range(heads):
            g = h // group
            for k in range(real):
                norms[b, h, k] = ((x[k] @ W_V[g] + b_V[g]) @ W_O[h]).norm()
            for q in range(real):
                row = pattern[b, h, q, :real].double() * norms[b, h, :real]  # ||A[q, k] f(x_k)|| for every key k
                weighted[b, h, q, :real] = row / row.sum()
    return norms, weighted


def sweep_like_capture(model, ids, mask, layers):
    """What the sweep's hooks would read on the bridge: hook_v and hook_pattern of each layer."""
    seen = {}

    def keep(layer, kind):
        def hook(tensor, hook):
            seen[layer, kind] = tensor.detach().clone()

        return hook

    hooks = [(f"blocks.{layer}.attn.hook_{kind}", keep(layer, kind)) for layer in layers for kind in ("v", "pattern")]
    with torch.no_grad(), model.bridge.hooks(fwd_hooks=hooks):
        model.bridge(ids, attention_mask=mask.long())
    return seen


@pytest.mark.real
@pytest.mark.parametrize("name", ["minilm", "smollm2"])
def test_value_weighted_metrics_match_a_plain_loop_from_hugging_face_states(name, request):
    model = request.getfixturevalue(name)
    ids, mask = padded(model, SENTENCES)
    layers = [0, model.n_layers // 2, model.n_layers - 1]
    seen = sweep_like_capture(model, ids, mask, layers)
    body = reference_body(name, model)
    with torch.no_grad():
        hidden = body(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True).hidden_states
    W_O = circuits.head_weights(model).W_O  # (layer, head, d_head, d_model)
    for layer in layers:
        pattern, v = seen[layer, "pattern"], seen[layer, "v"]  # hook_v: (batch, k, kv_head, d_head), b_V included
        norms = values.value_norms(v, W_O[layer])
        weighted = values.value_weighted(pattern, norms, mask)
        ref_norms, ref_weighted = loop_reference(model, body, hidden[layer], pattern, mask, layer)
        real = mask[:, None, :].expand_as(norms)
        assert torch.allclose(norms[real].double(), ref_norms[real], rtol=1e-5, atol=1e-5), (name, layer)
        both = (mask[:, None, :, None] & mask[:, None, None, :]).expand_as(weighted)
        assert torch.allclose(weighted[both].double(), ref_weighted[both], atol=1e-5), (name, layer)
        sums, counts = first_token(attention(weighted, mask, model.causal))
        ref = [sum(ref_weighted[b, h, q, 0].item() for b in range(len(SENTENCES)) for q in range(1, int(mask[b].sum())))
               for h in range(model.n_heads)]
        assert torch.allclose(sums.sum(0).double(), torch.tensor(ref, dtype=torch.float64), atol=1e-5 * counts.sum())


# --- direct logit attribution adds up to the logit ---------------------------------------------------------


@pytest.mark.real
def test_direct_logit_attributions_and_the_other_components_add_up_to_the_logit(smollm2):
    hf = smollm2.hf_model
    body = hf.model
    ids = torch.tensor([smollm2.token_ids(["The capital of France is Paris, and the capital of Spain is Madrid."])[0]])
    n_heads, n = smollm2.n_heads, ids.shape[1]
    parts, z = {"mlp": [], "attn": []}, []
    handles = [body.embed_tokens.register_forward_hook(lambda m, a, out: parts.setdefault("embed", out.detach())),
               body.norm.register_forward_pre_hook(lambda m, args: parts.setdefault("final", args[0].detach()))]
    for layer in body.layers:
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(
            lambda m, args: z.append(args[0].detach().reshape(1, n, n_heads, -1))))  # (batch, q, head, d_head)
        handles.append(layer.self_attn.o_proj.register_forward_hook(lambda m, a, out: parts["attn"].append(out.detach())))
        handles.append(layer.mlp.register_forward_hook(lambda m, a, out: parts["mlp"].append(out.detach())))
    try:
        with torch.no_grad():
            logits = hf(input_ids=ids).logits[0].double()  # (q, vocab)
    finally:
        for handle in handles:
            handle.remove()
    weights = circuits.head_weights(smollm2)
    directions = circuits.logit_directions(weights)  # (d_model, vocab)
    residual = parts["embed"] + sum(parts["attn"]) + sum(parts["mlp"])
    assert torch.allclose(residual, parts["final"], atol=1e-4)  # nothing else writes to the residual stream
    scale = values.final_norm_scale(parts["final"], kind=weights.final_norm, eps=weights.final_eps)  # (batch, q)
    targets, valid = values.next_token_targets(ids, torch.ones_like(ids, dtype=torch.bool), torch.ones_like(ids, dtype=torch.bool))
    centred = logits - logits.mean(-1, keepdim=True)
    for q in (0, 5, n - 2):
        only = torch.zeros_like(valid)
        only[0, q] = True
        heads = sum(values.direct_logit_attribution(z[layer], weights.W_O[layer], scale, directions, targets, only)[0][0]
                    for layer in range(smollm2.n_layers))  # (batch, head): each head's DLA at q
        others = parts["embed"] + sum(parts["mlp"]) + sum(weights.b_O)  # b_O: zeros for Llama
        rest = (others[0, q].double() @ directions[:, targets[0, q]].double()) / scale[0, q].double()
        total = heads.sum().double() + rest
        assert total.item() == pytest.approx(centred[q, targets[0, q]].item(), abs=1e-4)


@pytest.mark.real
@pytest.mark.filterwarnings("ignore:A forward hook edited hook_scale")  # it reads hook_scale, edits nothing
def test_sweep_hooks_give_the_same_attribution_as_module_hooks(smollm2):
    """hook_z per layer and the last block's hook_out: what the sweep reads, through the bridge."""
    ids = torch.tensor([smollm2.token_ids(SENTENCES[:1])[0]])
    last = smollm2.n_layers - 1
    seen = {}
    hooks = [(f"blocks.{layer}.attn.hook_z", lambda t, hook, layer=layer: seen.setdefault(layer, t.detach()))
             for layer in range(smollm2.n_layers)]
    hooks.append((f"blocks.{last}.hook_out", lambda t, hook: seen.setdefault("final", t.detach())))
    hooks.append(("ln_final.hook_scale", lambda t, hook: seen.setdefault("scale", t.detach())))
    with torch.no_grad(), smollm2.bridge.hooks(fwd_hooks=hooks):
        smollm2.bridge(ids)
    weights = circuits.head_weights(smollm2)
    scale = values.final_norm_scale(seen["final"], kind=weights.final_norm, eps=weights.final_eps)
    assert torch.allclose(scale, seen["scale"][..., 0], rtol=1e-5)
    assert seen[0].shape == (1, ids.shape[1], smollm2.n_heads, 64)  # z per query head under GQA
    targets, valid = values.next_token_targets(ids, torch.ones_like(ids, dtype=torch.bool), torch.ones_like(ids, dtype=torch.bool))
    directions = circuits.logit_directions(weights)
    (sums, counts), (positive, _) = values.direct_logit_attribution(seen[last], weights.W_O[last], scale, directions,
                                                                    targets, valid)
    assert counts[0, 0].item() == ids.shape[1] - 1 and torch.all((positive >= 0) & (positive <= counts))
    contributions = values.logit_contributions(seen[last], weights.W_O[last], directions, targets)  # (batch, head, q)
    assert torch.allclose(sums, (contributions / scale[:, None, :])[..., :-1].sum(-1), atol=1e-5)


def test_uniform_values_of_an_encoder_are_each_sequences_own_mean():
    """Bidirectional: every query's null-head output is the mean value over its own sequence's keys that count,
    a plain loop per sequence (two sequences of different lengths in one batch)."""
    v = torch.randn(2, 4, 1, 3, generator=torch.Generator().manual_seed(0))  # (batch, k, kv_head, d_head)
    mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
    got = values.uniform_values(v, mask, causal=False, n_heads=2)  # (batch, q, head, d_head)
    for b in range(2):
        mean = v[b, mask[b], 0].mean(0)  # (d_head,)
        for q in range(4):
            for h in range(2):
                torch.testing.assert_close(got[b, q, h], mean)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [0, 1, 3])
def test_uniform_values_under_a_sliding_window_are_the_mean_over_the_window(causal, window):
    """A sliding-window layer's null head averages the values of the keys that count within `window` of the
    query (and at or before it when causal): a plain loop per query, padding and a key that does not count."""
    v = torch.randn(2, 7, 2, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    mask = torch.tensor([[True, True, False, True, True, True, True], [True, True, True, True, True, False, False]])
    got = values.uniform_values(v, mask, causal=causal, n_heads=4, window=window)  # (batch, q, head, d_head)
    for b in range(2):
        for q in range(7):
            keys = [k for k in range(7) if mask[b, k] and abs(q - k) <= window and (not causal or k <= q)]
            for h in range(4):
                want = v[b, keys, h // 2].mean(0) if keys else torch.zeros(3, dtype=torch.float64)
                torch.testing.assert_close(got[b, q, h], want, rtol=0, atol=1e-12)


def test_value_norms_and_uniform_values_of_float64_inputs_stay_float64():
    """The docstrings' promise: float64 in, float64 out, to float64 precision against a plain loop."""
    generator = torch.Generator().manual_seed(1)
    v = torch.randn(1, 5, 2, 3, generator=generator, dtype=torch.float64)  # (batch, k, kv_head, d_head)
    W_O = torch.randn(4, 3, 6, generator=generator, dtype=torch.float64)  # (head, d_head, d_model)
    got = values.value_norms(v, W_O)  # (batch, head, k)
    assert got.dtype == torch.float64
    for head in range(4):
        for k in range(5):
            plain = torch.linalg.vector_norm(v[0, k, head // 2] @ W_O[head])
            assert abs(got[0, head, k].item() - plain.item()) < 1e-12
    mean = values.uniform_values(v, torch.ones(1, 5, dtype=torch.bool), causal=True, n_heads=4)  # (batch, q, head, d)
    assert mean.dtype == torch.float64
    torch.testing.assert_close(mean[0, 2, 3], v[0, :3, 1].mean(0), rtol=0, atol=1e-15)  # head 3 reads kv head 1


def test_direct_logit_attribution_of_random_weights_equals_a_plain_loop():
    """z_q^h W_O^h . d[:, t_{q+1}] / s_q, summed over the counted queries, and how often it is positive, one
    head and one query at a time."""
    generator = torch.Generator().manual_seed(0)
    batch, n_q, heads, d_head, d_model, vocab = 2, 5, 3, 4, 6, 11
    z = torch.randn(batch, n_q, heads, d_head, generator=generator, dtype=torch.float64)
    W_O = torch.randn(heads, d_head, d_model, generator=generator, dtype=torch.float64)
    W_U = torch.randn(d_model, vocab, generator=generator, dtype=torch.float64)
    scale = torch.rand(batch, n_q, generator=generator, dtype=torch.float64) + 0.5
    targets = torch.randint(0, vocab, (batch, n_q), generator=generator)
    mask = torch.rand(batch, n_q, generator=generator) > 0.3
    (sums, counts), (positive, _) = values.direct_logit_attribution(z, W_O, scale, W_U, targets, mask)
    for b in range(batch):
        for h in range(heads):
            terms = [float(z[b, q, h] @ W_O[h] @ W_U[:, targets[b, q]] / scale[b, q]) for q in range(n_q) if mask[b, q]]
            assert float(sums[b, h]) == pytest.approx(sum(terms), abs=1e-9)
            assert float(counts[b, h]) == len(terms) and float(positive[b, h]) == sum(t > 0 for t in terms)
