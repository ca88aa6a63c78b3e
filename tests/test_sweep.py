"""The sweep on tiny random GPT-2 and BERT checkpoints: padding, batch size, determinism, combining, provenance."""

import json

import numpy as np
import pandas as pd
import pytest

import headscan
from headscan import SweepConfig
from headscan.corpus import Corpus, Segment, read_corpus
from headscan.errors import ConfigError, HeadscanError
from headscan.metrics import metric_names
from headscan.scan import sweep, sweep_model
from headscan.tables import load, merge_tables

CONFIG = SweepConfig(device="cpu", bootstrap=20)


def corpus_of(*texts):
    return Corpus("test", "text", "", tuple(Segment(t, i + 1) for i, t in enumerate(texts)))


LONG = "the old man walked down to the river and looked at the boats for a long time before going home"
SHORT = "a dog ran"


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_padding_inside_a_batch_leaves_every_score_unchanged(tiny_models, arch):
    model = tiny_models[arch]
    alone = sweep_model(model, corpus_of(SHORT), CONFIG).heads
    # batched beside a long segment, SHORT is padded; subtracting LONG's own sums leaves SHORT's.
    both = sweep_model(model, corpus_of(SHORT, LONG), SweepConfig(device="cpu", batch_size=2, bootstrap=0)).heads
    long_only = sweep_model(model, corpus_of(LONG), CONFIG).heads
    np.testing.assert_allclose(both["sum"] - long_only["sum"], alone["sum"], atol=1e-5)
    np.testing.assert_allclose(both["count"] - long_only["count"], alone["count"])


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_scores_do_not_depend_on_batch_size(tiny_models, arch):
    corpus = read_corpus("builtin", limit=12)
    one, offsets_one = (sweep_model(tiny_models[arch], corpus, SweepConfig(device="cpu", batch_size=1)).frames[name]
                        for name in ("heads", "offsets"))
    five, offsets_five = (sweep_model(tiny_models[arch], corpus, SweepConfig(device="cpu", batch_size=5)).frames[name]
                          for name in ("heads", "offsets"))
    for column in ("value", "sum", "count", "ci_low", "ci_high"):
        np.testing.assert_allclose(one[column], five[column], atol=1e-5, err_msg=column)
    np.testing.assert_allclose(offsets_one["value"], offsets_five["value"], atol=1e-5)


def test_sweep_is_deterministic(tiny_models):
    corpus = read_corpus("builtin", limit=6)
    first = sweep_model(tiny_models["bert"], corpus, CONFIG).heads
    second = sweep_model(tiny_models["bert"], corpus, CONFIG).heads
    pd.testing.assert_frame_equal(first, second)


def float32_sum_tolerance(whole: pd.DataFrame) -> np.ndarray:
    """How far two float32 sums of one row's terms may lie apart when only their order differs.

    A float32 sum of n terms is off by at most about n * eps32 * sum(|term|) (Higham's bound, eps32 = 2^-23); two
    such sums of the same terms, each over at most `count` terms, differ by at most twice that. Attention metrics are
    shares, distances and entropies (no term below 0), so sum(|term|) is the row's own |sum|. The model runs in
    float64 (below), so what reaches the float32 sums is the same up to one rounding per term, well inside the bound.
    The signed logit terms (dla) are summed in float64, whose bound is 2^29 times smaller: |sum| stands in for
    sum(|term|) unless their terms cancel by more than that.
    This is a property of float32, not of one machine's BLAS or thread count.
    """
    eps32 = float(np.finfo(np.float32).eps)
    return 2 * whole["count"].to_numpy(float) * eps32 * whole["sum"].abs().to_numpy(float)


def test_sweeps_of_disjoint_halves_combine_exactly(tiny_gpt2):
    from headscan.models import load_model

    # float64 weights and activations: which rows share a batch then moves the logits' float64 dla terms by ~1e-16,
    # not float32's ~1e-7 (whose shift, over a few layers of matmuls, depends on the machine's kernels)
    model = load_model(str(tiny_gpt2), device="cpu", dtype="float64")
    corpus = read_corpus("builtin", limit=10)
    halves = [Corpus("h", "text", "", corpus.segments[:5]), Corpus("h", "text", "", corpus.segments[5:])]
    swept = sweep_model(model, corpus, CONFIG)
    whole = swept.heads
    parts = [sweep_model(model, half, CONFIG) for half in halves]
    both = merge_tables(parts)
    combined = both.heads
    pd.testing.assert_frame_equal(combined[["model", "layer", "head", "metric", "count"]],
                                  whole[["model", "layer", "head", "metric", "count"]])
    tolerance = float32_sum_tolerance(whole)
    defined = whole["count"].to_numpy() > 0
    np.testing.assert_array_less(np.abs(combined["sum"] - whole["sum"]).to_numpy()[defined], tolerance[defined] + 1e-300)
    np.testing.assert_array_less(np.abs(combined["value"] - whole["value"]).to_numpy()[defined],
                                 (tolerance / np.maximum(whole["count"].to_numpy(float), 1))[defined] + 1e-300)
    assert np.isnan(combined["value"].to_numpy()[~defined]).all() and np.isnan(whole["value"].to_numpy()[~defined]).all()
    assert {name: len(frame) for name, frame in both.frames.items()} == \
        {name: len(frame) for name, frame in swept.frames.items()}  # one row per key, as in the whole sweep
    # read off the weights, not summed: one copying score per head (merge_tables once kept each part's rows)
    assert len(both["weights"]) == model.n_layers * model.n_heads
    np.testing.assert_array_equal(both["weights"]["value"], swept["weights"]["value"])


def test_causal_next_token_is_zero_and_undefined_sep_is_nan(tiny_models):
    heads = sweep_model(tiny_models["gpt2"], read_corpus("builtin", limit=4), CONFIG).heads
    assert (heads.loc[heads.metric == "next_token", "value"] == 0).all()
    sep = heads[heads.metric == "sep"]
    assert sep["value"].isna().all() and (sep["count"] == 0).all()  # GPT-2 has no [SEP]: NaN, never -1
    assert not (heads["value"] == -1).any()


def test_tables_have_every_head_for_every_metric(tiny_models, tmp_path, tiny_gpt2, tiny_bert):
    sweep([str(tiny_gpt2), str(tiny_bert)], "builtin", tmp_path / "out", SweepConfig(device="cpu", limit=5, bootstrap=20))
    heads = pd.read_parquet(tmp_path / "out" / "heads.parquet")
    per_model = heads.groupby(["model", "metric"]).size()
    assert set(per_model) == {2 * 4}  # 2 layers x 4 heads, for every metric of both models
    assert set(heads["metric"]) == set(metric_names())
    assert list(heads.columns) == list(headscan.TABLES["heads"].columns)
    offsets = pd.read_parquet(tmp_path / "out" / "offsets.parquet")
    assert sorted(offsets["offset"].unique()) == list(range(-8, 9))
    assert heads["label"].str.fullmatch(r"L\d+H\d+").all()
    defined = heads["count"] > 0
    assert heads.loc[~defined, ["value", "ci_low", "ci_high"]].isna().all().all()  # NaN exactly where undefined
    rows = heads[defined]
    assert rows[["value", "ci_low", "ci_high"]].notna().all().all()
    assert (rows["ci_low"] <= rows["value"] + 1e-12).all() and (rows["value"] <= rows["ci_high"] + 1e-12).all()


def test_provenance_is_recorded_everywhere(tmp_path, tiny_bert):
    out = tmp_path / "out"
    sweep([str(tiny_bert)], "builtin", out, SweepConfig(device="cpu", limit=3, bootstrap=0), command="test")
    run = json.loads((out / "run.json").read_text())
    assert run["corpus"]["kind"] == "builtin" and len(run["corpus"]["sha256"]) == 64
    assert run["corpus"]["n_segments"] == 3
    model = run["models"][0]
    assert model["family"] == "bidirectional" and model["n_layers"] == 2 and model["n_heads"] == 4
    assert model["revision"].startswith("sha256:") and model["n_tokens"] > 0
    for package in ("torch", "transformers", "transformer_lens"):
        assert run["versions"][package]
    assert run["config"]["device"] == "cpu" and run["command"] == "test"
    loaded = load(out)
    assert loaded.provenance.to_json() == run
    assert loaded.provenance.models[0].n_layers == 2 and loaded.provenance.corpus.kind == "builtin"
    import pyarrow.parquet as pq

    assert json.loads(pq.read_schema(out / "heads.parquet").metadata[b"headscan"]) == run


def test_a_failed_sweep_leaves_the_output_folder_as_it_was(tmp_path, tiny_bert):
    out = tmp_path / "out"
    sweep([str(tiny_bert)], "builtin", out, SweepConfig(device="cpu", limit=2, bootstrap=0))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(HeadscanError):
        sweep([str(tiny_bert), str(tmp_path / "no-such-model")], "builtin", out, SweepConfig(device="cpu", limit=2))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_intervals_shrink_as_the_corpus_grows(tiny_models):
    widths = []
    for limit in (8, 64):
        heads = sweep_model(tiny_models["bert"], read_corpus("builtin", limit=limit), SweepConfig(device="cpu", bootstrap=100)).heads
        shares = heads[heads.metric.isin(["prev_token", "next_token", "first_token"])]
        widths.append((shares["ci_high"] - shares["ci_low"]).median())
    assert widths[1] < widths[0] / 2


@pytest.mark.parametrize(
    "options, message",
    [
        ({"specials": "drop"}, "specials must be one of keep, exclude; got 'drop'"),
        ({"device": "tpu"}, "device must be one of auto, cpu, cuda, mps; got 'tpu'"),
        ({"dtype": "int8"}, "dtype must be one of float32, float16, bfloat16, float64; got 'int8'"),
        ({"batch_size": 0}, "batch_size must be a whole number >= 1, got 0"),
        ({"max_len": 2}, "max_len must be a whole number >= 4, got 2"),
        ({"max_offset": 0}, "max_offset must be a whole number >= 1, got 0"),
        ({"limit": 0}, "limit must be a whole number >= 1, got 0"),
        ({"seed": -1}, "seed must be a whole number >= 0, got -1"),
        ({"bootstrap": 1}, "bootstrap must be 0 (no intervals) or at least 20, got 1: fewer replicates cannot place "
                           "the 2.5% and 97.5% points"),
        ({"max_len": 64.0}, "max_len must be a whole number >= 4, got 64.0"),
        ({"prepend_bos": "no"}, "prepend_bos must be None, True or False, got 'no'"),
    ],
)
def test_bad_config_names_the_setting(options, message):
    with pytest.raises(ConfigError) as caught:
        SweepConfig(**options)
    assert str(caught.value) == message
    assert caught.value.setting == next(iter(options))


def test_sweep_takes_a_model_string_a_list_of_texts_and_settings_as_keywords(tiny_bert):
    tables = headscan.sweep(str(tiny_bert), ["The cat sat on the mat.", "  ", "It slept."], device="cpu", bootstrap=0)
    assert tables.provenance.corpus.kind == "list" and tables.provenance.corpus.n_segments == 2
    assert tables.provenance.command == f"headscan.sweep([{str(tiny_bert)!r}], <3 texts>, device='cpu', bootstrap=0)"
    assert tables.provenance.config["bootstrap"] == 0
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['max_length'\]"):
        headscan.sweep(str(tiny_bert), ["a"], max_length=3)


def test_sweep_model_returns_the_tables_sweep_returns(tiny_models, tiny_bert):
    corpus = read_corpus("builtin", limit=3)
    alone = sweep_model(tiny_models["bert"], corpus, CONFIG)
    through_sweep = sweep([str(tiny_bert)], corpus, config=CONFIG)
    assert type(alone) is type(through_sweep) and list(alone.frames) == list(through_sweep.frames)
    for name in alone.frames:
        pd.testing.assert_frame_equal(alone[name], through_sweep[name])
    assert alone.provenance.models[0].n_tokens == through_sweep.provenance.models[0].n_tokens


def test_excluding_specials_removes_the_sink_from_the_scores(tiny_models):
    corpus = read_corpus("builtin", limit=4)
    kept = sweep_model(tiny_models["bert"], corpus, CONFIG).heads
    left_out = sweep_model(tiny_models["bert"], corpus, SweepConfig(device="cpu", bootstrap=20, specials="exclude")).heads
    assert kept.loc[kept.metric == "first_token", "value"].notna().all()
    assert left_out.loc[left_out.metric == "first_token", "value"].isna().all()  # [CLS] left out: it does not count
    assert (left_out.loc[left_out.metric == "sep", "count"] == 0).all()
    # fewer queries count once [CLS] and [SEP] are left out
    assert (left_out.loc[left_out.metric == "self", "count"].values < kept.loc[kept.metric == "self", "count"].values).all()


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_a_sweep_of_split_windows_counts_a_segment_as_one_unit(tiny_models, arch):
    """The windows themselves are checked in test_corpus.py; here, that the sweep keeps them as one unit."""
    from headscan.corpus import encode

    model = tiny_models[arch]
    corpus = corpus_of(LONG + " " + LONG, SHORT)
    split = encode(corpus, model, 8, long="split")
    tables = sweep_model(model, corpus, SweepConfig(device="cpu", bootstrap=20, max_len=8, long="split",
                                                    bootstrap_unit="segment"))
    assert tables.provenance.models[0].n_tokens == split.n_tokens and tables.provenance.config["long"] == "split"
    assert tables.heads.query("metric == 'self'")["units"].max() == 2  # the windows of a segment are one unit


@pytest.mark.parametrize("arch", ["gpt2", "bert", "llama", "gemma2"])
def test_a_chunked_sweep_writes_the_eager_tables(tmp_path, arch, ewt_dev):
    """Every table, syntax included, from blocks of 5 queries (not a divisor of the lengths), with padding;
    Llama has grouped-query attention, Gemma 2 soft-capping and a sliding window of 6 on alternate layers."""
    import headscan
    from headscan.testing import build_tiny_checkpoint
    from headscan.testing.architectures import build_architecture_checkpoint

    build = build_tiny_checkpoint if arch in ("gpt2", "bert") else build_architecture_checkpoint
    model = str(build(tmp_path / arch, arch))
    settings = dict(limit=9, max_len=48, batch_size=3, bootstrap=20)
    eager = headscan.sweep(model, ewt_dev, attention="eager", **settings)
    # blocks of 5 queries; and, with no query chunk, each layer in one block (these lengths are far below 8 MiB),
    # its layers then scored together as in eager mode
    for chunked in (headscan.sweep(model, ewt_dev, attention="chunked", query_chunk=chunk, **settings)
                    for chunk in (5, None)):
        assert set(eager.frames) == set(chunked.frames) >= {"heads", "offsets", "positions", "syntax", "weights"}
        for name, frame in eager.frames.items():
            other = chunked.frames[name]
            np.testing.assert_array_equal(frame["count"], other["count"], err_msg=name)
            np.testing.assert_allclose(other["value"], frame["value"], rtol=0, atol=1e-5, err_msg=name)
            if "chance" in frame:
                np.testing.assert_allclose(other["chance"], frame["chance"], rtol=0, atol=1e-5, err_msg=name)
        assert chunked.provenance.models[0].extra["attention"] == "chunked"
    assert eager.provenance.models[0].extra["attention"] == "eager"


@pytest.mark.parametrize("arch", ["gpt2", "bert", "llama", "gemma2"])
def test_an_eager_layer_past_the_block_size_is_scored_in_blocks_of_queries(tmp_path, arch, ewt_dev, monkeypatch):
    """A layer whose eager pattern passes EAGER_LAYER_BYTES is scored over views of its query rows (blocks of 5
    here): every table, syntax and values included, equals the whole pattern's; the model still runs eagerly."""
    import headscan
    from headscan.scan import layers
    from headscan.testing import build_tiny_checkpoint
    from headscan.testing.architectures import build_architecture_checkpoint

    build = build_tiny_checkpoint if arch in ("gpt2", "bert") else build_architecture_checkpoint
    model = str(build(tmp_path / arch, arch))
    settings = dict(limit=9, max_len=48, batch_size=3, bootstrap=20, attention="eager", query_chunk=5)
    whole = headscan.sweep(model, ewt_dev, **settings)
    blocks = []
    scored = layers.LayerHooks.pattern
    monkeypatch.setattr(layers, "EAGER_LAYER_BYTES", 1)
    monkeypatch.setattr(layers.LayerHooks, "pattern",
                        lambda self, layer, pattern, hook: blocks.append(hook) or scored(self, layer, pattern, hook))
    blocked = headscan.sweep(model, ewt_dev, **settings)
    assert any(getattr(hook, "stop", 0) == 5 for hook in blocks)  # it did go block by block
    assert set(whole.frames) == set(blocked.frames) >= {"heads", "offsets", "positions", "syntax", "weights"}
    for name, frame in whole.frames.items():
        other = blocked.frames[name]
        if name == "examples":  # units whose values differ by float32 rounding alone may swap ranks; values hold
            np.testing.assert_allclose(other["value"], frame["value"], rtol=0, atol=1e-5, err_msg=name)
            continue
        np.testing.assert_array_equal(frame["count"], other["count"], err_msg=name)
        np.testing.assert_allclose(other["value"], frame["value"], rtol=0, atol=1e-5, err_msg=name)
        if "chance" in frame:
            np.testing.assert_allclose(other["chance"], frame["chance"], rtol=0, atol=1e-5, err_msg=name)
    assert blocked.provenance.models[0].extra["attention"] == "eager"


def test_layers_in_one_block_and_layers_in_several_keep_their_order(tmp_path, ewt_dev, monkeypatch):
    """Chunked mode stacks a layer that fits in one block with the next such layers; a layer in between that
    comes in blocks must not be scored after them (layers 1 and 2 would come out swapped)."""
    import headscan
    from headscan.models import chunked
    from headscan.testing import build_tiny_checkpoint

    model = str(build_tiny_checkpoint(tmp_path / "gpt2", "gpt2", n_layers=4))  # layers 0 and 2 whole, 1 and 3 not
    settings = dict(limit=6, max_len=48, batch_size=3, bootstrap=0)
    eager = headscan.sweep(model, ewt_dev, attention="eager", **settings).frames["heads"]
    sized = chunked.block_rows

    def odd_layers_in_blocks_of_seven(query_chunk, batch, n_heads, n_keys, n_queries=None):
        layer = chunked._SESSIONS[-1].layer - 1  # the layer whose attention is being computed
        return 7 if layer % 2 else sized(query_chunk, batch, n_heads, n_keys, n_queries)

    monkeypatch.setattr(chunked, "block_rows", odd_layers_in_blocks_of_seven)
    mixed = headscan.sweep(model, ewt_dev, attention="chunked", **settings).frames["heads"]
    np.testing.assert_allclose(mixed["value"], eager["value"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("max_len", [129, 512])
def test_a_max_len_past_the_context_is_clamped_with_one_line(tiny_gpt2, tiny_models, tmp_path, max_len):
    """The tiny GPT-2 has a context of 128 tokens: --max-len 129 or 512 sweeps at 128, says so on the terminal and
    in the model's provenance, and the position buckets stop at the clamped length."""
    from click.testing import CliRunner

    from headscan.cli import cli

    text = tmp_path / "long.txt"
    text.write_text(" ".join([LONG] * 8) + "\n" + SHORT + "\n")  # the first line runs past 128 tokens
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["sweep", "-m", str(tiny_gpt2), "-c", str(text), "--max-len", str(max_len),
                                      "--bootstrap", "0", "-q", "--out", str(out)])
    assert result.exit_code == 0, result.output
    line = f"{tiny_gpt2}: --max-len {max_len} is past its context of 128 tokens; swept with --max-len 128"
    assert line in result.output.splitlines()
    run = load(out)
    model = run.provenance.models[0]
    assert (model.max_len, model.max_len_note, model.max_context) == (128, line, 128)
    assert run.provenance.config["max_len"] == max_len  # what was asked stays in the run's settings
    assert sorted(set(run.frames["positions"]["bucket"])) == [0, 1, 2, 4, 8, 16, 32, 64]  # [b, 2b) below 128
    n_short = len(tiny_models["gpt2"].token_ids([SHORT])[0])
    assert (model.n_truncated, model.n_tokens) == (1, 128 + n_short)  # the long line cut at 128 tokens



def test_kv_group_is_the_key_value_head_each_query_head_reads_under_gqa(tmp_path):
    """A tiny Llama with 4 query heads over 2 key/value heads: Llama's repeat_kv gives query head h the key/value
    head h // (4 // 2), so kv_group runs 0, 0, 1, 1 in every table with the column."""
    from transformers import AutoConfig

    from headscan.testing.architectures import build_architecture_checkpoint

    path = build_architecture_checkpoint(tmp_path / "llama", "llama")
    config = AutoConfig.from_pretrained(path)
    n_heads, n_kv = config.num_attention_heads, config.num_key_value_heads
    assert (n_heads, n_kv) == (4, 2)
    run = headscan.sweep(str(path), ["the cat sat on the mat", "a dog ran"], bootstrap=0, max_len=16)
    checked = 0
    for name, frame in run.frames.items():
        if "kv_group" in frame:
            assert (frame["kv_group"] == frame["head"] // (n_heads // n_kv)).all(), name
            assert sorted(set(zip(frame["head"], frame["kv_group"]))) == [(0, 0), (1, 0), (2, 1), (3, 1)], name
            checked += 1
    assert checked == len(run.frames)


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_layers_scored_together_give_the_tables_of_layers_scored_alone(tiny_models, arch, ewt_dev, monkeypatch):
    """Eager mode scores a batch's layers stacked along the batch axis (`STACK_BYTES`); with a limit of one byte
    each layer is scored alone, as chunked mode does. Every table, syntax and (GPT-2) dla included."""
    from headscan.scan import layers

    groups = []
    score_waiting = layers.LayerHooks._score_waiting

    def counting(self):
        groups.append(len(self.gathered.waiting))
        score_waiting(self)

    monkeypatch.setattr(layers.LayerHooks, "_score_waiting", counting)
    corpus = read_corpus(ewt_dev, limit=10)
    config = SweepConfig(device="cpu", batch_size=4, bootstrap=20)
    together = sweep_model(tiny_models[arch], corpus, config)
    assert max(groups) == tiny_models[arch].n_layers  # every layer of a batch in one group
    groups.clear()
    monkeypatch.setattr(layers, "STACK_BYTES", 1)
    alone = sweep_model(tiny_models[arch], corpus, config)
    assert max(groups) == 1
    assert set(together.frames) == set(alone.frames) >= {"heads", "offsets", "positions", "syntax", "value"}
    for name, frame in together.frames.items():
        other = alone.frames[name]
        np.testing.assert_array_equal(frame["count"], other["count"], err_msg=name)
        for column in ("value", "chance", "ci_low", "ci_high"):
            np.testing.assert_allclose(frame[column], other[column], rtol=0, atol=1e-6, err_msg=f"{name} {column}")


def test_a_state_without_a_family_still_makes_its_tables(tiny_models):
    """A state from elsewhere (merged, hand-built) may carry no model family: its tables are made, the family left
    empty."""
    import sys

    from headscan.scan.reduce import accumulate

    finish = sys.modules["headscan.scan.finish"].finish
    state = accumulate(tiny_models["bert"], corpus_of(SHORT, LONG), CONFIG)
    state.model["family"] = None
    frames = finish(state, CONFIG)
    assert frames["heads"]["family"].isna().all() and len(frames["heads"]) > 0
