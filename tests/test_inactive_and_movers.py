"""Inactive heads (output_norm, sink_ratio) and the attended-token logit effect (attended_logit): the functions on
synthetic tensors against plain loops, a tiny GPT-2's sweep against a plain loop over Hugging Face's own modules,
planted heads (a mover, a suppressor, a silenced head) found first and beyond their null, and the report's
sentence joining quiet heads to their ablation."""

import math

import pandas as pd
import pytest
import torch
from test_values import SENTENCES

import headscan
from headscan.analysis.inactive import inactive_against_ablation, inactive_sentence, quiet_heads
from headscan.metrics import METRICS, AttentionBatch
from headscan.metrics.attended_logit import attended_contributions, attended_directions
from headscan.metrics.output_norm import head_output_norms
from headscan.metrics.values import output_norm_factor

TEXTS = SENTENCES + ["A bird in the hand is worth two in the bush.", "She sold sea shells by the sea shore."]
# enough segments (bootstrap units) for intervals that are not thin, so that the planted heads can be findings
MANY = [f"The {who} {did} the {what} near the {where}." for who in ("cat", "old man", "child", "dog")
        for did in ("saw", "took") for what, where in (("ball", "river"), ("red box", "station"), ("map", "hill"))]


def by_head(frame, metric, column="value"):
    rows = frame[frame["metric"] == metric]
    return dict(zip(zip(rows["layer"], rows["head"]), rows[column]))


# --- the functions on synthetic tensors, against plain loops ------------------------------------------------------


def test_attended_contributions_equal_a_plain_loop_over_heads_queries_and_keys():
    generator = torch.Generator().manual_seed(0)
    b, h, n, e, d, vocab = 2, 3, 5, 4, 6, 11
    pattern = torch.rand(b, h, n, n, generator=generator, dtype=torch.float64).tril()
    pattern = pattern / pattern.sum(-1, keepdim=True)
    key_mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    tokens = torch.randint(0, vocab, (b, n), generator=generator)
    W_O = torch.randn(h, e, d, generator=generator, dtype=torch.float64)
    directions = torch.randn(d, vocab, generator=generator, dtype=torch.float64)
    z = torch.randn(b, n, h, e, generator=generator, dtype=torch.float64)
    before = pattern.clone()
    got = attended_contributions(z, attended_directions(pattern, key_mask, tokens, W_O, directions))  # (b, h, q)
    assert torch.equal(pattern, before)  # never written into
    for i in range(b):
        for head in range(h):
            for q in range(n):
                written = z[i, q, head] @ W_O[head]  # (d,)
                want = sum(float(pattern[i, head, q, k]) * float(written @ directions[:, tokens[i, k]])
                           for k in range(n) if key_mask[i, k])
                assert float(got[i, head, q]) == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_output_norm_is_each_heads_norm_over_its_layers_mean_at_each_query_by_a_plain_loop():
    generator = torch.Generator().manual_seed(1)
    b, h, n, e, d = 2, 4, 5, 3, 7
    z = torch.randn(b, n, h, e, generator=generator, dtype=torch.float64)
    W_O = torch.randn(h, e, d, generator=generator, dtype=torch.float64)
    W_O[2] *= 1e-3  # a quiet head
    norms = head_output_norms(z, output_norm_factor(W_O))  # (b, h, q)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    pattern = torch.full((b, h, n, n), 1.0 / n, dtype=torch.float64)
    batch = AttentionBatch(pattern, mask, mask, torch.zeros(b, n, dtype=torch.long), torch.zeros_like(mask), False,
                           output_norms=norms)
    sums, counts = METRICS["output_norm"].function(batch)
    got = sums.sum(0) / counts.sum(0)  # (head,)
    ratios = {head: [] for head in range(h)}
    for i in range(b):
        for q in range(n):
            if not mask[i, q]:
                continue
            written = [float(torch.linalg.vector_norm(z[i, q, head] @ W_O[head])) for head in range(h)]
            for head in range(h):
                ratios[head].append(written[head] / (sum(written) / h))
    for head in range(h):
        assert float(got[head]) == pytest.approx(sum(ratios[head]) / len(ratios[head]), rel=1e-9)
    assert int(got.argmin()) == 2 and float(got[2]) < 0.01
    chance = METRICS["output_norm"].chance_sums(batch).sum(0) / counts[:, :1].sum(0)
    assert float(chance[0]) == 1.0  # the layer's average head


def test_sink_ratio_is_the_share_of_queries_past_the_threshold_and_its_chance_the_share_uniform_gives():
    generator = torch.Generator().manual_seed(2)
    b, h, n = 2, 3, 6
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    pattern = torch.where(causal, torch.randn(b, h, n, n, generator=generator, dtype=torch.float64) * 2,
                          -math.inf).softmax(-1)
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    batch = AttentionBatch(pattern, mask, mask, torch.zeros(b, n, dtype=torch.long), torch.zeros_like(mask), True)
    sums, counts = METRICS["sink_ratio"].function(batch)
    chance = METRICS["sink_ratio"].chance_sums(batch)
    for head in range(h):
        hits = [float(pattern[i, head, q, 0]) > 0.3 for i in range(b) for q in range(1, n) if mask[i, q]]
        assert float(sums[:, head].sum() / counts[:, head].sum()) == pytest.approx(sum(hits) / len(hits), abs=1e-12)
    # uniform attention gives 1/(q + 1) to the first token: past 0.3 at q = 1 and 2 only, in each segment
    assert chance.squeeze(-1).tolist() == [2.0, 2.0] and counts[:, 0].tolist() == [5.0, 3.0]


# --- a tiny GPT-2's sweep against Hugging Face's own modules ---------------------------------------------------------


def by_hand(path, token_ids):
    """Per segment and layer, (norms (head, q), first-token weights (head, q), attended effect (head, q)) from
    Hugging Face's GPT-2 through forward hooks, head by head and query by query. The attended effect of head h at
    q is sum_k A[q, k] (o . centred logit direction of t_k) / s_q with o = z_q^h W_O^h, the final LayerNorm's
    scale s_q read off the module and its gain applied (dla's convention)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval().double()
    body, n_heads = hf.transformer, hf.config.n_head
    gain, W_U = body.ln_f.weight, hf.lm_head.weight.T  # (d), (d, vocab)
    centred_U = W_U - W_U.mean(1, keepdim=True)
    found = []
    for ids in token_ids:
        seen = {"z": []}
        handles = [body.ln_f.register_forward_pre_hook(lambda m, args: seen.setdefault("final", args[0][0]))]
        handles += [block.attn.c_proj.register_forward_pre_hook(lambda m, args: seen["z"].append(args[0][0]))
                    for block in body.h]
        try:
            with torch.no_grad():
                out = hf(input_ids=torch.tensor([ids]), output_attentions=True)
        finally:
            for handle in handles:
                handle.remove()
        with torch.no_grad():
            x = seen["final"]  # (q, d)
            plain = torch.nn.functional.layer_norm(x, x.shape[-1:], eps=body.ln_f.eps)
            scale = ((x - x.mean(-1, keepdim=True)) / plain).mean(-1)  # (q,)
            layers = []
            for layer, block in enumerate(body.h):
                A = out.attentions[layer][0]  # (head, q, k)
                z = seen["z"][layer].reshape(len(ids), n_heads, -1)
                W_O = block.attn.c_proj.weight.reshape(n_heads, -1, x.shape[-1])
                norms, effects = [], []
                for head in range(n_heads):
                    o = z[:, head] @ W_O[head]  # (q, d)
                    norms.append(o.norm(dim=-1))
                    logits = ((o - o.mean(-1, keepdim=True)) * gain) @ centred_U / scale[:, None]  # (q, vocab)
                    effects.append(torch.tensor([sum(float(A[head, q, k]) * float(logits[q, ids[k]])
                                                     for k in range(q + 1)) for q in range(len(ids))]))
                layers.append((torch.stack(norms), A[:, :, 0], torch.stack(effects)))
        found.append(layers)
    return found


def reference(found, layer, head):
    """output_norm, sink_ratio and attended_logit of one head over every segment, from `by_hand`."""
    ratios = torch.cat([norms[head] / norms.mean(0) for norms, _, _ in (segment[layer] for segment in found)])
    sinks = torch.cat([first[head, 1:] > 0.3 for _, first, _ in (segment[layer] for segment in found)])
    effects = torch.cat([effect[head] for _, _, effect in (segment[layer] for segment in found)])
    return float(ratios.mean()), float(sinks.double().mean()), float(effects.mean())


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """build_ov_checkpoint's layer 0 (head 0 copies: W_V W_O a projection; head 1 the negated projection) with
    head 2's output weights scaled by 1e-3 (a silenced head), and its sweep beside three random-init controls."""
    from transformers import AutoModelForCausalLM

    from headscan.testing.planted import build_ov_checkpoint

    path, heads = build_ov_checkpoint(tmp_path_factory.mktemp("movers") / "ckpt", n_layers=1)
    model = AutoModelForCausalLM.from_pretrained(path)
    d_head = model.config.n_embd // model.config.n_head
    with torch.no_grad():
        model.transformer.h[0].attn.c_proj.weight[2 * d_head:3 * d_head] *= 1e-3
    model.save_pretrained(path)
    tables = headscan.sweep(str(path), MANY, bootstrap=200, max_len=32, batch_size=4, device="cpu",
                            control=("random-init",), control_seeds=3)
    return path, {**heads, "silenced": (0, 2)}, tables


def trained(heads):
    return heads[~heads["model"].str.contains("[", regex=False)]  # the trained model, not its controls


def check_against_by_hand(path, heads, texts):
    from headscan.models import load_model

    heads = trained(heads)
    model = load_model(str(path), device="cpu")
    found = by_hand(path, model.token_ids(texts))
    got = {metric: by_head(heads, metric) for metric in ("output_norm", "sink_ratio", "attended_logit")}
    for layer in range(model.n_layers):
        for head in range(model.n_heads):
            norm, sink, effect = reference(found, layer, head)
            assert got["output_norm"][layer, head] == pytest.approx(norm, rel=1e-5), (layer, head)
            assert got["sink_ratio"][layer, head] == pytest.approx(sink, abs=1e-12), (layer, head)
            assert got["attended_logit"][layer, head] == pytest.approx(effect, rel=1e-4, abs=1e-7), (layer, head)


def test_random_gpt2_sweep_equals_a_plain_loop_over_hugging_face_modules(tiny_gpt2):
    heads = headscan.sweep(str(tiny_gpt2), TEXTS, bootstrap=0, max_len=32, batch_size=2, device="cpu").heads
    check_against_by_hand(tiny_gpt2, heads, TEXTS)


def test_planted_sweep_equals_a_plain_loop_over_hugging_face_modules(planted):
    path, _, tables = planted
    check_against_by_hand(path, tables.heads, MANY)


def test_planted_mover_suppressor_and_silenced_head_are_found_first_beyond_their_null(planted):
    _, heads, tables = planted
    model = trained(tables.heads)
    effect, norm = by_head(model, "attended_logit"), by_head(model, "output_norm")
    assert max(effect, key=effect.get) == heads["copying"] and effect[heads["copying"]] > 0
    assert min(effect, key=effect.get) == heads["anti_copying"] and effect[heads["anti_copying"]] < 0
    assert min(norm, key=norm.get) == heads["silenced"] and norm[heads["silenced"]] < 0.01
    # the null: the range of the random-init controls' heads at the same layer. With three controls and 24 units
    # the family's false-discovery control does not make them discoveries (q about 0.06 and 0.3), so the test
    # reads the null's range itself: each planted head lies beyond every control head of its layer
    low = {metric: by_head(model, metric, "null_low") for metric in ("attended_logit", "output_norm")}
    high = by_head(model, "attended_logit", "null_high")
    assert effect[heads["copying"]] > high[heads["copying"]]  # above every control head: a mover
    assert effect[heads["anti_copying"]] < low["attended_logit"][heads["anti_copying"]]  # below every one: a suppressor
    assert norm[heads["silenced"]] < low["output_norm"][heads["silenced"]]  # quieter than every one: inactive
    chance = by_head(model, "attended_logit", "chance")
    assert set(chance.values()) == {0.0}


# --- the report's sentence: quiet heads against their ablation ---------------------------------------------------


def test_quiet_heads_are_confirmed_or_contradicted_by_their_exact_ablation():
    labels = ["L0H0", "L0H1", "L0H2", "L0H3"]
    heads = pd.DataFrame({"model": "m", "layer": 0, "head": range(4), "label": labels, "metric": "output_norm",
                          "value": [0.05, 0.1, 1.5, 0.2], "ci_low": [0.04, 0.08, 1.4, 0.1],
                          "ci_high": [0.06, 0.12, 1.6, 0.3], "units": 50, "top_unit_share": 0.05, "n_eff": 40.0,
                          "count": 500})
    importance = pd.DataFrame({"model": "m", "layer": 0, "head": range(4), "label": labels,
                               "target": "next_token_loss", "method": "mean_ablation",
                               "value": [0.0001, 0.5, 0.4, 0.3], "ci_low": [-0.0002, 0.45, 0.35, 0.25],
                               "ci_high": [0.0003, 0.55, 0.45, 0.35], "units": 400, "top_unit_share": 0.01,
                               "n_eff": 300.0, "count": 400})
    assert quiet_heads(heads)["label"].tolist() == ["L0H0", "L0H1"]  # L0H3's interval reaches past 0.25
    table = inactive_against_ablation(heads, importance)
    assert dict(zip(table["label"], table["verdict"])) == {"L0H0": "confirmed", "L0H1": "contradicted"}
    sentence = inactive_sentence(table, "m")
    assert "confirms L0H0 (0.05)" in sentence and "contradicts L0H1 (0.10)" in sentence
    assert inactive_sentence(table, "other") is None
