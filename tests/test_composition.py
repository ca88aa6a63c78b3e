"""Composition scores (Elhage et al. 2021) against a plain loop over explicit d_model x d_model matrices read from
the Hugging Face modules by hand, a planted K-composing pair that comes first beyond its random-matrix null, and
a random-init model whose pairs sit inside that null."""

from __future__ import annotations

import numpy as np
import torch

from headscan.models import load_model
from headscan.models.composition import MODES, composition_frame, composition_null, composition_scores, head_qk
from headscan.models.weights import head_weights
from headscan.testing import build_architecture_checkpoint, build_tiny_checkpoint


def gpt2_heads_by_hand(hf, n_heads: int):
    """Per layer and head, (W_Q, W_K, W_V, W_O) of a GPT-2 read off c_attn and c_proj, ln_1's gain folded in."""
    d = hf.config.n_embd
    dh = d // n_heads
    out = []
    for block in hf.transformer.h:
        w, proj, gain = block.attn.c_attn.weight.detach().double(), block.attn.c_proj.weight.detach().double(), \
            block.ln_1.weight.detach().double()[:, None]
        out.append([(gain * w[:, h * dh:(h + 1) * dh], gain * w[:, d + h * dh:d + (h + 1) * dh],
                     gain * w[:, 2 * d + h * dh:2 * d + (h + 1) * dh], proj[h * dh:(h + 1) * dh]) for h in range(n_heads)])
    return out


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
    plain = plain_scores(gpt2_heads_by_hand(model.hf_model, model.n_heads))
    W_Q, W_K = head_qk(model)
    weights = head_weights(model)
    scores = composition_scores(W_Q, W_K, weights.W_V, weights.W_O)
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


def test_a_random_init_model_sits_inside_the_random_matrix_null(tmp_path):
    model = load_model(str(build_tiny_checkpoint(tmp_path / "gpt2", "gpt2", n_layers=4, seed=5)), device="cpu")
    frame = composition_frame(model)
    assert frame["beyond"].mean() <= 0.05  # 288 pairs of untrained heads: about 1% beyond the 99th percentile
    null = composition_null(32, 8)
    for mode in MODES:
        part = frame[frame["mode"] == mode]
        assert abs(part["value"].mean() - null[mode].mean()) < 0.03  # the same distribution, to its spread


def test_a_sweep_writes_the_composition_table_and_the_report_links_the_planted_pair(tmp_path):
    """Through the sweep: composition.parquet holds composition_frame's rows with the head columns, shards carry
    it, and the report's section lists the planted pair first among K pairs."""
    from transformers import GPT2LMHeadModel

    import headscan
    from headscan.analysis.runs import compare_runs
    from headscan.report.sections.composition import composition_section

    folder = build_tiny_checkpoint(tmp_path / "gpt2", "gpt2", seed=3)
    hf = GPT2LMHeadModel.from_pretrained(folder)
    plant_k_composition(hf)
    hf.save_pretrained(folder)  # the planted weights, as the sweep will load them
    texts = ["the cat sat on the mat and the dog ran to the park"] * 4
    run = headscan.sweep(str(folder), texts, tmp_path / "out", max_len=32, bootstrap=0)
    table = run["composition"]
    want = composition_frame(load_model(str(folder), device="cpu"))
    assert len(table) == len(want) == 48 and (table["family"] == "causal").all()
    merged = table.merge(want, on=["mode", "source_layer", "source_head", "layer", "head"], suffixes=("", "_want"))
    assert len(merged) == 48 and (merged["label"] == merged["label_want"]).all()
    np.testing.assert_allclose(merged["value"], merged["value_want"], rtol=1e-12)
    assert (merged["beyond"] == merged["beyond_want"]).all() and table["sum"].isna().all()
    assert headscan.load(tmp_path / "out")["composition"].equals(table)
    off = headscan.sweep(str(folder), texts, max_len=32, bootstrap=0, composition="off")
    assert "composition" not in off.frames
    blocks = composition_section(compare_runs([run]))
    text = "\n".join(str(getattr(b, "text", "")) + str(getattr(b, "items", "")) for b in blocks)
    assert "K 1 of 16 pairs" in text or "K 1 of 16" in text
    [top] = [b for b in blocks if hasattr(b, "frame") and "sender" in b.frame.columns]
    k = top.frame[top.frame["mode"].str.startswith("K")]
    assert (k["sender"].iloc[0], k["receiver"].iloc[0], k["beyond"].iloc[0]) == ("L0H1", "L1H2", "yes")
