"""Each head's examples (examples.parquet): the units where it scores highest and lowest, against a plain loop
over Hugging Face attentions, a plain sort, shards merged against the whole sweep, and a saved state read back."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import paragraph_corpus

import headscan
from headscan.corpus import read_corpus
from headscan.scan.passes.examples import keep_extremes


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """40 short lines in paragraphs of 3 (14 documents), from the builtin sample."""
    return paragraph_corpus(tmp_path_factory.mktemp("corpus"), 40)


def plain_extremes(values: dict[int, float], k: int) -> tuple[list[int], list[int]]:
    """The k highest and k lowest units by value, ties to the lower unit, by Python's sort."""
    ranked = sorted(values, key=lambda u: (-values[u], u))
    return ranked[:k], sorted(values, key=lambda u: (values[u], u))[:k]


@pytest.mark.parametrize("seed", range(5))
def test_kept_extremes_are_a_plain_sort_and_the_extremes_of_parts_are_the_whole_s(seed):
    rng = np.random.default_rng(seed)
    n, k = 40, 5
    units = rng.permutation(200)[:n]
    counts = rng.integers(0, 4, n).astype(float)  # some units without a count: never an example
    sums = rng.integers(0, 3, n) * counts / 2  # few distinct values: ties decided by the unit
    kept_units, kept_sums, _ = keep_extremes(units, sums, counts, k)
    values = {int(u): s / c for u, s, c in zip(units, sums, counts) if c > 0}
    top, bottom = plain_extremes(values, k)
    assert kept_units[0].tolist() == top and kept_units[1].tolist() == bottom
    np.testing.assert_allclose(kept_sums[0] / [values[u] for u in top], counts[[list(units).index(u) for u in top]])
    # the extremes of the extremes of three parts are the whole's (a unit kept at both ends of a part counted
    # once): what merging shards relies on
    parts = np.array_split(rng.permutation(n), 3)
    each = [keep_extremes(units[p], sums[p], counts[p], k) for p in parts]
    again = keep_extremes(*(np.concatenate([np.concatenate([e[i][0], e[i][1]]) for e in each]) for i in range(3)), k)
    assert again[0][0].tolist() == top and again[0][1].tolist() == bottom


def test_fewer_units_than_k_leave_the_ranks_beyond_them_empty():
    units, sums, counts = keep_extremes(np.array([3, 1]), np.array([1.0, 0.0]), np.array([1.0, 0.0]), 3)
    assert units.tolist() == [[3, -1, -1], [3, -1, -1]] and np.isnan(sums[:, 1:]).all()


def test_the_examples_are_the_units_a_plain_loop_ranks_first_and_last(tiny_bert, corpus_file):
    """prev_token per segment, one query at a time over Hugging Face's attentions, ranked by a plain sort."""
    from transformers import AutoModel, AutoTokenizer

    k = 4
    tables = headscan.sweep(str(tiny_bert), corpus_file, limit=25, device="cpu", bootstrap=0,
                            bootstrap_unit="segment", examples=k)
    examples = tables["examples"]
    model = AutoModel.from_pretrained(tiny_bert, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    segments = read_corpus(str(corpus_file), limit=25).segments
    per_head: dict[tuple[int, int], dict[int, float]] = {}
    for unit, segment in enumerate(segments):
        ids = tokenizer(segment.text)["input_ids"]
        with torch.no_grad():
            attentions = model(torch.tensor([ids]), output_attentions=True).attentions
        for layer, attention in enumerate(attentions):
            for head in range(attention.shape[1]):
                a = attention[0, head].double()
                per_head.setdefault((layer, head), {})[unit] = float(sum(a[q, q - 1] for q in range(1, len(ids)))) / (len(ids) - 1)
    checked = 0
    for (layer, head), values in per_head.items():
        rows = examples[(examples["metric"] == "prev_token") & (examples["layer"] == layer) & (examples["head"] == head)]
        for end, want in zip(("top", "bottom"), plain_extremes(values, k)):
            got = rows[rows["end"] == end].sort_values("rank")
            assert got["unit"].tolist() == want, (layer, head, end)
            np.testing.assert_allclose(got["value"], [values[u] for u in want], rtol=0, atol=1e-6)
            assert got["text"].tolist() == [segments[u].text for u in want]
            checked += 1
    assert checked == 2 * 2 * 4


def test_shards_merge_into_the_whole_sweeps_examples_and_a_saved_state_reads_back(tiny_gpt2, corpus_file, tmp_path):
    from headscan.scan.passes import PASSES
    from headscan.scan.state import PartialState

    settings = dict(limit=40, device="cpu", bootstrap=20, bootstrap_unit="document", examples=3)
    whole = headscan.sweep(str(tiny_gpt2), corpus_file, tmp_path / "whole", **settings)
    parts = [tmp_path / f"part-{k}" for k in range(3)]
    for k, part in enumerate(parts):
        headscan.sweep(str(tiny_gpt2), corpus_file, part, shard=f"{k}/3", **settings)
    merged = headscan.merge(parts)
    a, b = whole["examples"], merged["examples"]
    assert len(a) == 2 * 8 * 3 * a["metric"].nunique() - a["value"].isna().sum()
    assert (a[["layer", "head", "metric", "end", "rank", "unit", "text"]].reset_index(drop=True)
            == b[["layer", "head", "metric", "end", "rank", "unit", "text"]].reset_index(drop=True)).all().all()
    # each unit's own sums are float32 sums of its segments, which a batch of other widths rounds otherwise
    np.testing.assert_allclose(a["value"], b["value"], rtol=1e-6)
    # a shard's saved state, read back, holds the same kept units and texts
    saved = next((parts[0] / "state").glob("*.npz"))
    state = PartialState.load(saved)
    again = PASSES["examples"].load(*PASSES["examples"].save(state.passes["examples"]))
    assert (again.units == state.passes["examples"].units).all() and again.texts == state.passes["examples"].texts


def test_no_examples_table_with_examples_0(tiny_bert):
    tables = headscan.sweep(str(tiny_bert), "builtin", limit=4, device="cpu", bootstrap=0, examples=0)
    assert "examples" not in tables.frames


def test_runs_over_halves_of_a_corpus_combine_into_the_whole_runs_examples(tiny_bert, corpus_file, tmp_path):
    """merge_tables (runs over disjoint parts, no partial states): the extremes of the parts' extremes by value;
    each part numbered its units from 0, so the combined unit is <NA>."""
    from headscan.corpus import Corpus
    from headscan.tables import merge_tables

    corpus = read_corpus(str(corpus_file), limit=20)
    halves = [Corpus(f"half{i}", "text", "", corpus.segments[i * 10:(i + 1) * 10]) for i in range(2)]
    settings = dict(device="cpu", bootstrap=0, bootstrap_unit="segment", examples=3)
    whole = headscan.sweep(str(tiny_bert), corpus, **settings)["examples"]
    combined = merge_tables([headscan.sweep(str(tiny_bert), half, **settings) for half in halves])["examples"]
    assert len(combined) == len(whole) and combined["unit"].isna().all()
    np.testing.assert_allclose(combined["value"], whole["value"], rtol=0, atol=1e-6)
    assert (combined["rank"].to_numpy() == whole["rank"].to_numpy()).all()
