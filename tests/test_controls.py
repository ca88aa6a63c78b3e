"""Control models and the bootstrap unit by default.

- random-init: the control's weights are not the trained ones, come from the config's own initialiser (by
  Hugging Face's own ``_init_weights`` statistics: N(0, initializer_range), norm gains 1), are the same for the
  same seed on both hooking paths, and two sweeps with the same seed give equal tables;
- shuffled-words: each word keeps its head word (checked word by word on EWT trees), the order is seeded by
  the segment's index, not by where it is read;
- merged shards with controls equal the unsharded sweep, and a stopped sweep with controls resumes;
- ``bootstrap_unit="auto"`` resolves to documents exactly where the corpus has documents of several segments.
"""

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from conftest import assert_merged_equals_whole, paragraph_corpus

import headscan
from headscan.cli import cli
from headscan.config import SweepConfig
from headscan.corpus import pack_corpus, read_corpus, shuffle_words
from headscan.corpus.shuffle import shuffled_segment
from headscan.models import load_model
from headscan.scan import merge, sweep
from headscan.scan.plan import resolve_unit
from headscan.tables import load


def matrices(model) -> dict[str, torch.Tensor]:
    """Every weight matrix of the model (linear layers and embeddings), by name."""
    return {name: p.detach().clone() for name, p in model.hf_model.named_parameters() if p.ndim == 2}


# --- random-init --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_distilbert(tmp_path_factory):
    """A checkpoint on the hf_hooks path (TransformerLens has no DistilBERT adapter)."""
    from headscan.testing import build_architecture_checkpoint

    return build_architecture_checkpoint(tmp_path_factory.mktemp("distilbert"), "distilbert", seed=3)


@pytest.mark.parametrize("which", ["tiny_gpt2", "tiny_distilbert"])
def test_random_init_draws_new_weights_from_the_configs_initialiser_reproducibly(which, request):
    folder = str(request.getfixturevalue(which))
    trained = load_model(folder)
    control, again = (load_model(folder, control="random-init", control_seed=7) for _ in range(2))
    assert control.name == f"{folder} [random init]" and control.path == trained.path
    assert control.path == {"tiny_gpt2": "transformer_lens", "tiny_distilbert": "hf_hooks"}[which]
    weights, trained_weights = matrices(control), matrices(trained)
    assert len(weights) > 6 and weights.keys() == trained_weights.keys()
    for name, weight in weights.items():
        assert not torch.equal(weight, trained_weights[name]), name  # not the trained weights
        assert torch.equal(weight, matrices(again)[name]), name  # the same seed, the same weights
    # Hugging Face's initialiser: the token embedding drawn from N(0, initializer_range)
    scale = control.hf_model.config.initializer_range
    drawn = control.hf_model.get_input_embeddings().weight.detach()
    assert abs(drawn.std().item() - scale) < 0.1 * scale and abs(drawn.mean().item()) < 0.1 * scale
    # the trained model's tokenizer and special tokens
    assert control.token_ids(["the cat sat on the mat"]) == trained.token_ids(["the cat sat on the mat"])
    assert control.special_token_ids == trained.special_token_ids and control.prepend_bos == trained.prepend_bos
    assert control.extra["control"] == "random-init" and control.extra["control_of"] == folder
    assert control.extra["control_seed"] == 7 and "initializer_range" in control.extra["initializer"]


RANDOM_INIT = dict(device="cpu", bootstrap=20, window=3, values=False, control="random-init", seed=3)


@pytest.fixture(scope="module")
def with_random_init(tmp_path_factory, tiny_bert):
    """A sweep of tiny BERT and its random-init control over 12 lines in paragraphs of 3."""
    corpus = paragraph_corpus(tmp_path_factory.mktemp("random-init"), 12)
    return corpus, sweep([str(tiny_bert)], corpus, **RANDOM_INIT)


def test_a_random_init_sweep_with_the_same_seed_gives_equal_tables(tiny_bert, with_random_init):
    model, (corpus, first) = str(tiny_bert), with_random_init
    second = sweep([model], corpus, **RANDOM_INIT)
    control = f"{model} [random init]"
    assert list(dict.fromkeys(first.heads["model"])) == [model, control]
    for name in first.frames:
        pd.testing.assert_frame_equal(first[name], second[name], check_exact=True)
    heads = first.heads.set_index(["model", "layer", "head", "metric"])["value"]
    assert not np.allclose(heads.loc[model], heads.loc[control], equal_nan=True)
    provenance = first.provenance.model(control)
    assert (provenance.control, provenance.control_of, provenance.extra["control_seed"]) == ("random-init", model, 3)
    assert first.provenance.model(model).control is None
    other = sweep([model], corpus, **(RANDOM_INIT | {"control_seed": 4})).heads.set_index(heads.index.names)["value"]
    np.testing.assert_array_equal(other.loc[model], heads.loc[model])  # the bootstrap's seed is still 3
    assert not np.allclose(other.loc[control], heads.loc[control], equal_nan=True)


# --- shuffled words -----------------------------------------------------------------------------------------


def test_shuffled_words_keep_each_words_head_and_are_seeded_by_the_segments_index(ewt_dev):
    corpus = read_corpus(ewt_dev, limit=40)
    shuffled = shuffle_words(corpus, seed=5)
    moved = 0
    for index, (before, after) in enumerate(zip(corpus.segments, shuffled.segments)):
        assert sorted(after.words) == sorted(before.words) and after.text == " ".join(after.words)
        # each word's head word and relation, by hand: find the word again by its (form, relation, head form)
        def arcs(segment):
            return sorted((w, r, segment.words[h - 1] if h else None)
                          for w, h, r in zip(segment.words, segment.heads, segment.deprels))
        assert arcs(after) == arcs(before)
        assert [after.text[a:b] for a, b in after.spans] == list(after.words)
        moved += after.words != before.words
        # the same order whether read alone, in a slice or from another shard's window
        assert shuffled_segment(before, 5, index) == after == shuffle_words(corpus, 5).segments[index]
        if index >= 10:
            assert shuffled.segments[10:][index - 10] == after
    assert moved >= 35
    assert any(a.words != b.words for a, b in zip(shuffle_words(corpus, seed=6).segments, shuffled.segments))
    assert np.array_equal(shuffled.segment_documents, corpus.segment_documents)


def test_shuffled_words_on_plain_text_permute_whitespace_separated_words():
    corpus = read_corpus("builtin", limit=3)
    for before, after in zip(corpus.segments, shuffle_words(corpus, 0).segments):
        assert sorted(after.text.split(" ")) == sorted(before.text.split())


def test_a_shuffled_words_control_is_swept_under_its_own_name(tiny_gpt2, ewt_dev):
    tables = sweep([str(tiny_gpt2)], ewt_dev, limit=8, device="cpu", bootstrap=0, values=False,
                   control=("shuffled-words",))
    name = f"{tiny_gpt2} [shuffled words]"
    assert list(dict.fromkeys(tables["syntax"]["model"])) == [str(tiny_gpt2), name]
    provenance = tables.provenance.model(name)
    assert (provenance.control, provenance.control_of) == ("shuffled-words", str(tiny_gpt2))
    # the same weights, other text: the weights table is the trained model's
    weights = tables["weights"].set_index(["model", "layer", "head"])["value"]
    np.testing.assert_array_equal(weights.loc[str(tiny_gpt2)], weights.loc[name])
    with pytest.raises(headscan.errors.ConfigError, match="repeat-random has none"):
        sweep([str(tiny_gpt2)], "repeat-random", control="shuffled-words", device="cpu")


# --- shards, merge, resume ----------------------------------------------------------------------------------


def test_merged_shards_with_a_control_equal_the_unsharded_sweep(tmp_path, tiny_bert):
    """Shuffled words: each shard must permute its segments as the whole sweep does (by segment index). A
    random-init control is built the same in every shard (the same seed: the test above)."""
    corpus = paragraph_corpus(tmp_path, 18)
    settings = dict(device="cpu", bootstrap=20, window=4, batch_size=1, values=False, control=("shuffled-words",))
    whole = sweep([str(tiny_bert)], corpus, tmp_path / "whole", **settings)
    parts = [tmp_path / f"part-{k}" for k in range(2)]
    for k, part in enumerate(parts):
        sweep([str(tiny_bert)], corpus, part, shard=f"{k}/2", **settings)
    merged = merge(parts, tmp_path / "merged")
    assert len(set(whole.heads["model"])) == 2
    assert_merged_equals_whole(whole, merged)
    assert [m.control for m in load(tmp_path / "merged").provenance.models] == [None, "shuffled-words"]
    assert any(p.name.endswith(".shuffled-words.npz") for p in (parts[0] / "state").iterdir())


def test_a_stopped_sweep_with_a_control_resumes_to_the_same_tables(tmp_path, tiny_bert, with_random_init, monkeypatch):
    from headscan.errors import SweepInterrupted
    from headscan.scan import reduce

    corpus, whole = with_random_init
    calls = []
    original = reduce._sweep_window

    def stop_in_the_control(*args, **kwargs):  # the trained model's 4 windows finish; the control stops in its 2nd
        calls.append(1)
        if len(calls) == 6:
            raise SweepInterrupted("stopped")  # as should_stop() does between two batches
        return original(*args, **kwargs)

    monkeypatch.setattr(reduce, "_sweep_window", stop_in_the_control)
    with pytest.raises(SweepInterrupted):
        sweep([str(tiny_bert)], corpus, tmp_path / "out", save_every=0, **RANDOM_INIT)
    monkeypatch.undo()
    saved = sorted(p.name for p in (tmp_path / "out.partial").iterdir())
    assert len(saved) == 2 and any(name.endswith(".random-init.npz") for name in saved)
    resumed = sweep([str(tiny_bert)], corpus, tmp_path / "out", **RANDOM_INIT)
    for name in whole.frames:
        pd.testing.assert_frame_equal(whole[name], resumed[name], check_exact=True)


# --- the command line ---------------------------------------------------------------------------------------


def test_the_command_line_sweeps_controls_and_show_names_them(tmp_path, tiny_gpt2):
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["sweep", "-m", str(tiny_gpt2), "--corpus", "builtin", "--limit", "4", "--out",
                                      str(out), "--device", "cpu", "--bootstrap", "20", "--no-values", "--control",
                                      "random-init", "--control-seed", "2", "-q"])
    assert result.exit_code == 0, result.output
    assert "intervals resample segments (auto), since each segment is its own document\n" in result.output
    assert load(out).provenance.config["control"] == ["random-init"]
    shown = CliRunner().invoke(cli, ["show", str(out), "--metric", "prev_token", "--top", "2"])
    assert shown.exit_code == 0 and f"{tiny_gpt2} [random init]" in shown.output
    assert f"{tiny_gpt2} [random init]: control of {tiny_gpt2}, the same architecture and tokenizer, weights " \
           f"drawn from the config's initialiser (seed 2)" in shown.output
    described = CliRunner().invoke(cli, ["models", f"{tiny_gpt2} [random init]"])
    assert described.exit_code == 0 and "untrained weights" in described.output and "transformer_lens" in described.output
    assert "--control random-init" in CliRunner().invoke(cli, ["models"]).output


# --- the bootstrap unit by default --------------------------------------------------------------------------


def conllu(sentences: int, newdoc_every: int | None) -> str:
    blocks = []
    for i in range(sentences):
        head = ["# newdoc"] if newdoc_every and i % newdoc_every == 0 else []
        blocks.append("\n".join(head + ["# text = a b", "1\ta\ta\tX\t_\t_\t2\tdep\t_\t_", "2\tb\tb\tX\t_\t_\t0\troot\t_\t_"]))
    return "\n\n".join(blocks) + "\n\n"


@pytest.mark.parametrize("kind, content, options, unit", [
    ("conllu, # newdoc every 2 sentences", conllu(6, 2), {}, "document"),
    ("conllu without # newdoc", conllu(6, None), {}, "segment"),
    ("conllu, one sentence a document", conllu(6, 1), {}, "segment"),
    ("conllu, one document", conllu(6, 6), {}, "segment"),
    ("text in paragraphs", "a b\nc d\n\ne f\ng h\n", {}, "document"),
    ("text without blank lines", "a b\nc d\ne f\n", {}, "segment"),
    ("jsonl with a document field", '{"text": "a", "d": 1}\n{"text": "b", "d": 1}\n{"text": "c", "d": 2}\n',
     {"document_field": "d"}, "document"),
    ("jsonl without one", '{"text": "a", "d": 1}\n{"text": "b", "d": 1}\n', {}, "segment"),
    ("builtin", None, {}, "segment"),
    ("repeat-random", None, {}, "segment"),
])
def test_the_auto_unit_is_documents_exactly_where_documents_hold_several_segments(tmp_path, kind, content, options, unit):
    if content is None:
        source = kind
    else:
        source = tmp_path / ("c.conllu" if kind.startswith("conllu") else "c.jsonl" if kind.startswith("jsonl") else "c.txt")
        source.write_text(content)
    corpus = read_corpus(source, **options)
    config, why = resolve_unit(corpus, SweepConfig())
    assert config.bootstrap_unit == unit and why.startswith(f"auto: {unit}s, since")
    assert ("cannot be resampled" in why) == (kind == "conllu, one document")
    # an explicit unit is kept; packed sentences are each their own document
    assert resolve_unit(corpus, SweepConfig(bootstrap_unit="segment"))[0].bootstrap_unit == "segment"
    if kind.startswith("conllu"):
        packed = pack_corpus(corpus, "sentences", 4)
        assert resolve_unit(packed, SweepConfig())[0].bootstrap_unit == "segment"


def test_the_resolved_unit_is_recorded_and_used(tmp_path, tiny_bert):
    corpus = paragraph_corpus(tmp_path, 9)
    tables = sweep([str(tiny_bert)], corpus, tmp_path / "out", device="cpu", bootstrap=20, values=False)
    assert tables.provenance.config["bootstrap_unit"] == "document"
    assert tables.provenance.extra["bootstrap_unit"].startswith("auto: documents, since the corpus has 3 documents")
    assert tables.heads["units"].max() == 3  # three paragraphs were resampled, not nine lines
    explicit = sweep([str(tiny_bert)], corpus, device="cpu", bootstrap=20, values=False, bootstrap_unit="document")
    for name in tables.frames:
        pd.testing.assert_frame_equal(tables[name], explicit[name], check_exact=True)
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text("".join(f'{{"text": "line {i}", "doc": {i // 3}}}\n' for i in range(9)))
    by_field = sweep([str(tiny_bert)], jsonl, device="cpu", bootstrap=20, values=False, document_field="doc")
    assert by_field.provenance.config["bootstrap_unit"] == "document" and by_field.heads["units"].max() == 3
