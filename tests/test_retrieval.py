"""Retrieval heads (Wu et al. 2024) and streaming heads (DuoAttention), against independent answers.

- the answer gate against the ``rouge_score`` package itself (Porter stems of every EWT word, recalls);
- the decoding rows against Hugging Face's own eager attention with a key/value cache (``output_attentions``),
  on both hooking paths, one of them prefilling the prompt in four pieces where Hugging Face takes one pass, and the copying steps against Wu et al.'s ``retrieval_calculate`` as a plain loop;
- a planted checkpoint whose head copies from the needle scores exactly 1, the others 0;
- streaming against a plain loop over Hugging Face's eager attention on a 1k-token segment, eager and chunked,
  and a sliding-window model whose heads see nothing beyond their window scores exactly 0.
"""

import dataclasses
import inspect
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from conftest import NEEDLE_ANSWER, NEEDLE_HAYSTACK, NEEDLE_QUESTION, assert_a_stopped_run_resumes, planted_needles

import headscan
from headscan.cli import cli
from headscan.corpus.needles import read_needles, sentences
from headscan.corpus.rouge import porter_stem, rouge1_recall
from headscan.errors import ModelLoadError, TablesError
from headscan.metrics import AttentionBatch
from headscan.metrics.retrieval import chance_steps
from headscan.models.decode import PREFILL_CHUNK
from headscan.retrieval_config import RetrievalConfig
from headscan.testing import build_architecture_checkpoint, build_tiny_checkpoint

ANSWER, QUESTION, HAYSTACK = NEEDLE_ANSWER, NEEDLE_QUESTION, NEEDLE_HAYSTACK


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A copying checkpoint, its needles file and a haystack file (none of the answer's words in it)."""
    return planted_needles(tmp_path_factory.mktemp("retrieval"), through_head=False)


SMALL = {"lengths": (160, 320), "depths": (0.0, 0.5, 1.0), "bootstrap": 20}


# --- the gate --------------------------------------------------------------------------------------------------


def test_stems_and_recall_equal_rouge_score(ewt_dev):
    """Every word of EWT dev stems as NLTK's Porter stemmer (rouge_score's) does; recalls equal rouge_score's."""
    rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")
    from nltk.stem import porter

    words = set()
    for line in ewt_dev.read_text(encoding="utf-8").splitlines():
        if line[:1].isdigit():
            words.update(re.sub(r"[^a-z0-9]+", " ", line.split("\t")[1].lower()).split())
    stemmer = porter.PorterStemmer()
    assert len(words) > 4000
    assert [w for w in sorted(words) if porter_stem(w) != stemmer.stem(w)] == []
    scorer = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)
    needles, _ = read_needles()
    pairs = [(n.answer, response) for n in needles for response in
             (n.answer, n.needle, n.answer.upper() + "!!", " ".join(n.answer.split()[::2]), "", "I do not know.",
              n.answer.replace(" ", "-"), "watched lanterns; boating at dusks")]
    for reference, response in pairs:
        assert rouge1_recall(reference, response) == pytest.approx(scorer.score(reference, response)["rouge1"].recall,
                                                                   abs=1e-12), (reference, response)


def test_sentences_are_found_in_the_text_not_by_token_ids():
    assert sentences("Dr Smith left. Then? Yes! 'Fine.' done") == ["Dr Smith left.", "Then?", "Yes!", "'Fine.'", "done"]


def test_needles_that_are_not_usable_are_refused_in_one_line(tmp_path):
    bad = tmp_path / "needles.jsonl"
    bad.write_text(json.dumps({"needle": "The key is red.", "question": "What?", "answer": "blue"}) + "\n")
    with pytest.raises(headscan.HeadscanError, match=r"line 1: the answer 'blue' is not a verbatim part of the needle"):
        read_needles(bad)


# --- decoding rows and the copying rule against Hugging Face eager attention ----------------------------------


def wu_reference(folder, prompt, span, steps):
    """Wu et al.'s loop: prefill all but the last token, then greedy steps with the cache, each scored by
    ``retrieval_calculate`` (topk(1) of the last row of every head of Hugging Face's eager attention)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    cache_name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    config = model.config
    n_layers, n_heads = config.num_hidden_layers, config.num_attention_heads
    score = np.zeros((n_layers, n_heads))
    ids = torch.tensor([prompt])
    generated, rows = [], []
    with torch.no_grad():
        cache = model(ids[:, :-1], use_cache=True).past_key_values
        inp = ids[:, -1:]
        for _ in range(steps):
            out = model(inp, use_cache=True, output_attentions=True, **{cache_name: cache})
            cache = out.past_key_values
            token = int(out.logits[0, -1].argmax())
            generated.append(token)
            rows.append([a[0, :, -1] for a in out.attentions])
            keys = prompt + generated[:-1]
            for layer in range(n_layers):
                for head in range(n_heads):
                    i = int(out.attentions[layer][0][head][-1].topk(1).indices[0])
                    if span[0] <= i < span[1] and keys[i] == token:
                        score[layer][head] += 1 / (span[1] - span[0])
            inp = torch.tensor([[token]])
    return generated, rows, score


# one path prefills the prompt in 64-token pieces onto the cache (four pieces, the last one short), the other in
# one pass (the default PREFILL_CHUNK is longer than the prompt): both must give Hugging Face's one-pass rows
@pytest.mark.parametrize(("path", "prefill_chunk"), [("transformer_lens", 64), ("hf_hooks", None)])
def test_decoding_rows_and_copying_equal_wu_et_al_on_hugging_face_eager(planted, path, prefill_chunk, monkeypatch):
    from headscan.corpus import read_corpus
    from headscan.corpus.needles import build_prompt, plan_trials
    from headscan.metrics import METRICS, AttentionBatch
    from headscan.models import load_model
    from headscan.models.decode import greedy_decode

    if path == "hf_hooks":
        monkeypatch.setattr("headscan.models.load.has_adapter", lambda config: False)
    model = load_model(planted["folder"])
    assert model.path == path
    corpus = read_corpus(planted["haystack"])
    needles, _ = read_needles(planted["needles"])
    plan = plan_trials(corpus, 1, [200], [0.5], 3)[0]
    prompt = build_prompt(corpus, needles[0], plan, model.tokenizer, template="raw", bos=model.special_token_ids["bos"])
    steps = []
    pieces = prefill_chunk or PREFILL_CHUNK
    prefilled = len(prompt.ids) - 1  # the last prompt token is fed to the first decoding step
    assert (3 * 64 < prefilled < 4 * 64) if prefill_chunk else prefilled <= pieces  # 4 pieces, or one
    generated = greedy_decode(model, prompt.ids, steps.append, max_new_tokens=6, stop=lambda t: False,
                              prefill_chunk=pieces)
    want_tokens, want_rows, want_score = wu_reference(planted["folder"], prompt.ids, prompt.answer, 6)
    assert generated == want_tokens
    hits = np.zeros_like(want_score)
    sequence = list(prompt.ids) + generated
    for step, rows in zip(steps, want_rows):
        n = step.position + 1
        for layer, row in enumerate(rows):  # the very rows Hugging Face's eager attention gives
            torch.testing.assert_close(step.rows[layer][0, :, 0], row, atol=1e-6, rtol=0)
        pattern = torch.cat([step.rows[layer] for layer in range(model.n_layers)])  # (layer, head, 1, k)
        every = torch.ones((model.n_layers, n), dtype=torch.bool)
        needle = torch.zeros(n, dtype=torch.bool)
        needle[prompt.answer[0]:prompt.answer[1]] = True
        batch = AttentionBatch(pattern, every[:, -1:], every, torch.tensor(sequence[:n]).expand(model.n_layers, -1),
                               ~every, True, query_start=step.position, needle=needle.expand(model.n_layers, -1),
                               generated=torch.tensor([step.token]).expand(model.n_layers))
        hits += METRICS["retrieval"].function(batch)[0].numpy()
    n_answer = prompt.answer[1] - prompt.answer[0]
    np.testing.assert_array_equal(hits, np.rint(want_score * n_answer))  # the copying steps, exactly
    np.testing.assert_allclose(hits / n_answer, want_score, atol=1e-12)
    assert want_score[planted["head"]] == pytest.approx(1.0)


def test_a_prompt_prefilled_in_pieces_gives_the_one_pass_rows_of_a_rotary_model(tmp_path):
    """The planted model has no positions and one layer, so only a rotary, two-layer model can tell pieces
    stitched at the wrong positions (or with a token lost or repeated) from Hugging Face's one-pass prefill."""
    from headscan.models import load_model
    from headscan.models.decode import greedy_decode

    folder = build_architecture_checkpoint(tmp_path / "llama", "llama", seed=1)
    model = load_model(str(folder))
    prompt = torch.randint(10, model.tokenizer.vocab_size, (120,), generator=torch.Generator().manual_seed(0)).tolist()
    steps = []
    generated = greedy_decode(model, prompt, steps.append, max_new_tokens=6, stop=lambda t: False, prefill_chunk=32)
    want_tokens, want_rows, _ = wu_reference(folder, prompt, (0, 1), 6)  # 119 prefilled tokens: 3 x 32, then 23
    assert generated == want_tokens and len(set(generated)) > 1
    assert [step.position for step in steps] == list(range(119, 125))
    for step, rows in zip(steps, want_rows, strict=True):
        for layer, row in enumerate(rows):
            torch.testing.assert_close(step.rows[layer][0, :, 0], row, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["mistral", "gemma2"])
def test_decoding_rows_of_sliding_window_layers_sit_at_their_positions(tmp_path, name):
    """A sliding-window layer's cache keeps only its last 6 keys; each step's row still has one entry per position,
    equal to the last row of Hugging Face's eager attention over the whole sequence, without a cache (0 before
    the window), and the tokens are that model's greedy ones."""
    from transformers import AutoModelForCausalLM

    from headscan.models import load_model
    from headscan.models.decode import greedy_decode

    folder = build_architecture_checkpoint(tmp_path / name, name, seed=1)
    model = load_model(str(folder))
    prompt = torch.randint(10, model.tokenizer.vocab_size, (20,), generator=torch.Generator().manual_seed(0)).tolist()
    steps = []
    generated = greedy_decode(model, prompt, steps.append, max_new_tokens=4, stop=lambda t: False, prefill_chunk=8)
    reference = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids = list(prompt)
    for step, token in zip(steps, generated, strict=True):
        assert step.position == len(ids) - 1
        with torch.no_grad():
            out = reference(torch.tensor([ids]), output_attentions=True, use_cache=False)
        assert int(out.logits[0, -1].argmax()) == token
        for layer, attention in enumerate(out.attentions):
            torch.testing.assert_close(step.rows[layer][0, :, 0], attention[0, :, -1], atol=1e-6, rtol=0)
        assert (step.rows[0][0, :, 0, : len(ids) - 6] == 0).all()  # layer 0's window: the last 6 keys
        ids.append(token)


def test_chance_of_a_step_counts_only_the_keys_inside_a_sliding_window():
    """By hand: 10 keys, the step's query at 9, needle keys 5..7 holding tokens 4, 8, 8, token 8 generated. With
    no window the null head sees all 10 keys and 2 of them are targets; with a window of 3 it sees keys 6..9,
    two of them targets (6 and 7); with a window of 1, keys 8 and 9, none."""
    tokens = torch.tensor([[1, 2, 3, 1, 2, 4, 8, 8, 5, 6]])
    needle = torch.zeros(1, 10, dtype=torch.bool)
    needle[0, 5:8] = True
    every = torch.ones(1, 10, dtype=torch.bool)
    batch = AttentionBatch(torch.full((1, 2, 1, 10), 0.1), every[:, -1:], every, tokens, ~every, True, query_start=9,
                           needle=needle, generated=torch.tensor([8]))
    assert chance_steps(batch).tolist() == [pytest.approx(2 / 10)]
    assert chance_steps(dataclasses.replace(batch, window=3)).tolist() == [pytest.approx(2 / 4)]
    assert chance_steps(dataclasses.replace(batch, window=1)).tolist() == [0.0]


def test_a_retrieval_run_on_a_model_with_local_and_global_layers_has_a_chance_per_layer(tmp_path, monkeypatch):
    """Gemma 2's layer 0 sees its last 6 keys, layer 1 every key: the run decodes (each step's rows at their
    positions; they were 6 and n keys long, and did not stack), and each layer's chance comes from a null head
    with that layer's window (the step's chance stands in as the window, 5, or 100 for none), the same for every
    head of the layer."""
    monkeypatch.setattr("headscan.scan.trials.chance_steps",
                        lambda batch: torch.tensor([5.0 if batch.window == 5 else 100.0 if batch.window is None else -1]))
    folder = build_architecture_checkpoint(tmp_path / "gemma2", "gemma2")
    needles = tmp_path / "needles.jsonl"
    needles.write_text(json.dumps({"needle": f"The three words are {ANSWER}.", "question": QUESTION,
                                   "answer": ANSWER}) + "\n")
    haystack = tmp_path / "haystack.txt"
    haystack.write_text(HAYSTACK * 10)
    run = headscan.retrieval(str(folder), str(haystack), tmp_path / "out", needles=str(needles), lengths=(120,),
                             depths=(0.5,), bootstrap=0, max_new_tokens=4)
    trials = run["retrieval_trials"]
    assert trials["span_found"].all()
    per_layer = trials.groupby("layer")["chance"]
    assert (per_layer.nunique() == 1).all()  # one null head per layer
    assert per_layer.first()[0] > 0 and per_layer.first()[1] == 20 * per_layer.first()[0]


# --- the planted check ------------------------------------------------------------------------------------------


def test_a_head_that_copies_from_the_needle_scores_one(planted, tmp_path):
    run = headscan.retrieval(planted["folder"], planted["haystack"], tmp_path / "out", needles=planted["needles"],
                             **SMALL)
    rows = run["retrieval"]
    layer, head = planted["head"]
    for metric in ("retrieval", "retrieval_ungated"):
        part = rows[rows["metric"] == metric]
        copying = part[(part["layer"] == layer) & (part["head"] == head)].iloc[0]
        assert copying["value"] == 1.0 and copying["ci_low"] == 1.0 and copying["count"] == 6
        assert (part.drop(copying.name)["value"] == 0).all()
        assert 0 < copying["chance"] < 0.05  # a uniform head: the answer's tokens over the keys it sees
    trials = run["retrieval_trials"].drop_duplicates("trial")
    assert trials["passed"].all() and (trials["response"] == ANSWER).all() and (trials["recall"] == 1.0).all()
    assert sorted(trials["depth"]) == [0.0, 0.0, 0.5, 0.5, 1.0, 1.0] and (trials["tokens"] <= trials["length"]).all()
    assert trials["needle_position"].is_monotonic_increasing is False  # depth moves the needle
    loaded = headscan.load(tmp_path / "out")
    assert set(loaded.frames) == {"retrieval", "retrieval_trials"} and loaded.models == run.models
    extra = loaded.provenance.models[0].extra
    assert (extra["trials"], extra["passed"], extra["failed_gate"], extra["template"]) == (6, 6, 0, "raw")
    assert (extra["query_chunk"], extra["prefill_chunk"]) == (RetrievalConfig().query_chunk, PREFILL_CHUNK)
    rules = loaded.provenance.extra["retrieval"]
    assert "ROUGE-1 recall" in rules["gate"] and "0.5" in rules["gate"] and "newline" in rules["decoding"]
    assert "default_rng(0)" in rules["placement"] and loaded.provenance.versions["transformers"]


def test_failed_trials_are_kept_and_counted_and_no_pass_still_writes_tables(planted, tmp_path):
    needles = tmp_path / "needles.jsonl"  # an answer the planted model never gives
    needles.write_text(json.dumps({"needle": "The three words are violet anchor seventeen.", "question": QUESTION,
                                   "answer": "violet anchor seventeen"}) + "\n")
    run = headscan.retrieval(planted["folder"], planted["haystack"], tmp_path / "out", needles=needles,
                             lengths=(160,), depths=(0.0, 1.0), bootstrap=20)
    rows = run["retrieval"]
    assert rows.loc[rows["metric"] == "retrieval", "value"].isna().all()  # no trial passed: undefined, not 0
    assert (rows.loc[rows["metric"] == "retrieval_ungated", "count"] == 2).all()
    trials = run["retrieval_trials"].drop_duplicates("trial")
    assert len(trials) == 2 and not trials["passed"].any()
    assert run.provenance.models[0].extra["failed_gate"] == 2


def test_a_stopped_run_resumes_to_the_same_tables(planted, tmp_path, monkeypatch):
    small = {"lengths": (160,), "depths": (0.0, 0.5, 1.0), "bootstrap": 20}
    whole = headscan.retrieval(planted["folder"], planted["haystack"], tmp_path / "whole", needles=planted["needles"],
                               **small)
    def run(out, **more):
        return headscan.retrieval(planted["folder"], planted["haystack"], out, needles=planted["needles"],
                                  **(small | more))

    assert_a_stopped_run_resumes(run, lambda out: run(out, depths=(0.0,)), tmp_path / "part", stop_at=2,
                                 kept="2 trials kept", expected=whole, tables=("retrieval", "retrieval_trials"),
                                 monkeypatch=monkeypatch)


def test_encoders_and_alibi_models_are_refused_with_the_reason(tiny_bert, tmp_path, planted):
    with pytest.raises(ModelLoadError, match="is bidirectional: retrieval heads are read while a model decodes"):
        headscan.retrieval(str(tiny_bert), planted["haystack"], needles=planted["needles"], lengths=(160,),
                           depths=(0.0,), bootstrap=0)
    bloom = build_architecture_checkpoint(tmp_path / "bloom", "bloom")
    with pytest.raises(ModelLoadError, match="cannot run chunked attention: bloom adds ALiBi"):
        headscan.retrieval(str(bloom), planted["haystack"], needles=planted["needles"], lengths=(100,),
                           depths=(0.0,), bootstrap=0)


def test_the_command_line_runs_trials_and_says_what_passed(planted, tmp_path):
    result = CliRunner().invoke(cli, ["retrieval", "-m", planted["folder"], "--haystack", planted["haystack"],
                                      "--needles", planted["needles"], "--lengths", "160", "--depths", "0,1",
                                      "--bootstrap", "20", "--out", str(tmp_path / "out"), "-q"])
    assert result.exit_code == 0, result.output
    assert "2 of 2 trials passed the answer gate" in result.output
    assert "retrieval above 0.1: 1 of 4 heads (25.0%)" in result.output
    # the top heads, highest first, ties (the three heads that never copy) to the lower head
    listed = [line.split()[0] for line in result.output.splitlines() if line.startswith("  ") and " trials" in line]
    assert listed == ["L0H0", "L0H1", "L0H2", "L0H3"], result.output
    shown = CliRunner().invoke(cli, ["show", str(tmp_path / "out")])
    assert shown.exit_code == 0 and "L0H0" in shown.output.splitlines()[1]
    bad = CliRunner().invoke(cli, ["retrieval", "-m", planted["folder"], "--haystack", planted["haystack"],
                                   "--lengths", "1k"])
    assert bad.exit_code == 2 and "lengths must be numbers separated by commas" in bad.output


# --- streaming ----------------------------------------------------------------------------------------------------


def eager_streaming(folder, ids, sink, recent):
    """Per layer and head, the mean over queries q >= sink + recent of the attention on keys in [sink, q - recent],
    from Hugging Face's own eager attention, by plain loops."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        attentions = model(torch.tensor([ids]), output_attentions=True).attentions
    out = np.zeros((len(attentions), attentions[0].shape[1]))
    for layer, pattern in enumerate(attentions):
        A = pattern[0].double().numpy()
        for head in range(A.shape[0]):
            queries = range(sink + recent, len(ids))
            out[layer, head] = np.mean([A[head, q, sink: q - recent + 1].sum() for q in queries])
    return out


def test_streaming_equals_a_plain_eager_computation_on_a_1k_segment(tmp_path):
    folder = build_tiny_checkpoint(tmp_path / "gpt2", "gpt2", max_positions=1024, seed=3)
    text = " ".join(HAYSTACK.split() * 200)
    run = {}
    for attention in ("eager", "chunked"):
        run[attention] = headscan.sweep(str(folder), [text], max_len=1024, attention=attention, query_chunk=200,
                                        bootstrap=0, values=False)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = ([tokenizer.bos_token_id] + tokenizer(text, add_special_tokens=False)["input_ids"])[:1024]  # as the sweep
    assert len(ids) == 1024
    want = eager_streaming(str(folder), ids, 64, 256)
    for tables in run.values():
        rows = tables.heads[tables.heads["metric"] == "streaming"].sort_values(["layer", "head"])
        assert (rows["count"] == 1024 - 64 - 256).all()
        np.testing.assert_allclose(rows["value"].to_numpy().reshape(want.shape), want, atol=1e-6, rtol=0)


def test_a_sliding_window_model_loses_nothing_beyond_its_window(tmp_path):
    """Mistral's heads see only the last 6 keys (its sliding window): with no sink and a window of 6, the
    streaming score is exactly 0 for every head, eager or chunked, and so is its chance (the null head sees the
    window too); with a window of 3 it is not, and chance is, by hand, the mean over the queries q >= 3 of the
    share of the keys q sees (min(6, q + 1)) that the cache drops (keys 0 .. q - 3 among them: min(3, q - 2))."""
    folder = build_architecture_checkpoint(tmp_path / "mistral", "mistral")
    texts = [" ".join(HAYSTACK.split() * 3)]
    for attention in ("eager", "chunked"):
        tables = headscan.sweep(str(folder), texts, max_len=100, attention=attention, query_chunk=16, sink=0, recent=6,
                                bootstrap=0, values=False)
        rows = tables.heads[tables.heads["metric"] == "streaming"]
        assert rows["count"].min() > 50 and rows["value"].abs().max() <= 1e-9 and rows["chance"].abs().max() <= 1e-12
    narrower = headscan.sweep(str(folder), texts, max_len=100, sink=0, recent=3, bootstrap=0, values=False)
    rows = narrower.heads[narrower.heads["metric"] == "streaming"]
    assert rows["value"].min() > 1e-3
    n = int(rows["count"].iloc[0]) + 3  # the segment's tokens: queries 0, 1 and 2 lose nothing and do not count
    by_hand = np.mean([min(3, q - 2) / min(6, q + 1) for q in range(3, n)])
    np.testing.assert_allclose(rows["chance"].to_numpy(), by_hand, rtol=0, atol=1e-12)


# --- the report -----------------------------------------------------------------------------------------------------


def test_the_report_joins_a_retrieval_run_to_the_sweep_of_its_model(planted, tmp_path):
    from headscan.analysis.runs import compare_runs
    from headscan.report import write_report
    from headscan.report.atlas import atlas_data

    text = " ".join(HAYSTACK.split() * 4)
    sweep = headscan.sweep(planted["folder"], [text] * 16, tmp_path / "sweep", max_len=64, sink=4, recent=8,
                           bootstrap=20)
    retrieval = headscan.retrieval(planted["folder"], planted["haystack"], tmp_path / "retrieval",
                                   needles=planted["needles"], lengths=(160,), depths=(0.0, 1.0), bootstrap=20)
    runs = [headscan.load(tmp_path / "sweep"), headscan.load(tmp_path / "retrieval")]
    comparison = compare_runs(runs)
    assert [m.name for m in comparison.models] == [planted["folder"].rsplit("/", 1)[-1]] or len(comparison.models) == 1
    assert "retrieval" in comparison.score_metrics and "streaming" in comparison.metrics
    data = atlas_data(comparison)
    grid = data["models"][0]["metrics"]["retrieval"]["value"]
    assert grid[0] == 1.0 and grid[1:] == [0.0] * 3  # L0H0 copies, the others do not
    folder = write_report(runs, tmp_path / "report")
    report = (folder / "report.md").read_text()
    section = report[report.index("## Which heads need the whole context"):]
    assert "2 of 2 trials passed the answer gate" in section
    Path(tmp_path / "section.md").write_text(section)
    # two trials are thin support (fewer than 15 units): the copying head is shown, but not named a retrieval head
    assert "| L0H0 | retrieval | 1.000 | 1.000 | 1.000 | 2 |" in section
    assert "| model | head | score | value | 95% low | 95% high | trials | chance | mark |" in section
    assert "no head's 95% interval clears 0.1 and chance" in section
    assert "| Llama-2-7B-80K (Wu et al.) | retrieval |" in section and "### Key/value budget" in section
    assert "### Streaming heads" in section and "sink 4, window 8" in section
    with pytest.raises(TablesError, match="none of the sweeps given swept"):
        compare_runs([retrieval, sweep.__class__(sweep.frames, sweep.provenance)] if False else [retrieval])
    del sweep


def test_the_answer_gate_is_passed_only_above_half_the_answers_words(planted, tmp_path):
    """Wu et al.'s gate counts a trial whose recall is *above* 0.5: an answer of two or four words of which the
    planted model's response ("river mountain machine") holds half fails it, one of three words holding two passes.
    Recalls are rouge_score's own (the independent answer)."""
    rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")
    answers = ["river lake", "river mountain lake sea", "river mountain lake"]
    needles = tmp_path / "needles.jsonl"
    needles.write_text("".join(json.dumps({"needle": f"The words are {a}.", "question": QUESTION, "answer": a}) + "\n"
                               for a in answers))
    run = headscan.retrieval(planted["folder"], planted["haystack"], tmp_path / "out", needles=needles,
                             lengths=(160,), depths=(0.5,), bootstrap=20)
    trials = run["retrieval_trials"].drop_duplicates("trial").sort_values("needle")
    scorer = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)
    want = [scorer.score(a, ANSWER)["rouge1"].recall for a in answers]
    assert want == pytest.approx([0.5, 0.5, 2 / 3])
    assert (trials["response"] == ANSWER).all() and trials["recall"].tolist() == pytest.approx(want)
    assert trials["passed"].tolist() == [False, False, True]
    assert run.provenance.models[0].extra["failed_gate"] == 2


# --- published scores (Retrieval_Head's head_score/MODEL.json) -------------------------------------------------


def published_file(path, n_layers=3, n_heads=4, trials=120, seed=0):
    """A score file as Retrieval_Head writes it (json.dumps of {"layer-head": [score per trial]}, one line),
    with L1H2 a retrieval head; returns the scores as an array (trial, layer, head)."""
    rng = np.random.default_rng(seed)
    scores = rng.uniform(0, 0.05, size=(trials, n_layers, n_heads)).round(3)
    scores[:, 1, 2] = rng.choice([0.6, 0.8, 1.0], size=trials)
    path.write_text(json.dumps({f"{layer}-{head}": scores[:, layer, head].tolist()
                                for layer in range(n_layers) for head in range(n_heads)}))
    return scores


def test_published_scores_import_as_a_retrieval_table_with_intervals_over_trials(tmp_path):
    scores = published_file(tmp_path / "llama-tiny.json")
    run = headscan.import_scores(tmp_path / "llama-tiny.json", tmp_path / "out", bootstrap=400)
    rows = run["retrieval"].set_index("label")
    assert list(rows.index[:5]) == ["L0H0", "L0H1", "L0H2", "L0H3", "L1H0"] and (rows["metric"] == "retrieval").all()
    mean = scores.mean(0).ravel()  # a plain mean over trials, head by head
    np.testing.assert_allclose(rows["value"], mean, atol=1e-12)
    np.testing.assert_allclose(rows["sum"], scores.sum(0).ravel(), atol=1e-9)
    assert (rows["count"] == 120).all() and (rows["units"] == 120).all() and rows["chance"].isna().all()
    # the interval over trials: about mean +- 1.96 standard errors (a plain normal interval, 400 replicates)
    half = 1.96 * scores.std(0, ddof=1).ravel() / np.sqrt(120)
    width = (rows["ci_high"] - rows["ci_low"]).to_numpy() / 2
    np.testing.assert_allclose(width, half, rtol=0.25)
    assert ((rows["ci_low"] <= rows["value"]) & (rows["value"] <= rows["ci_high"])).all()
    loaded = headscan.load(tmp_path / "out")
    pd.testing.assert_frame_equal(loaded["retrieval"], run["retrieval"])
    model = loaded.provenance.models[0]
    assert (model.name, model.source, model.n_layers, model.n_heads, model.extra["trials"]) == ("llama-tiny", "imported", 3, 4, 120)
    import hashlib

    assert model.revision == hashlib.sha256((tmp_path / "llama-tiny.json").read_bytes()).hexdigest()
    assert loaded.provenance.git_revision and loaded.provenance.extra["imported"]["trials"] == 120


@pytest.mark.parametrize("content, message", [
    ("{not json", "not JSON at line 1"),
    ("[]", "not an object of heads"),
    ('{"0_0": [0.5]}', "key '0_0' is not 'layer-head'"),
    ('{"0-0": [1.5], "0-1": [0.5]}', "head '0-0' must hold a list of per-trial scores between 0 and 1"),
    ('{"0-0": [0.5, 0.5], "0-1": [0.5]}', "heads hold different numbers of trials"),
    ('{"0-0": [0.5], "1-1": [0.5]}', "2 of the 2 x 2 heads are missing \\(first '0-1'\\)"),
])
def test_a_malformed_score_file_is_refused_in_one_line_naming_it(tmp_path, content, message):
    path = tmp_path / "scores.json"
    path.write_text(content)
    with pytest.raises(TablesError, match=message):
        headscan.import_scores(path)
    result = CliRunner().invoke(cli, ["import-scores", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "scores.json" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_published_scores_report_beside_a_headscan_retrieval_run_with_trial_counts_side_by_side(planted, tmp_path):
    from headscan.report import write_report

    text = " ".join(HAYSTACK.split() * 4)
    headscan.sweep(planted["folder"], [text] * 16, tmp_path / "sweep", max_len=64, bootstrap=20)
    headscan.retrieval(planted["folder"], planted["haystack"], tmp_path / "retrieval", needles=planted["needles"],
                       lengths=(160,), depths=(0.0, 1.0), bootstrap=20)
    published_file(tmp_path / "llama-tiny.json")
    result = CliRunner().invoke(cli, ["import-scores", str(tmp_path / "llama-tiny.json"), "--out",
                                      str(tmp_path / "published"), "--bootstrap", "100"])
    assert result.exit_code == 0, result.output
    assert "llama-tiny: 12 heads, 120 trials each; top: L1H2 0.8" in result.output
    runs = [headscan.load(tmp_path / name) for name in ("sweep", "retrieval", "published")]
    folder = write_report(runs, tmp_path / "report")
    report = (folder / "report.md").read_text()
    section = report[report.index("## Which heads need the whole context"):]
    assert "2 of 2 trials passed the answer gate" in section  # headscan's own run
    assert "llama-tiny: scores imported from the published file" in section and "120 trials per head" in section
    shares = section[section.index("| model | score | trials | heads |"):].splitlines()[2:]  # after the header
    ours = next(line for line in shares if line.startswith(f"| {planted['folder']} "))
    theirs = next(line for line in shares if line.startswith("| llama-tiny "))
    assert "| retrieval | 2 | 4 |" in ours and "| retrieval | 120 | 12 |" in theirs  # trial counts side by side
    assert ("llama-tiny: 1 head scores above Wu et al.'s 0.1 with its whole 95% interval, a retrieval head by Wu "
            "et al.'s definition: L1H2 0.81 [") in section
    assert "describes; not tested: no null for retrieval" in section  # a threshold is no null
    assert "| llama-tiny | L1H2 | retrieval |" in section
    index = (folder / "index.html").read_text()
    assert "llama-tiny" in index
