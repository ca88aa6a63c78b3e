"""Composition scores (Elhage et al. 2021) against a plain loop over explicit d_model x d_model matrices read from
the Hugging Face modules by hand and against TransformerLens' own ``all_composition_scores`` (default processing),
a planted K-composing pair that comes first beyond its null, random-init models of GPT-2's and smollm2's shapes
with about 1 pair in 100 beyond it, the null's Haar corners against scipy's Haar rotations, its bootstrap against a
plain loop, and post-LayerNorm models refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headscan.models import load_model
from headscan.models.composition import (
    MODES,
    composition_frame,
    composition_scores,
    composition_weights,
    head_qk,
)
from headscan.testing import build_architecture_checkpoint, build_tiny_checkpoint


def centred(matrix, dim):
    return matrix - matrix.mean(dim, keepdim=True)


def gpt2_heads_by_hand(hf, n_heads: int):
    """Per layer and head, (W_Q, W_K, W_V, W_O) of a GPT-2 read off c_attn and c_proj: ln_1's gain folded into the
    reading weights, which are then centred over d_model as LayerNorm centres the residual, and W_O centred."""
    d = hf.config.n_embd
    dh = d // n_heads
    out = []
    for block in hf.transformer.h:
        w, proj, gain = block.attn.c_attn.weight.detach().double(), block.attn.c_proj.weight.detach().double(), \
            block.ln_1.weight.detach().double()[:, None]
        out.append([tuple(centred(gain * w[:, part * d + h * dh:part * d + (h + 1) * dh], 0) for part in range(3))
                    + (centred(proj[h * dh:(h + 1) * dh], 1),) for h in range(n_heads)])
    return out


def perturbed_layer_norms(hf, seed: int = 0):
    """Give a Hugging Face GPT-2 LayerNorms far from the identity and weights far from centred, in place."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in hf.transformer.h:
            block.ln_1.weight.copy_(1 + 0.5 * torch.randn(block.ln_1.weight.shape, generator=generator))
            block.ln_1.bias.copy_(0.5 * torch.randn(block.ln_1.bias.shape, generator=generator))
            block.attn.c_attn.weight.add_(0.3 * torch.randn(block.attn.c_attn.weight.shape[1], generator=generator))
            block.attn.c_proj.weight.add_(0.3 * torch.randn(block.attn.c_proj.weight.shape[1], generator=generator))


def plain_scores(heads) -> dict:
    """{(mode, source layer, source head, layer, head): score}, every pair one explicit product at a time."""
    def ratio(a, b):
        return float(torch.linalg.norm(a @ b) / (torch.linalg.norm(a) * torch.linalg.norm(b)))

    found = {}
    for s_layer, senders in enumerate(heads):
        for s_head, (_, _, v_s, o_s) in enumerate(senders):
            ov = v_s @ o_s  # (d_model, d_model)
            for layer in range(s_layer + 1, len(heads)):
                for head, (q, k, v, o) in enumerate(heads[layer]):
                    qk = q @ k.T
                    for mode, right in (("Q", qk), ("K", qk.T), ("V", v @ o)):
                        found[mode, s_layer, s_head, layer, head] = ratio(ov, right)
    return found


def test_every_pair_equals_a_plain_loop_on_gpt2(tmp_path):
    folder = build_tiny_checkpoint(tmp_path / "gpt2", "gpt2", n_layers=3, seed=2)
    model = load_model(str(folder), device="cpu")
    perturbed_layer_norms(model.hf_model)
    plain = plain_scores(gpt2_heads_by_hand(model.hf_model, model.n_heads))
    matrices, rule, d_residual = composition_weights(model)
    assert "centred" in rule and d_residual == model.d_model - 1
    scores = composition_scores(*matrices)
    assert len(plain) == 3 * (4 * 4) * 3  # modes x (later, earlier) layer pairs x 16 head pairs
    for (mode, s_layer, s_head, layer, head), want in plain.items():
        assert abs(float(scores[mode][s_layer, s_head, layer, head]) - want) < 1e-9
    for mode in MODES:  # a sender in the same or a later layer has no score
        grid = scores[mode].numpy()
        assert all(np.isnan(grid[a, :, b]).all() for a in range(3) for b in range(a + 1))
    frame = composition_frame(model)
    assert len(frame) == len(plain) and set(frame["mode"]) == set(MODES)
    row = frame[(frame["mode"] == "K") & (frame["source_label"] == "L0H1") & (frame["label"] == "L2H3")].iloc[0]
    assert abs(row["value"] - plain["K", 0, 1, 2, 3]) < 1e-9


def test_grouped_key_heads_are_repeated_for_each_query_head(tmp_path):
    folder = build_architecture_checkpoint(tmp_path / "llama", "llama", seed=1)
    model = load_model(str(folder), device="cpu")
    W_Q, W_K = head_qk(model)
    n_heads, n_kv = model.n_heads, model.n_kv_heads
    assert n_kv < n_heads and W_K.shape[:2] == W_Q.shape[:2] == (model.n_layers, n_heads)
    layer = model.hf_model.model.layers[0]
    gain = layer.input_layernorm.weight.detach()[:, None]
    k_proj = layer.self_attn.k_proj.weight.detach().T  # (d_model, n_kv * d_head)
    dh = k_proj.shape[1] // n_kv
    for head in range(n_heads):  # query head h reads key head h // (n_heads / n_kv), as Llama's repeat_kv
        kv = head // (n_heads // n_kv)
        torch.testing.assert_close(W_K[0, head], gain * k_proj[:, kv * dh:(kv + 1) * dh])


def plant_k_composition(hf, sender=(0, 1), receiver=(1, 2), width=8):
    """In a Hugging Face GPT-2, the sender's output written into residual dimensions 0..width-1 only, and the
    receiver's keys read from them only: a previous-token head feeding an induction head's keys, in the weights."""
    body = hf.transformer
    d = hf.config.n_embd
    dh = d // hf.config.n_head
    with torch.no_grad():
        s_layer, s_head = sender
        proj = body.h[s_layer].attn.c_proj.weight  # (d_model, d_model): rows h * dh ... are head h's W_O
        proj[s_head * dh:(s_head + 1) * dh] = 0
        proj[s_head * dh:(s_head + 1) * dh, :width] = torch.eye(dh, width)
        r_layer, r_head = receiver
        c_attn = body.h[r_layer].attn.c_attn.weight  # columns d + h * dh ...: head h's W_K
        c_attn[:, d + r_head * dh:d + (r_head + 1) * dh] = 0
        c_attn[:width, d + r_head * dh:d + (r_head + 1) * dh] = torch.eye(width, dh)


def test_a_planted_k_composing_pair_comes_first_beyond_its_null(tmp_path):
    model = load_model(str(build_tiny_checkpoint(tmp_path / "gpt2", "gpt2", seed=3)), device="cpu")
    plant_k_composition(model.hf_model)
    frame = composition_frame(model)
    k = frame[frame["mode"] == "K"]
    first = k.iloc[0]
    assert (first["source_label"], first["label"]) == ("L0H1", "L1H2") and first["beyond"]
    assert first["value"] > 1.5 * first["null_high"]
    others = k.iloc[1:]
    assert others["beyond"].sum() <= 1  # random pairs: about 1 in 100 passes the null's 99th percentile
    # the plant is a key-side circuit: as a query-side one the same pair is unremarkable
    q = frame[(frame["mode"] == "Q") & (frame["source_label"] == "L0H1") & (frame["label"] == "L1H2")].iloc[0]
    assert q["value"] < first["value"] / 1.5


def transformer_lens_scores(folder) -> dict:
    """TransformerLens' own all_composition_scores of the checkpoint in `folder`, with TransformerLens' default
    weight processing (HookedTransformer's: fold_ln, center_writing_weights, ...), float64."""
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(str(folder), device="cpu", dtype=torch.float64)
    bridge.enable_compatibility_mode(disable_warnings=True)
    return {mode: bridge.all_composition_scores(mode).scores.detach().double().numpy() for mode in MODES}


def assert_equals_transformer_lens(folder, model):
    want = transformer_lens_scores(folder)
    scores = composition_scores(*composition_weights(model)[0])
    for mode in MODES:
        got = scores[mode].numpy()
        earlier = ~np.isnan(got)
        assert earlier.sum() == (want[mode] != 0).sum() > 0  # TransformerLens writes 0 where headscan writes NaN
        np.testing.assert_allclose(got[earlier], want[mode][earlier], rtol=0, atol=1e-6, err_msg=mode)


def test_a_pre_layer_norm_gpt2_equals_transformer_lens_all_composition_scores(tmp_path):
    """LayerNorm gains and biases far from the identity and weights far from centred, so folding the gain,
    centring the reading weights and centring W_O each move the scores (by up to 0.3 here)."""
    from transformers import GPT2LMHeadModel

    folder = build_tiny_checkpoint(tmp_path / "gpt2", "gpt2", n_layers=3, seed=2)
    hf = GPT2LMHeadModel.from_pretrained(folder)
    perturbed_layer_norms(hf)
    hf.save_pretrained(folder)
    model = load_model(str(folder), device="cpu")
    assert_equals_transformer_lens(folder, model)
    raw = composition_scores(*head_qk(model, fold_norms=False), *composition_weights(model)[0][2:])
    moved = max(float(np.nanmax(np.abs(raw[m].numpy() - composition_scores(*composition_weights(model)[0])[m].numpy())))
                for m in MODES)
    assert moved > 0.05  # the processing matters on this model, so the agreement says something


def test_an_rms_norm_llama_equals_transformer_lens_with_its_gain_folded_and_nothing_centred(tmp_path):
    """Grouped-query Llama: RMSNorm keeps the residual's mean, so only the gain is folded (as TransformerLens does)."""
    from transformers import LlamaForCausalLM

    folder = build_architecture_checkpoint(tmp_path / "llama", "llama", seed=1)
    hf = LlamaForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.input_layernorm.weight.mul_(1 + 0.5 * torch.rand(layer.input_layernorm.weight.shape))
    hf.save_pretrained(folder)
    model = load_model(str(folder), device="cpu")
    (W_Q, *_), rule, d_residual = composition_weights(model)
    assert "nothing centred" in rule and d_residual == model.d_model
    assert W_Q.mean(-2).abs().max() > 1e-3  # not centred
    assert_equals_transformer_lens(folder, model)


def test_a_post_layer_norm_model_is_refused_in_one_line_and_its_sweep_says_why(tmp_path):
    import headscan
    from headscan.errors import ModelLoadError

    folder = build_tiny_checkpoint(tmp_path / "bert", "bert", n_layers=2)
    with pytest.raises(ModelLoadError, match="is post-LayerNorm"):
        composition_frame(load_model(str(folder), device="cpu"))
    for setting in ("auto", "on"):
        run = headscan.sweep(str(folder), ["the cat sat on the mat"] * 2, max_len=16, bootstrap=0, composition=setting)
        assert "composition" not in run.frames
        note = run.provenance.models[0].extra["composition"]
        assert note.startswith("not scored: ") and "post-LayerNorm" in note and "\n" not in note
    from headscan.analysis.runs import compare_runs
    from headscan.report.sections.composition import composition_section, shown

    comparison = compare_runs([run])
    said = [str(getattr(b, "items", "")) for b in composition_section(comparison)]
    assert shown(comparison) and any("is post-LayerNorm" in line for line in said)  # the report says why too


def test_haar_corners_are_distributed_as_corners_of_scipys_haar_rotations():
    """Squared entries of the 4 x 4 corner of a Haar-random rotation of 12 dimensions: headscan's Bartlett draws
    against scipy's ortho_group, on three statistics (fixed seeds: the p-values are the same every run)."""
    from scipy.stats import ks_2samp, ortho_group

    from headscan.models.composition import haar_corners

    want = ortho_group.rvs(12, size=6000, random_state=1)[:, :4, :4] ** 2
    got = haar_corners(12, 4, 6000).double().numpy()
    for statistic in (lambda c: c[:, 0, 0], lambda c: c[:, 1, 2], lambda c: c.sum((1, 2)), lambda c: c[:, 0].sum(1)):
        assert ks_2samp(statistic(want), statistic(got)).pvalue > 0.01
    wide = haar_corners(6, 4, 6000).double().numpy()  # fewer other dimensions than d_head: the fallback draw
    assert ks_2samp(wide.sum((1, 2)), (ortho_group.rvs(6, size=6000, random_state=2)[:, :4, :4] ** 2).sum((1, 2))
                    ).pvalue > 0.01


def test_a_rotated_pair_scores_as_its_spectra_and_the_corner_say():
    """The null's identity: with OV_s = P diag(s) V^T and X = U_B diag(t) W^T, ||OV_s R X||_F^2 is
    sum_ij s_i^2 t_j^2 (V^T R U_B)_ij^2 for any rotation R (scipy's), so a corner of R is all a draw needs."""
    from scipy.stats import ortho_group

    generator = torch.Generator().manual_seed(0)
    d, dh = 10, 3
    ov = torch.randn(d, dh, generator=generator, dtype=torch.float64) @ torch.randn(dh, d, generator=generator,
                                                                                      dtype=torch.float64)
    x = torch.randn(d, dh, generator=generator, dtype=torch.float64) @ torch.randn(dh, d, generator=generator,
                                                                                     dtype=torch.float64)
    rotation = torch.from_numpy(ortho_group.rvs(d, random_state=3))
    _, s, Vh = torch.linalg.svd(ov)
    U, t, _ = torch.linalg.svd(x)
    corner = Vh[:dh] @ rotation @ U[:, :dh]
    by_spectra = (s[:dh, None] ** 2 * t[None, :dh] ** 2 * corner ** 2).sum()
    assert torch.isclose(torch.linalg.matrix_norm(ov @ rotation @ x) ** 2, by_spectra, rtol=1e-10)


def test_the_bootstrap_of_the_nulls_cut_equals_a_plain_loop_over_resamples():
    from headscan.models.composition import quantile_se

    values = np.random.default_rng(4).gamma(2.0, size=3000)
    rng = np.random.default_rng(5)
    plain = [np.quantile(rng.choice(values, len(values)), 0.99, method="inverted_cdf") for _ in range(3000)]
    assert quantile_se(values, replicates=3000) == pytest.approx(np.std(plain, ddof=1), rel=0.08)


def random_init_llama(folder, *, n_layers, n_heads, n_kv_heads, d_model, seed):
    """A Llama of the given shape with Hugging Face's own initialisation, with the tiny llama's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    build_architecture_checkpoint(folder, "llama")
    config = LlamaConfig.from_pretrained(folder)
    config.update({"num_hidden_layers": n_layers, "num_attention_heads": n_heads, "num_key_value_heads": n_kv_heads,
                   "hidden_size": d_model, "head_dim": d_model // n_heads, "intermediate_size": 64})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        LlamaForCausalLM(config).eval().save_pretrained(folder)
    return folder


@pytest.mark.parametrize("shape", ["gpt2", "smollm2"])
def test_about_one_pair_in_100_of_a_random_init_model_is_beyond_the_99th_percentile(tmp_path, shape):
    """Random-init models of GPT-2 small's shape (d_model 768, 12 heads of 64) and smollm2's (576, 9 query heads of
    64 over 3 key/value heads), 4 layers each, seeds 11-13: the share of pairs beyond the null's 99th percentile,
    pooled over the three models and modes, is 1% to within half a point, and each percentile's bootstrap standard
    error is under 5e-4 (fixed seeds: the same counts every run). One model's count varies more than a binomial's
    (its pairs share heads, so a model whose heads happen to align a little puts several pairs beyond at once:
    0 to 8 of 486 per mode here), hence three models and a tolerance rather than one model's binomial interval;
    docs/metrics.md gives 12-layer models' counts with their binomial intervals."""
    beyond = pairs = 0
    for seed in (11, 12, 13):
        if shape == "gpt2":
            folder = build_tiny_checkpoint(tmp_path / f"{seed}", "gpt2", n_layers=4, n_heads=12, d_model=768, seed=seed)
        else:
            folder = random_init_llama(tmp_path / f"{seed}", n_layers=4, n_heads=9, n_kv_heads=3, d_model=576,
                                       seed=seed)
        frame = composition_frame(load_model(str(folder), device="cpu"))
        assert (frame["null_se"] <= 5e-4).all()
        beyond, pairs = beyond + int(frame["beyond"].sum()), pairs + len(frame)
    assert 0.005 < beyond / pairs < 0.015, (beyond, pairs)
