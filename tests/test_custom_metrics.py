"""Your own metrics (`headscan.pattern`, `headscan.metric`, ``--metric-module``): the worked examples of
examples/patterns.py against a plain loop over Hugging Face attentions, a pattern that restates prev_token
against prev_token itself, eager against chunked attention, shards against the whole sweep, and every refusal."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import paragraph_corpus
from test_syntax import text_word_ids

import headscan
from headscan.cli import cli
from headscan.corpus import read_corpus
from headscan.errors import HeadscanError, MetricError
from headscan.metrics import METRICS
from headscan.metrics.custom import clear_custom, install, read_module

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "patterns.py"


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """40 short lines in paragraphs of 3 (14 documents), from the builtin sample."""
    return paragraph_corpus(tmp_path_factory.mktemp("corpus"), 40)


@pytest.fixture(autouse=True)
def forget_custom_metrics():
    """Each test starts and ends with headscan's own metrics only: the registry is the process's."""
    clear_custom()
    yield
    clear_custom()


def _module(tmp_path, text: str, name: str = "mine.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- the worked examples against a plain loop ---------------------------------------------------------------------


def _punctuation(text: str) -> bool:
    text = text.strip()
    return bool(text) and all(unicodedata.category(c).startswith("P") for c in text)


def plain_example_sums(model, tokenizer, segments, *, bos=None) -> dict:
    """{(metric, layer, head): (sum, count)} of both worked examples, one query and one key at a time."""
    found = {}
    for segment in segments:
        ids, words = text_word_ids(tokenizer, segment, specials=bos is None, bos=bos)
        with torch.no_grad():
            attentions = model(torch.tensor([ids]), output_attentions=True).attentions  # layers x (1, head, n, n)
        texts = [tokenizer.decode([i]) for i in ids]
        n = len(ids)
        for layer, attention in enumerate(attentions):
            a = attention[0].double()
            for q in range(n):
                punct = [k for k in range(q) if _punctuation(texts[k])]
                starts = [k for k in range(n) if words[k] >= 0 and (k == 0 or words[k - 1] != words[k])]
                own = [k for k in starts if words[k] == words[q]] if words[q] >= 0 and q not in starts else []
                for metric, keys in (("prev_punct", punct[-1:]), ("word_start", own)):
                    if not keys:
                        continue
                    for head in range(a.shape[0]):
                        total, count = found.get((metric, layer, head), (0.0, 0))
                        found[(metric, layer, head)] = (total + float(a[head, q, keys].sum()), count + 1)
    return found


def _check_against_plain(heads, plain, n_layers, n_heads):
    rows = heads[heads["metric"].isin(["prev_punct", "word_start"])].set_index(["metric", "layer", "head"])
    assert len(rows) == 2 * n_layers * n_heads
    for key, (total, count) in plain.items():
        assert rows.loc[key, "count"] == count, key
        assert rows.loc[key, "sum"] == pytest.approx(total, abs=1e-5 * count), key
    assert {key[0] for key in plain} == {"prev_punct", "word_start"}


def test_the_worked_examples_equal_a_plain_loop_over_minilm_attention(minilm, ewt_dev):
    from transformers import AutoModel, AutoTokenizer

    from headscan.models import ALIASES

    tables = headscan.sweep("minilm", ewt_dev, limit=10, device="cpu", bootstrap=0, metric_modules=[str(EXAMPLES)])
    folder = ALIASES["minilm"].locate()
    model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    plain = plain_example_sums(model, AutoTokenizer.from_pretrained(folder), read_corpus(ewt_dev, limit=10).segments)
    _check_against_plain(tables.heads, plain, 6, 12)
    origin = tables.provenance.extra["custom_metrics"]["prev_punct"]
    assert origin["sha256"] == read_module(str(EXAMPLES)).sha256 and "punctuation" in origin["definition"]


def test_the_worked_examples_equal_a_plain_loop_on_a_causal_model(tiny_gpt2, ewt_dev):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tables = headscan.sweep(str(tiny_gpt2), ewt_dev, limit=10, device="cpu", bootstrap=0, prepend_bos=True,
                            metric_modules=[str(EXAMPLES)])
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2)
    plain = plain_example_sums(model, tokenizer, read_corpus(ewt_dev, limit=10).segments, bos=tokenizer.bos_token_id)
    _check_against_plain(tables.heads, plain, 2, 4)


# --- a pattern that restates a built-in metric is that metric -------------------------------------------------------

PREV_AGAIN = '''
import headscan

@headscan.pattern("prev_again")
def prev_again(s):
    """Attention on the token just before the query."""
    return (s.key_positions[None, :] == s.query_positions[:, None] - 1)[None].expand(len(s.tokens), -1, -1)
'''


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_a_pattern_of_the_previous_token_is_prev_token_value_chance_and_interval(arch, tiny_gpt2, tiny_bert, tmp_path,
                                                                                  corpus_file):
    folder = {"gpt2": tiny_gpt2, "bert": tiny_bert}[arch]
    module = _module(tmp_path, PREV_AGAIN)
    heads = headscan.sweep(str(folder), corpus_file, limit=30, device="cpu", bootstrap=40, control=("random-init",),
                           metric_modules=[str(module)]).heads
    mine = heads[heads["metric"] == "prev_again"].reset_index(drop=True)
    theirs = heads[heads["metric"] == "prev_token"].reset_index(drop=True)
    assert len(mine) == len(theirs) > 0
    for column in ("value", "count", "chance", "ci_low", "ci_high", "null_low", "null_high"):
        np.testing.assert_allclose(mine[column].astype(float), theirs[column].astype(float), rtol=0, atol=1e-6,
                                   err_msg=column)
    assert (mine["null_kind"] == theirs["null_kind"]).all()


def test_eager_and_chunked_attention_give_a_pattern_the_same_sums(tiny_gpt2, corpus_file):
    settings = dict(limit=12, device="cpu", bootstrap=0, max_len=64, metric_modules=[str(EXAMPLES)])
    eager = headscan.sweep(str(tiny_gpt2), corpus_file, attention="eager", **settings).heads
    chunked = headscan.sweep(str(tiny_gpt2), corpus_file, attention="chunked", query_chunk=8, **settings).heads
    for frame in (eager, chunked):
        assert (frame["metric"] == "prev_punct").any()
    mine = lambda frame: frame[frame["metric"] == "prev_punct"].reset_index(drop=True)  # noqa: E731
    np.testing.assert_allclose(mine(eager)["sum"], mine(chunked)["sum"], rtol=0, atol=1e-5)
    assert (mine(eager)["count"] == mine(chunked)["count"]).all()


def test_shards_with_a_metric_module_merge_into_the_whole_sweep(tiny_bert, corpus_file, tmp_path):
    settings = dict(limit=40, device="cpu", bootstrap=20, bootstrap_unit="document", metric_modules=[str(EXAMPLES)])
    whole = headscan.sweep(str(tiny_bert), corpus_file, tmp_path / "whole", **settings)
    parts = [tmp_path / f"part-{k}" for k in range(2)]
    for k, part in enumerate(parts):
        headscan.sweep(str(tiny_bert), corpus_file, part, shard=f"{k}/2", **settings)
    merged = headscan.merge(parts)
    mine = lambda tables: tables.heads[tables.heads["metric"] == "prev_punct"].reset_index(drop=True)  # noqa: E731
    assert len(mine(merged)) == 8 and mine(merged)["count"].min() > 0
    # the pattern's sums, exactly: one target key per query, so no sum over keys rounds differently in another batch
    for column in ("sum", "count", "value", "chance", "ci_low", "ci_high"):
        np.testing.assert_allclose(mine(merged)[column].astype(float), mine(whole)[column].astype(float), rtol=1e-9,
                                   atol=0, err_msg=column)
    assert merged.provenance.extra["custom_metrics"] == whole.provenance.extra["custom_metrics"]


def test_a_changed_module_is_not_resumed_or_merged_into(tiny_bert, corpus_file, tmp_path):
    from headscan.models import load_model
    from headscan.scan.plan import plan_sweep

    module = _module(tmp_path, PREV_AGAIN)
    model = load_model(str(tiny_bert), device="cpu")
    corpus = read_corpus(str(corpus_file), limit=4)
    install(read_module(str(module)))
    before = plan_sweep(model, corpus, headscan.SweepConfig(bootstrap=0)).fingerprint
    assert before["custom_metrics"] == {"prev_again": read_module(str(module)).sha256}
    settings = dict(limit=20, device="cpu", bootstrap=20, bootstrap_unit="document", metric_modules=[str(module)])
    parts = [tmp_path / f"part-{k}" for k in range(2)]
    headscan.sweep(str(tiny_bert), corpus_file, parts[0], shard="0/2", **settings)
    clear_custom()
    module.write_text(PREV_AGAIN.replace("- 1)", "- 2)"))
    headscan.sweep(str(tiny_bert), corpus_file, parts[1], shard="1/2", **settings)
    clear_custom()
    with pytest.raises(HeadscanError, match="custom_metrics|another text"):
        headscan.merge(parts)


# --- refusals -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, match", [
    ("def broken(:\n", r"mine\.py: SyntaxError"),
    ("x = 1\n", r"mine\.py defines no metric"),
    ("import headscan\n@headscan.pattern('prev_token')\ndef f(s):\n    'x'\n    return None\n",
     r"'prev_token' is registered twice"),
    ("import headscan\n@headscan.pattern('has space')\ndef f(s):\n    'x'\n", r"Python identifier"),
    ("import headscan\n@headscan.pattern('nodoc')\ndef f(s):\n    return None\n", r"nodoc.*no definition"),
])
def test_a_module_that_cannot_be_loaded_is_refused_in_one_line_and_leaves_nothing(tmp_path, text, match):
    before = list(METRICS)
    with pytest.raises(MetricError, match=match) as caught:
        install(read_module(str(_module(tmp_path, text))))
    assert "\n" not in str(caught.value)
    assert list(METRICS) == before


@pytest.mark.parametrize("body, match", [
    ("return s.tokens", r"returned \(\d+, \d+\); it must return a \(batch, q, k\)"),
    ("return torch.ones(len(s.tokens), len(s.query_positions), len(s.key_positions)) * 2",
     r"weights must lie in \[0, 1\], got 2 to 2"),
    ("return torch.ones(len(s.tokens), len(s.query_positions), len(s.key_positions), dtype=torch.long)",
     r"returned torch.int64"),
    ("return s.token_flags(lambda text: 1 / 0)", r"ZeroDivisionError: division by zero"),
])
def test_a_pattern_that_returns_the_wrong_thing_is_named_with_what_it_must_return(tiny_bert, tmp_path, body, match):
    module = _module(tmp_path, f"import torch, headscan\n@headscan.pattern('bad')\ndef bad(s):\n    'Bad.'\n    {body}\n")
    with pytest.raises(MetricError, match=r"pattern 'bad': " + match):
        headscan.sweep(str(tiny_bert), ["one two three.", "four five"], device="cpu", bootstrap=0,
                       metric_modules=[str(module)])


def test_weights_score_the_attention_they_weigh(tiny_bert, tmp_path):
    """Half weight on every key: each head's value is half its total attention on the keys it sees, 0.5 exactly,
    and chance is 0.5 too."""
    module = _module(tmp_path, "import torch, headscan\n@headscan.pattern('half')\ndef half(s):\n    'Half.'\n"
                               "    return torch.full((len(s.tokens), len(s.query_positions), len(s.key_positions)), 0.5)\n")
    heads = headscan.sweep(str(tiny_bert), ["one two three.", "four five six seven"], device="cpu", bootstrap=0,
                           metric_modules=[str(module)]).heads
    half = heads[heads["metric"] == "half"]
    np.testing.assert_allclose(half["value"], 0.5, atol=1e-6)
    np.testing.assert_allclose(half["chance"], 0.5, atol=1e-6)


def test_the_cli_loads_a_metric_module_and_refuses_a_missing_one_in_one_line(tiny_bert, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(cli, ["sweep", "-m", str(tiny_bert), "--corpus", "builtin", "--limit", "4",
                                      "--bootstrap", "0", "--device", "cpu", "--metric-module", str(EXAMPLES),
                                      "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert "prev_punct" in set(headscan.load(out).heads["metric"])
    clear_custom()
    result = CliRunner().invoke(cli, ["sweep", "-m", str(tiny_bert), "--metric-module", str(tmp_path / "nope.py"),
                                      "--out", str(tmp_path / "other")])
    assert result.exit_code != 0 and "nope.py: no such file" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_the_report_defines_a_users_metric_from_run_json_without_its_module(tiny_bert, tmp_path):
    out = tmp_path / "run"
    headscan.sweep(str(tiny_bert), "builtin", out, limit=6, device="cpu", bootstrap=20,
                   metric_modules=[str(EXAMPLES)])
    clear_custom()  # a later process: the module is not loaded
    from headscan.report.build import write_report

    text = (write_report([out], tmp_path / "report") / "report.md").read_text()
    assert "prev_punct" in text and "closest punctuation mark before the query" in text
    assert "patterns.py (sha256" in text
    result = CliRunner().invoke(cli, ["show", str(out), "--metric", "prev_punct", "--top", "2"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:5] == ["model", "label", "layer", "head", "value"]
    # the columns' line and the unit; a six-segment sweep's heads rest on thin support, which a line says
    thin = [line for line in lines[1:3] if line.rstrip().endswith("thin support")]
    assert len(lines) == 1 + 2 + (1 if thin else 0) + 2 and lines[-2].startswith("columns | value: ")
    assert not thin or "rest on thin support" in lines[3]


def test_the_readme_pattern_runs_as_written_and_equals_a_plain_loop(tiny_gpt2, ewt_dev):
    """The README's ``two_back`` block, executed as the README prints it, sweeps a causal checkpoint to the share
    of attention on the key two before each query that has one, as a plain loop over Hugging Face's attentions."""
    import re

    from transformers import AutoModelForCausalLM, AutoTokenizer

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r'(@headscan\.pattern\("two_back"\).*?)\n```', readme, re.S).group(1)
    exec(compile(block, "README.md", "exec"), {"headscan": headscan})
    tables = headscan.sweep(str(tiny_gpt2), ewt_dev, limit=10, device="cpu", bootstrap=0, prepend_bos=True)
    rows = tables.heads[tables.heads["metric"] == "two_back"].set_index(["layer", "head"])
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2)
    sums, count = np.zeros((2, 4)), 0
    for segment in read_corpus(ewt_dev, limit=10).segments:
        ids, _ = text_word_ids(tokenizer, segment, specials=False, bos=tokenizer.bos_token_id)
        with torch.no_grad():
            attentions = model(torch.tensor([ids]), output_attentions=True).attentions  # layers x (1, head, n, n)
        for q in range(2, len(ids)):  # every query with a key two before it
            count += 1
            for layer, attention in enumerate(attentions):
                sums[layer] += attention[0, :, q, q - 2].double().numpy()
    assert (rows["count"] == count).all()
    np.testing.assert_allclose(rows["sum"].to_numpy().reshape(2, 4), sums, atol=1e-5 * count)
    assert "two before the query" in tables.provenance.extra["custom_metrics"]["two_back"]["definition"]
