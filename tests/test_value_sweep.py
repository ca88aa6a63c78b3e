"""Value weighting and direct logit attribution in the sweep: planted heads, plain-loop references from
Hugging Face states and weights, chunked == eager, the tables on disk and on the command line."""

import math

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from test_values import SENTENCES, loop_reference, padded, reference_body, sweep_like_capture

import headscan
from headscan.config import SweepConfig
from headscan.corpus import texts_corpus
from headscan.metrics import METRICS, AttentionBatch
from headscan.models import pattern_forward
from headscan.scan import fingerprint, sweep_model

SHORT = SENTENCES  # three short sentences of different lengths: padding counts


def run(model, texts=SHORT, **settings):
    config = SweepConfig(bootstrap=0, **settings)
    return sweep_model(model, texts_corpus(list(texts), None), config)


@pytest.fixture(scope="module")
def swept(request):
    """One eager sweep of SHORT per real model, shared by this module's tests: {name: SweepTables}."""
    found = {}

    def get(name):
        if name not in found:
            found[name] = run(request.getfixturevalue(name))
        return found[name]

    return get


def by_head(frame, metric):
    """(layer, head) -> value of one metric of a table."""
    rows = frame[frame["metric"] == metric]
    return dict(zip(zip(rows["layer"], rows["head"]), rows["value"]))


# --- the metrics on synthetic batches ----------------------------------------------------------------------


def synthetic(norms, causal=False, seed=0):
    generator = torch.Generator().manual_seed(seed)
    lengths = [5, 3]
    mask = torch.tensor([[k < n for k in range(5)] for n in lengths])
    logits = torch.randn(2, 3, 5, 5, generator=generator, dtype=torch.float64)
    allowed = mask[:, None, None, :] & (torch.ones(5, 5, dtype=torch.bool).tril() if causal else True)
    pattern = torch.where(allowed, logits, -math.inf).softmax(-1)  # (batch, head, q, k); padded queries' rows too
    return AttentionBatch(pattern, mask, mask, torch.zeros(2, 5, dtype=torch.long), torch.zeros_like(mask), causal,
                          value_norms=norms)


@pytest.mark.parametrize("causal", [False, True])
def test_moved_is_one_for_equal_norms_and_zero_for_a_head_that_moves_nothing(causal):
    norms = torch.full((2, 3, 5), 2.5, dtype=torch.float64)
    norms[:, 1] = 0.0  # head 1 moves nothing from any key
    norms[1, 2, 3:] = 1e6  # padded keys: whatever they hold never counts
    sums, counts = METRICS["moved"].function(synthetic(norms, causal))
    moved = sums.sum(0) / counts.sum(0)  # (head,)
    assert torch.allclose(moved, torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64))
    assert counts[:, 0].tolist() == ([4.0, 2.0] if causal else [5.0, 3.0])  # a causal first query sees one key


def test_moved_of_a_sink_on_a_key_with_a_small_value_is_small():
    batch = synthetic(None)
    sink = torch.zeros_like(batch.pattern)
    sink[..., 0] = 1.0  # every query on key 0
    norms = torch.ones(2, 3, 5, dtype=torch.float64)
    norms[:, :, 0] = 0.01
    sums, counts = METRICS["moved"].function(AttentionBatch(sink, batch.query_mask, batch.key_mask, batch.tokens,
                                                            batch.sep_mask, False, value_norms=norms))
    # segment 0: 0.01 / mean(0.01, 1, 1, 1, 1); segment 1: 0.01 / mean(0.01, 1, 1)
    want = (5 * 0.01 / (4.01 / 5) + 3 * 0.01 / (2.01 / 3)) / 8
    assert torch.allclose(sums.sum(0) / counts.sum(0), torch.full((3,), want, dtype=torch.float64))


# --- a planted previous-token head whose value weights are zeroed in the checkpoint ------------------------


@pytest.fixture(scope="module")
def silenced_gpt2(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from headscan.testing import build_planted_checkpoint

    folder, heads = build_planted_checkpoint(tmp_path_factory.mktemp("silenced"), "gpt2", n_layers=1)
    layer, head = heads["prev_token"]
    hf = AutoModelForCausalLM.from_pretrained(folder)
    d_model = hf.config.n_embd
    d_head = d_model // hf.config.n_head
    columns = slice(2 * d_model + head * d_head, 2 * d_model + (head + 1) * d_head)  # c_attn stacks [q | k | v]
    with torch.no_grad():
        hf.transformer.h[layer].attn.c_attn.weight[:, columns] = 0.0
        hf.transformer.h[layer].attn.c_attn.bias[columns] = 0.0
    hf.save_pretrained(folder)
    return folder, heads


def test_a_previous_token_head_that_moves_nothing_scores_zero_value_weighted(silenced_gpt2):
    folder, heads = silenced_gpt2
    tables = headscan.sweep(str(folder), "builtin", limit=12, bootstrap=0, max_len=32)
    target = heads["prev_token"]
    attention, value = tables.heads, tables["value"]
    assert by_head(attention, "prev_token")[target] > 0.999
    assert by_head(value, "prev_token")[target] == 0.0
    assert by_head(value, "moved")[target] == 0.0
    # Every row of its value-weighted attention is 0: no key is its largest, so every share, the entropy and the
    # distance are exactly 0 wherever defined (taking key 0 as the top would score positional_prev 0.036)
    rows = value[(value["layer"] == target[0]) & (value["head"] == target[1])].set_index("metric")
    defined = rows[rows["count"] > 0]
    assert set(defined.index) >= {"prev_token", "self", "first_token", "positional_prev", "duplicate_token",
                                  "induction", "entropy", "entropy_norm", "distance", "moved"}
    assert (defined["value"] == 0.0).all(), defined.loc[defined["value"] != 0, "value"].to_dict()
    same = attention[(attention["layer"] == target[0]) & (attention["head"] == target[1])].set_index("metric")
    shared = defined.index.drop("moved")
    np.testing.assert_array_equal(defined.loc[shared, "count"], same.loc[shared, "count"])  # the same queries count
    sink = heads["first_token"]  # a planted head with live weights keeps its picture
    assert by_head(value, "first_token")[sink] > 0.99 and by_head(value, "moved")[sink] > 0
    assert set(value["metric"]) == {m.name for m in METRICS.values() if m.table == "heads" and not m.needs} | {"moved"}


def test_no_values_leaves_the_value_table_and_dla_out(tiny_models):
    tables = run(tiny_models["gpt2"], values=False)
    assert "value" not in tables.frames and not {"dla", "dla_positive"} & set(tables.heads["metric"])
    assert tables.provenance.models[0].extra["values"].startswith("off")
    on = SweepConfig(values=True)
    assert fingerprint(tiny_models["gpt2"], texts_corpus(SHORT, None), on) != \
        fingerprint(tiny_models["gpt2"], texts_corpus(SHORT, None), SweepConfig(values=False))


def test_an_hf_hooks_model_keeps_its_sweep_with_nan_values_and_the_reason(tmp_path):
    from headscan.models import load_model
    from headscan.testing import build_architecture_checkpoint

    model = load_model(str(build_architecture_checkpoint(tmp_path, "distilbert")))
    assert model.path == "hf_hooks"
    tables = run(model)
    assert tables["value"]["value"].isna().all() and tables.heads.query("metric == 'prev_token'")["value"].notna().all()
    assert "hf_hooks" in tables.provenance.models[0].extra["values"]


# --- plain loops from Hugging Face hidden states and weights -----------------------------------------------


@pytest.mark.real
@pytest.mark.parametrize("name", ["minilm", "smollm2"])
def test_value_table_matches_a_plain_loop_from_hugging_face_states(name, request, swept):
    model = request.getfixturevalue(name)
    value = swept(name)["value"]
    ids, mask = padded(model, SHORT)
    layers = [0, model.n_layers // 2, model.n_layers - 1]
    seen = sweep_like_capture(model, ids, mask, layers)  # the attention weights (the reference is of the values)
    body = reference_body(name, model)
    with torch.no_grad():
        hidden = body(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True).hidden_states
    lengths = mask.sum(-1).tolist()
    for layer in layers:
        pattern = seen[layer, "pattern"].double()
        norms, weighted = loop_reference(model, body, hidden[layer], pattern, mask, layer)  # float64, one key at a time
        for head in range(model.n_heads):
            first, prev, moved = [], [], []
            for b, n in enumerate(lengths):
                mean = sum(norms[b, head, k].item() for k in range(n)) / n
                for q in range(n):
                    if q >= 1:
                        first.append(weighted[b, head, q, 0].item())
                        prev.append(weighted[b, head, q, q - 1].item())
                    if q >= 1 or not model.causal:
                        mass = sum(pattern[b, head, q, k].item() * norms[b, head, k].item() for k in range(n))
                        moved.append(mass / mean)
            for metric, scores in (("first_token", first), ("prev_token", prev), ("moved", moved)):
                got = by_head(value, metric)[layer, head]
                assert got == pytest.approx(sum(scores) / len(scores), abs=1e-5), (name, layer, head, metric)


@pytest.mark.real
def test_dla_matches_a_plain_recomputation_from_hugging_face_hooks(smollm2, swept):
    heads = swept("smollm2").heads
    hf = smollm2.hf_model
    body = hf.model
    n_heads = smollm2.n_heads
    unembed = hf.lm_head.weight.detach().double()  # (vocab, d_model), tied to the embedding
    gain, eps = body.norm.weight.detach().double(), body.norm.variance_epsilon
    totals = torch.zeros(smollm2.n_layers, n_heads, dtype=torch.float64)
    positive = torch.zeros_like(totals)
    count = 0
    for sentence in SHORT:
        ids = torch.tensor([smollm2.token_ids([sentence])[0]])
        n = ids.shape[1]
        z, final = [], {}
        handles = [body.norm.register_forward_pre_hook(lambda m, args: final.setdefault("x", args[0].detach()))]
        for layer in body.layers:
            handles.append(layer.self_attn.o_proj.register_forward_pre_hook(
                lambda m, args: z.append(args[0].detach().double().reshape(n, n_heads, -1))))  # (q, head, d_head)
        try:
            with torch.no_grad():
                hf(input_ids=ids)
        finally:
            for handle in handles:
                handle.remove()
        x = final["x"][0].double()  # (q, d_model)
        scale = torch.sqrt(x.pow(2).mean(-1) + eps)  # RMSNorm's divisor per position
        centre = (gain * unembed).mean(0)  # (d_model,): the mean logit's direction
        for layer, attn in enumerate(body.layers):
            W_O = attn.self_attn.o_proj.weight.detach().double().T.reshape(n_heads, -1, smollm2.d_model)
            for q in range(n - 1):  # the last position has no next token
                direction = gain * unembed[ids[0, q + 1]] - centre  # centred over the vocabulary
                for head in range(n_heads):
                    d = (z[layer][q, head] @ W_O[head]) @ direction / scale[q]
                    totals[layer, head] += d
                    positive[layer, head] += float(d > 0)
        count += n - 1
    dla, share = by_head(heads, "dla"), by_head(heads, "dla_positive")
    got = torch.tensor([[dla[layer, head] for head in range(n_heads)] for layer in range(smollm2.n_layers)])
    assert torch.allclose(got.double(), totals / count, atol=1e-4, rtol=1e-4)
    got = torch.tensor([[share[layer, head] for head in range(n_heads)] for layer in range(smollm2.n_layers)])
    assert (got.double() - positive / count).abs().max() <= 1.5 / count  # a contribution near 0 may flip sign
    assert heads.query("metric == 'dla'")["count"].eq(count).all()


# --- chunked == eager ---------------------------------------------------------------------------------------


def assert_value_columns_agree(model, chunk, eager=None):
    eager = eager or run(model, attention="eager")
    chunked = run(model, attention="chunked", query_chunk=chunk)
    key = ["layer", "head", "metric"]
    for name, rows in (("value", lambda t: t["value"]), ("heads", lambda t: t.heads.query("metric in ['dla', 'dla_positive']"))):
        want, got = rows(eager).sort_values(key), rows(chunked).sort_values(key)
        assert len(want) and want[key].values.tolist() == got[key].values.tolist(), name
        np.testing.assert_allclose(got["value"].to_numpy(float), want["value"].to_numpy(float), atol=1e-5, rtol=1e-5,
                                   err_msg=f"{model.name} {name}")


def test_tiny_gpt2_value_and_dla_chunked_equal_eager(tiny_models):
    assert_value_columns_agree(tiny_models["gpt2"], chunk=3)


@pytest.mark.real
def test_smollm2_value_and_dla_chunked_equal_eager(smollm2, swept):
    assert_value_columns_agree(smollm2, chunk=5, eager=swept("smollm2"))


def test_eager_and_chunked_hand_over_the_same_internals(tiny_models):
    model = tiny_models["gpt2"]
    ids, mask = padded(model, SHORT)
    got = {}

    def keep(mode):
        return {kind: {1: lambda t, layer, kind=kind: got.setdefault((mode, kind), t.clone())} for kind in ("v", "z", "out")}

    for mode in ("eager", "chunked"):
        with pattern_forward(model, {}, attention=mode, query_chunk=4, internals=keep(mode)) as forward:
            forward(ids, mask)
    real = mask[:, :, None, None]
    for kind in ("v", "z"):
        torch.testing.assert_close(got["chunked", kind] * real, got["eager", kind] * real, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["chunked", "out"] * mask[..., None], got["eager", "out"] * mask[..., None],
                               atol=1e-5, rtol=1e-5)


# --- the tables on disk and on the command line -------------------------------------------------------------


def test_load_round_trip_of_a_run_with_a_value_table(tiny_gpt2, tmp_path):
    out = tmp_path / "run"
    written = headscan.sweep(str(tiny_gpt2), list(SHORT), out=out, bootstrap=0)
    loaded = headscan.load(out)
    for name in ("heads", "value"):
        np.testing.assert_array_equal(loaded[name]["value"].to_numpy(float), written[name]["value"].to_numpy(float))
    both = loaded.heads.merge(loaded["value"], on=["model", "layer", "head", "metric"], suffixes=("_attention", "_value"))
    assert len(both) == len(loaded["value"].query("metric != 'moved'"))  # every value-weighted metric has its pair
    assert {"value_attention", "value_value"} <= set(both.columns)
    assert "captured" in loaded.provenance.models[0].extra["values"]


@pytest.mark.real
def test_show_ranks_smollm2_heads_by_dla(swept, tmp_path):
    from headscan.cli import cli
    from headscan.tables import write

    write(swept("smollm2"), tmp_path / "run")
    result = CliRunner().invoke(cli, ["show", str(tmp_path / "run"), "--metric", "dla", "--top", "3"])
    assert result.exit_code == 0, result.output
    # the three highest dla of heads.parquet, by a plain sort, in that order, each with its value
    rows = [(value, layer, head) for metric, layer, head, value in swept("smollm2").heads[["metric", "layer", "head", "value"]]
            .itertuples(index=False) if metric == "dla"]
    best = sorted(rows, key=lambda row: (-row[0], row[1], row[2]))[:3]
    # the table (header and three rows); show's notes on the intervals' unit follow it
    lines = [line for line in result.output.strip().splitlines() if line.split()[:1] in (["model"], ["smollm2"])]
    assert lines[0].split()[:5] == ["model", "label", "layer", "head", "value"] and len(lines) == 4
    printed = [line.split() for line in lines[1:]]
    assert [(p[0], p[1], int(p[2]), int(p[3])) for p in printed] == [("smollm2", f"L{layer}H{h}", layer, h) for _, layer, h in best]
    np.testing.assert_allclose([float(p[4]) for p in printed], [v for v, _, _ in best], rtol=1e-5)


# --- direct logit attribution on a LayerNorm model, recomputed from Hugging Face hooks -----------------------------


def gpt2_by_hand(path, token_ids):
    """Each head's direct logit attribution at each query, and its null head's (uniform attention over the keys
    the query sees: the chance column), [layer][head] = (head's (q - 1,), null's (q - 1,)) per segment, from
    Hugging Face's own GPT-2 through forward hooks, and the check that every component adds up to the centred
    logit.

    The final LayerNorm is read off the module itself: its scale s_q = (x_q - mean x_q) / layer_norm(x_q) without
    gain or bias; a component o (a head's z_h W_O^h, an MLP, an embedding, a bias) enters the centred logit of
    token t as ((o - mean_d o) * g) . (W_U[:, t] - mean_v W_U[:, v]) / s_q, and the final norm's bias b as
    b . (W_U[:, t] - mean_v W_U[:, v]).
    """
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval().double()
    body, n_heads = hf.transformer, hf.config.n_head
    gain, bias, W_U = body.ln_f.weight, body.ln_f.bias, hf.lm_head.weight.T  # (d), (d), (d, vocab)
    centred_U = W_U - W_U.mean(1, keepdim=True)  # each token's logit relative to the mean logit

    def through_final(o, scale):  # (q, d) -> (q, vocab): its share of the centred logits
        return ((o - o.mean(-1, keepdim=True)) * gain) @ centred_U / scale[:, None]

    found = []
    for ids in token_ids:
        seen = {"z": [], "attn": [], "mlp": [], "qkv": []}
        handles = [body.ln_f.register_forward_pre_hook(lambda m, args: seen.setdefault("final", args[0][0]))]
        for block in body.h:
            handles.append(block.attn.c_proj.register_forward_pre_hook(lambda m, args: seen["z"].append(args[0][0])))
            handles.append(block.attn.c_attn.register_forward_hook(lambda m, a, out: seen["qkv"].append(out[0])))
            handles.append(block.attn.c_proj.register_forward_hook(lambda m, a, out: seen["attn"].append(out[0])))
            handles.append(block.mlp.register_forward_hook(lambda m, a, out: seen["mlp"].append(out[0])))
        try:
            with torch.no_grad():
                out = hf(input_ids=torch.tensor([ids]), output_hidden_states=True)
        finally:
            for handle in handles:
                handle.remove()
        with torch.no_grad():
            x = seen["final"]  # (q, d) the residual stream the final norm reads
            plain = torch.nn.functional.layer_norm(x, x.shape[-1:], eps=body.ln_f.eps)
            scale = ((x - x.mean(-1, keepdim=True)) / plain).mean(-1)  # (q,): the norm's own divisor
            targets = torch.tensor(ids[1:])
            logits = out.logits[0]
            centred = (logits - logits.mean(-1, keepdim=True))[torch.arange(len(ids) - 1), targets]  # (q - 1,)
            total = through_final(out.hidden_states[0][0], scale) + bias @ centred_U  # embeddings, final norm bias
            per_head = []
            for layer, block in enumerate(body.h):
                z = seen["z"][layer].reshape(len(ids), n_heads, -1)  # (q, head, d_head)
                W_O = block.attn.c_proj.weight.reshape(n_heads, -1, x.shape[-1])  # Conv1D: z @ W, rows by head
                heads = [through_final(z[:, h] @ W_O[h], scale) for h in range(n_heads)]
                # the null head: uniform attention over the keys each query sees, so the running mean of v
                v = seen["qkv"][layer].split(x.shape[-1], dim=-1)[2].reshape(len(ids), n_heads, -1)  # (k, head, d_head)
                null_z = v.cumsum(0) / torch.arange(1, len(ids) + 1, dtype=v.dtype)[:, None, None]  # (q, head, d_head)
                nulls = [through_final(null_z[:, h] @ W_O[h], scale) for h in range(n_heads)]
                per_head.append([(head[torch.arange(len(ids) - 1), targets], null[torch.arange(len(ids) - 1), targets])
                                 for head, null in zip(heads, nulls)])  # (q - 1,) each, the head's and the null's
                total = total + sum(heads) + through_final(block.attn.c_proj.bias.expand_as(x), scale)
                total = total + through_final(seen["mlp"][layer], scale)
            total = total[torch.arange(len(ids) - 1), targets]
            torch.testing.assert_close(total, centred, rtol=0, atol=1e-9)  # the components add up to the logit
        found.append(per_head)
    return found


@pytest.mark.parametrize("which", ["random", "planted"])
def test_dla_on_layernorm_gpt2_equals_a_recomputation_from_hugging_face_hooks(which, tiny_gpt2, tmp_path):
    """heads.parquet's dla and dla_positive, and their chance columns, of a tiny GPT-2 (LayerNorm, learned
    biases) against `gpt2_by_hand`: with RMSNorm alone (smollm2) an unbiased variance in the final scale, or
    directions not centred over d_model, would go unseen. Random weights attend nearly uniformly,
    so a head's dla and its null head's nearly agree; the planted heads' sharp patterns tell them apart."""
    from headscan.models import load_model
    from headscan.testing import build_planted_checkpoint

    path = tiny_gpt2 if which == "random" else build_planted_checkpoint(tmp_path / "planted")[0]
    model = load_model(str(path), device="cpu")
    token_ids = model.token_ids(SHORT)
    by_hand = gpt2_by_hand(path, token_ids)
    tables = headscan.sweep(str(path), list(SHORT), bootstrap=0, max_len=32, batch_size=2)
    dla, positive = by_head(tables.heads, "dla"), by_head(tables.heads, "dla_positive")
    chance = {metric: dict(zip(zip(rows["layer"], rows["head"]), rows["chance"]))
              for metric, rows in tables.heads.groupby("metric")}
    for layer in range(model.n_layers):
        for head in range(model.n_heads):
            values = torch.cat([segment[layer][head][0] for segment in by_hand])  # every query with a next token
            null = torch.cat([segment[layer][head][1] for segment in by_hand])
            assert dla[layer, head] == pytest.approx(values.mean().item(), rel=1e-5, abs=1e-7), (layer, head)
            assert positive[layer, head] == pytest.approx((values > 0).double().mean().item(), abs=1e-12)
            assert chance["dla"][layer, head] == pytest.approx(null.mean().item(), rel=1e-5, abs=1e-7), (layer, head)
            assert chance["dla_positive"][layer, head] == pytest.approx((null > 0).double().mean().item(), abs=1e-12)
