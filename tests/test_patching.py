"""Contrastive patching, path patching and composition against answers known without headscan's patching code.

- A hand-built GPT-2 with a planted induction circuit (`headscan.testing.circuit`: a previous-token head L0H0
  whose output the induction head L1H0 reads through its keys): patching ranks the two planted heads first and
  each restores the whole logit difference; path patching finds L0H0 > L1H0 through keys and no other path above
  0; K-composition puts the same pair first, beyond its rotation null.
- Every exact patch equals a plain Hugging Face run with a forward pre-hook on the model's own output projection
  (GPT-2 on the planted model; smollm2, float64, for one head); AtP equals the plain model's own gradient.
- Pairs files, the pair generator, and the refusals (prompts of different lengths, encoders, bad paths).
"""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM, AutoTokenizer

import headscan
from headscan.cli import cli
from headscan.corpus.pairs import Pair, generate_pairs, read_pairs
from headscan.errors import ConfigError, CorpusError, ModelLoadError
from headscan.models import load_model
from headscan.models.ablation import Surgery, head_cut
from headscan.models.composition import composition_frame
from headscan.models.patching import patch_heads
from headscan.patching_config import PatchConfig
from headscan.scan.patching import encode_pairs, patch, recall_at, unit_values
from headscan.testing import build_tiny_checkpoint
from headscan.testing.circuit import build_circuit_checkpoint


@pytest.fixture(scope="module")
def circuit(tmp_path_factory):
    path, heads = build_circuit_checkpoint(tmp_path_factory.mktemp("circuit") / "model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    single = lambda word: len(tokenizer(word)["input_ids"]) == 1  # noqa: E731
    return path, heads, generate_pairs("induction", 16, seed=1, single_token=single)


@pytest.fixture(scope="module")
def circuit_run(circuit):
    path, _, pairs = circuit
    # every head a sender and a receiver: 4 x 4 pairs of layers 0 -> 1, through q, k and v
    return patch(str(path), pairs, device="cpu", path_top=8, bootstrap=200)


def _fractions(run, method):
    rows = run["patching"]
    rows = rows[(rows["method"] == method) & (rows["target"] == "fraction")]
    return rows.set_index("label")


@pytest.mark.parametrize("method", ["denoise", "noise"])
def test_patching_ranks_the_planted_heads_first(circuit_run, method):
    rows = _fractions(circuit_run, method).sort_values("value", ascending=False)
    assert set(rows.index[:2]) == {"L0H0", "L1H0"}
    for label in ("L0H0", "L1H0"):
        assert rows.loc[label, "value"] > 0.9 and rows.loc[label, "ci_low"] > 0.5, label
    others = rows.drop(["L0H0", "L1H0"])
    assert others["value"].abs().max() < 1e-3  # distractors write where nothing reads


def test_path_patching_finds_the_planted_pair_and_no_other(circuit_run):
    paths = circuit_run["paths"]
    paths = paths[paths["target"] == "fraction"]
    assert len(paths) == 4 * 4 * 3
    above = paths[paths["ci_low"] > 0]
    assert list(zip(above["sender_label"], above["label"], above["path"])) == [("L0H0", "L1H0", "k")]
    planted = above.iloc[0]
    assert planted["value"] == pytest.approx(1.0, abs=0.01)
    # through queries and values the same pair carries nothing: the query reads the current token, the value the
    # attended one, and neither is what the corruption changed at the induction head's key
    rest = paths[(paths["sender_label"] == "L0H0") & (paths["label"] == "L1H0") & (paths["path"] != "k")]
    assert rest["value"].abs().max() < 1e-3


def test_k_composition_puts_the_planted_pair_first(circuit):
    path, _, _ = circuit
    frame = composition_frame(load_model(str(path), device="cpu"), draws=200)
    k = frame[frame["mode"] == "K"].sort_values("value", ascending=False)
    first = k.iloc[0]
    assert (first["source_label"], first["label"]) == ("L0H0", "L1H0")
    assert first["beyond"] and first["value"] > 1.5 * k.iloc[1]["value"]


def _plain_patch(model, ids, mask, donor_ids, last, answer, wrong, layer, head, d_head):
    """LD of `ids` with one head's output (the input of transformer.h.{layer}.attn.c_proj, a plain pre-hook) taken
    from the run of `donor_ids`; the plain model's own modules, nothing of headscan's."""
    module = model.transformer.h[layer].attn.c_proj
    kept = {}
    handle = module.register_forward_pre_hook(lambda m, args: kept.__setitem__("z", args[0].detach().clone()))
    with torch.no_grad():
        model(input_ids=donor_ids, attention_mask=mask)
    handle.remove()

    def swap(m, args):
        x = args[0].clone()
        x[..., head * d_head:(head + 1) * d_head] = kept["z"][..., head * d_head:(head + 1) * d_head]
        return (x,)
    handle = module.register_forward_pre_hook(swap)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    handle.remove()
    rows = torch.arange(len(ids))
    return (logits[rows, last, answer] - logits[rows, last, wrong]).double()


def test_every_exact_patch_equals_a_plain_hook(circuit):
    """float64 on both sides: the planted logits are about 60, where float32 rounds apart by 1e-5."""
    path, _, pairs = circuit
    model = load_model(str(path), device="cpu", dtype="float64")
    batch = encode_pairs(model, pairs[:4], batch_size=4)[0]
    with Surgery(model, head_cut(model), "next_token_loss") as surgery:
        found = patch_heads(surgery, batch, n_heads=model.n_heads, attribution=False)
    plain = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float64).eval()
    rows = torch.arange(4)
    with torch.no_grad():
        clean = plain(input_ids=batch.clean, attention_mask=batch.mask).logits[rows, batch.last]
        corrupted = plain(input_ids=batch.corrupted, attention_mask=batch.mask).logits[rows, batch.last]
    ld = lambda logits: (logits[rows, batch.answer] - logits[rows, batch.wrong]).double()  # noqa: E731
    torch.testing.assert_close(found["clean"], ld(clean), atol=1e-8, rtol=0)
    for layer in range(2):
        for head in range(4):
            args = (batch.mask, batch.last, batch.answer, batch.wrong, layer, head, 32)
            denoise = _plain_patch(plain, batch.corrupted, args[0], batch.clean, *args[1:]) - ld(corrupted)
            noise = ld(clean) - _plain_patch(plain, batch.clean, args[0], batch.corrupted, *args[1:])
            torch.testing.assert_close(found["denoise"][layer, :, head], denoise, atol=1e-8, rtol=0)
            torch.testing.assert_close(found["noise"][layer, :, head], noise, atol=1e-8, rtol=0)


def test_atp_equals_the_plain_models_own_gradient(circuit):
    path, _, pairs = circuit
    model = load_model(str(path), device="cpu")
    batch = encode_pairs(model, pairs[:3], batch_size=3)[0]
    with Surgery(model, head_cut(model), "next_token_loss") as surgery:
        found = patch_heads(surgery, batch, n_heads=4, only=[])
    plain = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    z = {}
    modules = [plain.transformer.h[layer].attn.c_proj for layer in range(2)]
    for ids, name in ((batch.clean, "clean"), (batch.corrupted, "corrupted")):
        handles = [m.register_forward_pre_hook(lambda m, a, i=i: z.__setitem__((name, i), a[0])) for i, m in
                   enumerate(modules)]
        logits = plain(input_ids=ids, attention_mask=batch.mask).logits
        for h in handles:
            h.remove()
        rows = torch.arange(3)
        ld = logits[rows, batch.last, batch.answer] - logits[rows, batch.last, batch.wrong]
        grads = torch.autograd.grad(ld.sum(), [z[(name, i)] for i in range(2)])
        for i in range(2):
            z[(name, i, "grad")] = grads[i]
    for layer in range(2):
        delta = (z[("clean", layer)] - z[("corrupted", layer)]).detach().view(3, -1, 4, 32)
        g = z[("corrupted", layer, "grad")].view(3, -1, 4, 32)
        expected = (delta * g * batch.mask[..., None, None]).sum((1, 3)).double()  # (pair, head)
        torch.testing.assert_close(found["atp_denoise"][layer], expected, atol=1e-4, rtol=1e-4)


@pytest.mark.real
def test_one_smollm2_patch_equals_a_plain_hook(smollm2):
    """smollm2 in float64 on both sides (in float32 30 layers round apart by about 1e-5), one IOI pair, one head
    (L10H3) patched from the clean run into the corrupted one; the plain model is dequantised from its GGUF file
    by transformers, apart from headscan's loader."""
    from headscan.models import alias_status

    gguf = alias_status()["smollm2"]
    model = load_model("smollm2", device="cpu", dtype="float64")
    tokenizer = model.tokenizer
    single = lambda word: len(tokenizer(word, add_special_tokens=False)["input_ids"]) == 1  # noqa: E731
    batch = encode_pairs(model, generate_pairs("ioi", 1, seed=0, single_token=single), batch_size=1)[0]
    layer, head = 10, 3
    with Surgery(model, head_cut(model), "next_token_loss") as surgery:
        found = patch_heads(surgery, batch, n_heads=model.n_heads, attribution=False, only=[(layer, head)])
    del model
    plain = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, attn_implementation="eager",
                                                 dtype=torch.float64).eval()
    module = plain.model.layers[layer].self_attn.o_proj
    d = module.in_features // plain.config.num_attention_heads
    kept = {}
    handle = module.register_forward_pre_hook(lambda m, a: kept.__setitem__("z", a[0].clone()))
    with torch.no_grad():
        plain(input_ids=batch.clean, attention_mask=batch.mask)
        handle.remove()
        corrupted = plain(input_ids=batch.corrupted, attention_mask=batch.mask).logits[0, batch.last[0]]

        def swap(m, args):
            x = args[0].clone()
            x[..., head * d:(head + 1) * d] = kept["z"][..., head * d:(head + 1) * d]
            return (x,)
        handle = module.register_forward_pre_hook(swap)
        patched = plain(input_ids=batch.corrupted, attention_mask=batch.mask).logits[0, batch.last[0]]
        handle.remove()
    ld = lambda logits: float(logits[batch.answer[0]] - logits[batch.wrong[0]])  # noqa: E731
    assert float(found["denoise"][layer, 0, head]) == pytest.approx(ld(patched) - ld(corrupted), abs=1e-5)
    assert abs(ld(patched) - ld(corrupted)) > 1e-4  # a patch that moved something


# --- the table, its intervals and the run ---------------------------------------------------------------------


def test_the_fraction_is_the_ratio_of_sums_over_pairs(circuit_run):
    rows = circuit_run["patching"]
    about = circuit_run.provenance.models[0].extra["patching"]
    assert about["pairs"] == 16 and about["clean_right"] == 16
    one = rows[(rows["method"] == "denoise") & (rows["label"] == "L0H0")].set_index("target")
    # logit_diff is the mean effect over pairs, fraction that sum over the summed full differences
    assert (one["count"] == 16).all()
    assert one.loc["fraction", "sum"] == pytest.approx(one.loc["logit_diff", "sum"])
    assert one.loc["logit_diff", "value"] == pytest.approx(one.loc["logit_diff", "sum"] / 16)
    full = about["mean_logit_difference"]["clean"] - about["mean_logit_difference"]["corrupted"]
    assert one.loc["fraction", "full_difference"] == pytest.approx(16 * full, rel=1e-6)
    assert one.loc["fraction", "value"] == pytest.approx(one.loc["fraction", "sum"] / one.loc["fraction", "full_difference"])


def test_unit_values_agree_with_numpy():
    rng = np.random.default_rng(0)
    s, c = rng.normal(1, 1, (40, 3)), rng.uniform(1, 2, (40, 3))
    values = unit_values(s, c, PatchConfig(bootstrap=200))
    np.testing.assert_allclose(values["value"], s.sum(0) / c.sum(0))
    assert np.all(values["ci_low"] < values["value"]) and np.all(values["value"] < values["ci_high"])
    assert list(values["units"]) == [40, 40, 40]


def test_recall_at_counts_the_shared_top():
    exact = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    assert recall_at(exact, exact, 3) == 3
    assert recall_at(-exact, exact, 2) == 0


def test_the_run_loads_back_and_names_its_rules(circuit, tmp_path):
    path, _, pairs = circuit
    run = patch(str(path), pairs[:4], tmp_path / "out", device="cpu", bootstrap=0, attribution=False)
    back = headscan.load(tmp_path / "out")
    assert set(back.frames) == {"patching"}
    assert back.provenance.extra["bootstrap_unit"].startswith("pair")
    assert set(back["patching"]["method"]) == {"denoise", "noise"}  # no AtP, nor AtP*, when attribution is off
    assert len(back["patching"]) == len(run["patching"]) == 2 * 2 * 8


def test_by_position_patches_one_position_at_a_time(circuit):
    path, _, pairs = circuit
    run = patch(str(path), pairs[:4], device="cpu", bootstrap=0, attribution=False, by_position=True)
    rows = run["patching"]
    at = rows[(rows["method"] == "denoise") & (rows["target"] == "fraction") & rows["position"].notna()]
    l0h0 = at[at["label"] == "L0H0"].set_index("position")["value"]
    # the previous-token head matters where it wrote the earlier occurrence's successor: position 3 of BOS w0 w1 w2
    assert l0h0.idxmax() == 3 and l0h0.max() > 0.9
    assert l0h0.drop(3).abs().max() < 1e-3


# --- pairs and refusals -----------------------------------------------------------------------------------------


def test_generated_pairs_are_seeded_and_differ_in_one_word():
    for kind in ("ioi", "induction", "capitals"):
        first, again = generate_pairs(kind, 8, seed=3), generate_pairs(kind, 8, seed=3)
        assert first == again and first != generate_pairs(kind, 8, seed=4)
        for pair in first:
            clean, corrupted = pair.clean.split(), pair.corrupted.split()
            assert len(clean) == len(corrupted) and sum(a != b for a, b in zip(clean, corrupted)) == 1
            assert pair.answer != pair.wrong


def test_pairs_files_are_read_and_refused_by_line(tmp_path):
    good = tmp_path / "pairs.jsonl"
    good.write_text(json.dumps({"clean": "a b", "corrupted": "a c", "answer": " x", "wrong": " y"}) + "\n\n")
    assert read_pairs(good) == [Pair("a b", "a c", " x", " y")]
    for text, message in (("{oops", "line 2: not JSON"), ('{"clean": "a"}', "line 2: corrupted, answer, wrong"),
                          ('{"clean": "a", "corrupted": "b", "answer": "x", "wrong": "x"}', "line 2: answer and wrong")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(good.read_text().strip() + "\n" + text + "\n")
        with pytest.raises(CorpusError, match=message):
            read_pairs(bad)


def test_prompts_of_different_lengths_are_refused(circuit):
    path, _, _ = circuit
    model = load_model(str(path), device="cpu")
    with pytest.raises(CorpusError, match="pair 1 .* token for token"):
        encode_pairs(model, [Pair(" dog tree", " dog tree house", " dog", " tree")], batch_size=2)


def test_encoders_and_backward_paths_are_refused(tmp_path, circuit):
    bert = build_tiny_checkpoint(tmp_path / "bert", "bert")
    with pytest.raises(ModelLoadError, match="bidirectional"):
        patch(str(bert), [Pair("a b", "a c", " x", " y")], device="cpu")
    with pytest.raises(ConfigError, match="later layer"):
        PatchConfig(paths=("L1H0>L0H0",))
    path, _, pairs = circuit
    with pytest.raises(ConfigError, match="layer the model has not"):
        patch(str(path), pairs[:2], device="cpu", paths=("L0H0>L5H0:k",))


def test_the_cli_writes_pairs_and_patches(circuit, tmp_path):
    path, _, _ = circuit
    runner = CliRunner()
    pairs = tmp_path / "pairs.jsonl"
    result = runner.invoke(cli, ["pairs", "induction", "--n", "6", "-m", str(path), "--out", str(pairs)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["patch", "-m", str(path), "--pairs", str(pairs), "--path-top", "2", "--bootstrap",
                                 "50", "--device", "cpu", "--out", str(tmp_path / "out"), "-q"])
    assert result.exit_code == 0, result.output
    assert "L0H0>L1H0:k" in result.output and "6 of 6 clean prompts right" in result.output
    result = runner.invoke(cli, ["patch", "-m", str(path), "--pairs", str(tmp_path / "none.jsonl"), "--out",
                                 str(tmp_path / "x")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1].startswith("Error: pairs file")


def test_show_prints_a_patching_run_s_top_heads(circuit, tmp_path):
    path, _, pairs = circuit
    patch(str(path), pairs[:6], tmp_path / "out", device="cpu", bootstrap=50, attribution=False)
    result = CliRunner().invoke(cli, ["show", str(tmp_path / "out"), "--top", "2"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert {lines[1].split()[1], lines[2].split()[1]} == {"L0H0", "L1H0"}
    assert lines[-1].startswith("intervals resample pairs")


def test_atp_star_is_a_size_and_is_reported_beside_atp(circuit_run):
    """On two layers GradDrop has one term for a layer-0 head, its estimate with layer 1's gradient dropped, and
    the planted L0H0 acts only through layer 1: its AtP* is 0 by construction, the method's, not a fault here."""
    rows = circuit_run["patching"]
    star = rows[(rows["method"] == "atp_star_denoise") & (rows["target"] == "logit_diff")].set_index("label")
    assert (star["value"] >= 0).all()
    assert star["value"].idxmax() == "L1H0"
    assert star.loc["L0H0", "value"] < 1e-6 * star["value"].max()
    recall = circuit_run.provenance.models[0].extra["patching"]["atp_recall"]
    assert set(recall) == {"denoise", "noise", "atp_star_denoise", "atp_star_noise"}
    assert recall["atp_star_denoise"]["top_10"] == "8 of 8"


def test_paths_patch_a_grouped_query_receiver_s_key_value_head(tmp_path):
    """Llama with grouped queries (4 query heads reading 2 key/value heads), through a TransformerLens bridge: the
    key path into query heads 0 and 1 patches the same key/value head, so it has the same effect; their query
    paths are their own."""
    from headscan.testing import build_architecture_checkpoint

    folder = build_architecture_checkpoint(tmp_path / "llama", "llama", seed=5)
    model = load_model(str(folder), device="cpu")
    words = [w for w in ("dog", "tree", "house", "river", "king", "song", "water", "door", "fish", "ship")
             if len(model.tokenizer(" " + w, add_special_tokens=False)["input_ids"]) == 1][:7]
    clean = " " + " ".join(words[:5] + [words[1]])
    corrupted = " " + " ".join([words[0], words[6]] + words[2:5] + [words[1]])
    run = patch(str(folder), [Pair(clean, corrupted, " " + words[2], " " + words[3])] * 2, device="cpu",
                bootstrap=0, attribution=False, paths=("L0H0>L1H0", "L0H0>L1H1"))
    paths = run["paths"][run["paths"]["target"] == "logit_diff"].set_index(["label", "path"])["value"]
    assert paths.loc[("L1H0", "k")] == pytest.approx(paths.loc[("L1H1", "k")], abs=1e-9)
    assert paths.loc[("L1H0", "v")] == pytest.approx(paths.loc[("L1H1", "v")], abs=1e-9)
    assert paths.loc[("L1H0", "q")] != pytest.approx(paths.loc[("L1H1", "q")], abs=1e-9)


def test_the_report_section_lists_the_planted_heads_and_path(circuit, circuit_run, tmp_path):
    from headscan.analysis.runs import compare_runs
    from headscan.report.document import Bullets, Table
    from headscan.report.figures import Pngs
    from headscan.report.sections.patching import patching_section

    path, _, _ = circuit
    sweep = headscan.sweep(str(path), ["the dog saw the tree", "a king and a song"], device="cpu", bootstrap=0)
    comparison = compare_runs([sweep, circuit_run], ["sweep", "patch"])
    pngs = Pngs()
    blocks = patching_section(comparison, pngs)
    assert list(pngs) == ["patching.png"]
    heads, paths = [b.frame for b in blocks if isinstance(b, Table)]
    assert set(heads["head"][:2]) == {"L0H0", "L1H0"}
    first = paths.iloc[0]
    assert (first["sender"], first["receiver"], first["through"], first["q ≤ 0.05"]) == ("L0H0", "L1H0", "keys", "yes")
    assert (paths["q ≤ 0.05"] == "yes").sum() == 1
    said = next(b for b in blocks if isinstance(b, Bullets)).items[0]
    assert "16 of 16 clean prompts" in said and "AtP*" in said
