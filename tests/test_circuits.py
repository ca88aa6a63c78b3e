"""Weight-only scores: planted OV circuits with known copying scores, both ways of reading weights, the table."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from headscan.errors import ModelLoadError
from headscan.models import load_model
from headscan.models import weights as circuits
from headscan.models.sites import layer_sites
from headscan.scan.finish import weights_frame
from headscan.tables import TABLES, head_columns
from headscan.testing.planted import build_ov_checkpoint


@pytest.fixture(scope="module")
def ov_model(tmp_path_factory):
    path, heads = build_ov_checkpoint(tmp_path_factory.mktemp("ov"), n_layers=2)
    return load_model(str(path), device="cpu"), heads


def test_planted_projection_copies_and_its_negation_anti_copies(ov_model):
    model, heads = ov_model
    weights = circuits.head_weights(model)
    scores = circuits.copying_scores(weights)  # (layer, head)
    assert weights.tied and weights.embedding == "tied"
    assert scores[heads["copying"]].item() == pytest.approx(1.0, abs=1e-9)
    assert scores[heads["anti_copying"]].item() == pytest.approx(-1.0, abs=1e-9)
    others = [scores[layer, head].item() for layer in range(2) for head in range(4)
              if (layer, head) not in heads.values()]
    assert all(abs(score) < 0.9 for score in others), others  # random heads are not near either end


def test_copying_score_equals_the_full_vocab_circuit(ov_model):
    """The d_head x d_head shortcut gives what the eigenvalues of the (vocab x vocab) circuit give."""
    model, _ = ov_model
    weights = circuits.head_weights(model)
    # the identity holds for any embedding: 64 tokens keep the full eigen-decomposition fast
    weights = dataclasses.replace(weights, W_E=weights.W_E[:64], W_U=weights.W_U[:, :64])
    W_E, W_U = weights.W_E.detach().double(), weights.W_U.detach().double()
    for layer, head in [(0, 2), (1, 3)]:  # random heads: complex eigenvalues, both signs
        full = W_E @ weights.W_V[layer, head].double() @ weights.W_O[layer, head].double() @ W_U
        eigenvalues = torch.linalg.eigvals(full)
        expected = (eigenvalues.real.sum() / eigenvalues.abs().sum()).item()
        assert circuits.copying_scores(weights)[layer, head].item() == pytest.approx(expected, abs=1e-6)


def test_bridge_and_hugging_face_modules_give_the_same_weights(ov_model, tiny_models):
    for model in (ov_model[0], tiny_models["bert"]):
        assert model.bridge is not None
        from_bridge = circuits.head_weights(model)
        from_modules = circuits.head_weights(dataclasses.replace(model, bridge=None))
        for name in ("W_V", "b_V", "W_O", "b_O", "W_E", "W_U"):
            assert torch.equal(getattr(from_bridge, name), getattr(from_modules, name)), name


def test_gpt2_pre_attention_layernorm_is_folded_into_w_v_and_b_v(tiny_models):
    model = tiny_models["gpt2"]
    block = model.hf_model.transformer.h[1]
    # the session's shared tiny GPT-2 serves other test files (on the same pytest worker, in any order): put its
    # layer norm back afterwards
    saved = block.ln_1.weight.detach().clone(), block.ln_1.bias.detach().clone()
    try:
        with torch.no_grad():
            block.ln_1.weight.normal_()
            block.ln_1.bias.normal_()
        x = torch.randn(5, model.d_model)
        with torch.no_grad():
            expected = block.attn.c_attn(block.ln_1(x))[:, 2 * model.d_model:].reshape(5, model.n_heads, -1)
        mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        normalised = (x - mean) / torch.sqrt(var + block.ln_1.eps)
        weights = circuits.head_weights(model)
        folded = torch.einsum("pd,hde->phe", normalised, weights.W_V[1]) + weights.b_V[1]
        assert torch.allclose(folded, expected, atol=1e-5)
        raw = circuits.head_weights(model, fold_norms=False)
        assert raw.folded == "nothing" and not torch.allclose(raw.W_V[1], weights.W_V[1])
    finally:
        with torch.no_grad():
            block.ln_1.weight.copy_(saved[0])
            block.ln_1.bias.copy_(saved[1])


def weight_frame(model):
    """The weights table of `model`, as a sweep builds it (`headscan.scan.finish.weights_frame`)."""
    weights = circuits.head_weights(model)
    scores = circuits.copying_scores(weights).double().cpu().numpy()[None]
    layer, head = np.meshgrid(np.arange(model.n_layers), np.arange(model.n_heads), indexing="ij")
    per_head = head_columns(model.name, model.family, layer.ravel(), head.ravel(), model.kv_group(head.ravel()))
    return weights_frame(per_head, scores, weights.embedding)


def test_untied_checkpoint_is_recorded_as_untied(tmp_path):
    path, _ = build_ov_checkpoint(tmp_path, tied=False)
    model = load_model(str(path), device="cpu")
    frame = weight_frame(model)
    assert set(frame["embedding"]) == {"untied"}


def test_weight_frame_conforms_to_the_weights_table(ov_model):
    model, heads = ov_model
    frame = weight_frame(model)
    assert list(frame.columns) == list(TABLES["weights"].columns)
    assert len(frame) == 2 * 4 and set(frame["metric"]) == {"copying"}
    assert frame[["sum", "count", "ci_low", "ci_high"]].isna().all().all()
    row = frame[(frame["layer"] == 0) & (frame["head"] == heads["anti_copying"][1])].iloc[0]
    assert row["label"] == "L0H1" and math.isclose(row["value"], -1.0, abs_tol=1e-9)


def test_unknown_layouts_are_refused_in_one_line(tiny_models):
    odd = torch.nn.Linear(2, 2)
    # sites are resolved at load (headscan.models.sites): an odd module's are resolved as load would resolve them
    model = dataclasses.replace(tiny_models["gpt2"], bridge=None, hf_model=odd, name="odd",
                                layer_sites=layer_sites(odd, n_layers=2))
    with pytest.raises(ModelLoadError, match=r"^model 'odd' \(Linear\): headscan reads per-head weights of bert, gpt2, "
                                             r"llama-style models only") as caught:
        circuits.head_weights(model)
    assert "\n" not in str(caught.value)


@pytest.mark.real
def test_smollm2_gqa_weights_and_copying_heads(smollm2):
    weights = circuits.head_weights(smollm2)
    assert tuple(weights.W_V.shape) == (30, 9, 576, 64) and weights.tied and weights.final_norm == "rms"
    # query heads 0-2 read kv head 0: identical (folded) value weights
    assert torch.equal(weights.W_V[4, 0], weights.W_V[4, 2]) and not torch.equal(weights.W_V[4, 2], weights.W_V[4, 3])
    scores = circuits.copying_scores(weights)
    assert torch.isfinite(scores).all() and scores.abs().max() <= 1 + 1e-9
    assert (scores > 0.95).sum() >= 20  # a trained LM has many copying heads (measured: 64 of 270 above 0.9)
