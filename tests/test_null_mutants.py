"""Tests that single-line mutants of the claim code showed missing, each checked by putting its mutant
back: random-init controls drawn with one seed, an interval clipped at a bound read by its shorter half, and a
user's pattern whose targets lie after the query or on both sides of it, against a plain loop."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import paragraph_corpus
from test_syntax import text_word_ids

import headscan
from headscan.corpus import read_corpus
from headscan.metrics.custom import clear_custom


@pytest.fixture(autouse=True)
def forget_custom_metrics():
    clear_custom()
    yield
    clear_custom()


def test_each_random_init_control_draws_weights_of_its_own(tiny_gpt2):
    """Five controls of one seed test each other and can never be a finding: the n-th control's weights must be
    drawn with the controls' seed + n - 1 (mutant: every control with the same seed)."""
    from headscan.config import SweepConfig, control_name
    from headscan.scan.controls import load_swept

    config = SweepConfig(device="cpu", control=("random-init",), control_seeds=3, control_seed=7)
    weights = [torch.cat([p.detach().flatten() for p in load_swept(control_name(str(tiny_gpt2), "random-init", n),
                                                                     config).hf_model.parameters()])
               for n in (1, 2, 3)]
    assert not torch.equal(weights[0], weights[1]) and not torch.equal(weights[1], weights[2])
    again = SweepConfig(device="cpu", control=("random-init",), control_seeds=2, control_seed=8)
    second_of_seed_7 = torch.cat([p.detach().flatten() for p in load_swept(
        control_name(str(tiny_gpt2), "random-init", 1), again).hf_model.parameters()])
    assert torch.equal(second_of_seed_7, weights[1])  # control n of seed s is control 1 of seed s + n - 1


def test_an_interval_clipped_at_its_bound_is_read_by_its_wider_half():
    """A share at 0.995 whose interval [0.975, 1.0] was clipped at 1: its SE is the wider half, 0.02, over t; the
    shorter half (0.005) would make the p-value far too small at the ceiling (mutant: `np.fmin`)."""
    from scipy import stats

    from headscan.intervals import interval_se, t_p_value

    df = 40.0
    se = interval_se(np.array([0.995]), np.array([0.975]), np.array([1.0]), df)
    assert se[0] == pytest.approx(0.02 / stats.t.ppf(0.975, df), rel=1e-9)
    p = t_p_value(np.array([0.995]), se, df, 0.96)
    assert p[0] == pytest.approx(stats.t.sf(0.035 / (0.02 / stats.t.ppf(0.975, df)), df), rel=1e-6)


FORWARD = '''
import headscan

@headscan.pattern("two_ahead")
def two_ahead(s):
    """Attention on the token two after the query."""
    return (s.key_positions[None, :] == s.query_positions[:, None] + 2)[None].expand(len(s.tokens), -1, -1)

@headscan.pattern("window_two")
def window_two(s):
    """Attention on the tokens at most two away from the query, on either side, not the query itself."""
    gap = (s.key_positions[None, :] - s.query_positions[:, None]).abs()
    return ((gap >= 1) & (gap <= 2))[None].expand(len(s.tokens), -1, -1)
'''


def plain_sums(model, tokenizer, segments, targets, *, causal: bool, bos=None):
    """(layer, head) sums and the count of queries: for every query with at least one target key it can see, the
    attention on the targets it sees (the definition in headscan.metrics.custom), one query at a time."""
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    sums, count = np.zeros((layers, heads)), 0
    for segment in segments:
        ids, _ = text_word_ids(tokenizer, segment, specials=bos is None, bos=bos)
        with torch.no_grad():
            attentions = model(torch.tensor([ids]), output_attentions=True).attentions  # layers x (1, head, n, n)
        n = len(ids)
        for q in range(n):
            keys = [k for k in targets(q) if 0 <= k < n and (k <= q or not causal)]
            if not keys:
                continue
            count += 1
            for layer, attention in enumerate(attentions):
                sums[layer] += attention[0, :, q, keys].double().sum(-1).numpy()
    return sums, count


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_a_pattern_that_looks_ahead_or_both_ways_equals_a_plain_loop(arch, tiny_bert, tiny_gpt2, tmp_path):
    """Every other test pattern looks back: here targets after the query (which a causal query cannot see, so it
    does not count there) and a window on both sides, on a bidirectional and a causal checkpoint."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    folder = {"bert": tiny_bert, "gpt2": tiny_gpt2}[arch]
    module = tmp_path / "forward.py"
    module.write_text(FORWARD)
    corpus = paragraph_corpus(tmp_path, 12)
    causal = arch == "gpt2"
    settings = dict(limit=12, device="cpu", bootstrap=0, metric_modules=[str(module)])
    tables = headscan.sweep(str(folder), str(corpus), prepend_bos=True, **settings) if causal else \
        headscan.sweep(str(folder), str(corpus), **settings)
    loader = AutoModelForCausalLM if causal else AutoModel
    model = loader.from_pretrained(folder, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    segments = read_corpus(str(corpus), limit=12).segments
    bos = tokenizer.bos_token_id if causal else None
    for metric, targets in (("two_ahead", lambda q: [q + 2]), ("window_two", lambda q: [q - 2, q - 1, q + 1, q + 2])):
        rows = tables.heads[tables.heads["metric"] == metric].set_index(["layer", "head"]).sort_index()
        sums, count = plain_sums(model, tokenizer, segments, targets, causal=causal, bos=bos)
        if causal and metric == "two_ahead":  # no query of a causal model sees a key after it
            assert count == 0 and rows["value"].isna().all() and (rows["count"] == 0).all()
            continue
        assert count > 0 and (rows["count"] == count).all(), metric
        np.testing.assert_allclose(rows["sum"].to_numpy().reshape(sums.shape), sums, atol=1e-5 * count,
                                   err_msg=metric)
    assert isinstance(tables.heads, pd.DataFrame)


def test_an_interval_clipped_at_both_ends_is_no_evidence():
    """A thin share whose interval was clipped to [0, 1]: its wider half says nothing of how wide it was, so its
    p-value is 1, not the small one a t-test on half of [0, 1] would give (it stays in the family, untested)."""
    from headscan.metrics.nulls import add_findings

    rows = pd.DataFrame({"model": "m", "layer": 0, "head": [0, 1], "metric": "first_token", "value": [0.994, 0.9],
                         "ci_low": [0.0, 0.88], "ci_high": [1.0, 0.92], "variance_df": 2.6, "chance": 0.05,
                         "units": 80.0, "thin": [True, False]})
    out, _ = add_findings({"heads": rows})
    assert out["heads"]["p_value"].iloc[0] == 1.0 and out["heads"]["p_value"].iloc[1] < 0.01
