"""Metrics against a plain-loop numpy reference, hand-made patterns with known answers, and properties."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headscan.errors import MetricError
from headscan.metrics import METRICS, AttentionBatch, get_metric, register

# Metrics of the pattern alone; those that need captured internals (moved, dla) are tested in test_value_sweep.py.
PATTERN_METRICS = [metric for metric in METRICS.values() if not metric.needs and metric.table != "importance"]  # importance scores a model with a head removed


def make_batch(lengths, n_heads=2, causal=False, seed=0, tokens=None, sep_id=None, max_offset=3, garbage=0.0):
    """Random valid right-padded patterns; `garbage` fills every padded cell (it must never matter)."""
    rng = np.random.default_rng(seed)
    n = max(lengths)
    real = np.array([[k < length for k in range(n)] for length in lengths])
    logits = rng.normal(size=(len(lengths), n_heads, n, n)) * 3
    allowed = real[:, None, None, :] & real[:, None, :, None]
    if causal:
        allowed = allowed & np.tril(np.ones((n, n), bool))
    logits = np.where(allowed, logits, -np.inf)
    with np.errstate(invalid="ignore"):
        pattern = np.exp(logits - logits.max(-1, keepdims=True))
        pattern = pattern / pattern.sum(-1, keepdims=True)
    padded = ~(real[:, None, None, :] & real[:, None, :, None])
    pattern = np.where(padded, garbage, np.nan_to_num(pattern))
    if tokens is None:
        tokens = rng.integers(0, 4, size=(len(lengths), n))  # few ids: plenty of repeats
    tokens = torch.as_tensor(tokens)
    sep_mask = tokens == sep_id if sep_id is not None else torch.zeros(tokens.shape, dtype=torch.bool)
    mask = torch.as_tensor(real)
    # a sink of 1 and a window of 2, so that 7 tokens leave the streaming score something to score
    return AttentionBatch(torch.tensor(pattern, dtype=torch.float64), mask, mask, tokens, sep_mask, causal, max_offset,
                          sink=1, recent=2)


def reference(name, batch):
    """Per-segment (sums, counts) by explicit loops over segments, heads and queries."""
    A = batch.pattern.numpy()
    real = batch.key_mask.numpy()
    tok = batch.tokens.numpy()
    sep = batch.sep_mask.numpy()
    B, H, N, _ = A.shape
    offsets = range(-batch.max_offset, batch.max_offset + 1)
    shape = (B, H, len(offsets)) if name == "offsets" else (B, H)
    sums, counts = np.zeros(shape), np.zeros(shape)
    for b in range(B):
        keys = [k for k in range(N) if real[b, k]]
        for h in range(H):
            for q in keys:
                visible = [k for k in keys if not batch.causal or k <= q]
                row = {k: A[b, h, q, k] for k in keys}

                def add(score, index=None):
                    where = (b, h) if index is None else (b, h, index)
                    sums[where] += score
                    counts[where] += 1

                if name == "prev_token" and q - 1 in row:
                    add(row[q - 1])
                elif name == "next_token" and q + 1 in row:
                    add(row[q + 1])
                elif name == "self":
                    add(row[q])
                elif name == "first_token" and q >= 1:
                    add(row[0])
                elif name == "sink_ratio" and q >= 1:  # Gu et al.'s threshold
                    add(float(row[0] > 0.3))
                elif name == "sep" and any(sep[b, k] for k in keys):
                    add(sum(row[k] for k in keys if sep[b, k]))
                elif name == "entropy":
                    add(-sum(p * math.log(p) for p in row.values() if p > 0))
                elif name == "entropy_norm" and len(visible) >= 2:
                    add(-sum(p * math.log(p) for p in row.values() if p > 0) / math.log(len(visible)))
                elif name == "distance":
                    add(sum(p * abs(q - k) for k, p in row.items()))
                elif name in ("positional_prev", "positional_next"):
                    target = q - 1 if name == "positional_prev" else q + 1
                    if target in row:
                        top = max(row, key=lambda k: (row[k], -k))
                        add(float(top == target and row[top] > 0))
                elif name in ("duplicate_token", "induction"):
                    others = [j for j in keys if j != q and tok[b, j] == tok[b, q] and (not batch.causal or j < q)]
                    targets = others if name == "duplicate_token" else [
                        j + 1 for j in others if j + 1 in row and j + 1 not in (q - 1, q)]
                    if targets:
                        add(sum(row[k] for k in targets))
                elif name == "streaming" and batch.causal and q >= batch.sink + batch.recent:
                    add(sum(p for k, p in row.items() if batch.sink <= k <= q - batch.recent))
                elif name == "offsets":
                    for i, d in enumerate(offsets):
                        if q + d in row:
                            add(row[q + d], i)
    return sums, counts


# The per-token metrics of heads.parquet and offsets.parquet; syntax and position-bucket metrics, and those that need
# captured internals (dla, moved: tests/test_value_sweep.py), have their own tests.
@pytest.mark.parametrize("name", sorted(n for n, m in METRICS.items() if m.table in ("heads", "offsets") and not m.needs))
@pytest.mark.parametrize("causal", [False, True])
def test_metric_matches_loop_reference(name, causal):
    batch = make_batch([7, 4, 1, 6], n_heads=3, causal=causal, seed=3, sep_id=2)
    sums, counts = METRICS[name].function(batch)
    want_sums, want_counts = reference(name, batch)
    np.testing.assert_allclose(sums.numpy(), want_sums, atol=1e-10)
    np.testing.assert_allclose(counts.numpy(), want_counts)


def one_hot_pattern(n, offset):
    """(1, 1, n, n) pattern where query q attends fully to q + offset, clamped into the sequence."""
    pattern = torch.zeros(1, 1, n, n, dtype=torch.float64)
    for q in range(n):
        pattern[0, 0, q, min(max(q + offset, 0), n - 1)] = 1.0
    return pattern


@pytest.mark.parametrize(
    "offset, metric, expected",
    [
        (-1, "prev_token", 1.0),
        (-1, "positional_prev", 1.0),
        (-1, "next_token", 0.0),
        (1, "next_token", 1.0),
        (1, "positional_next", 1.0),
        (1, "prev_token", 0.0),
        (0, "self", 1.0),
        (0, "entropy", 0.0),
        (-1, "distance", 4 / 5),  # queries 1..4 look 1 back, query 0 looks at itself
    ],
)
def test_known_answers(offset, metric, expected):
    n = 5
    mask = torch.ones(1, n, dtype=torch.bool)
    batch = AttentionBatch(one_hot_pattern(n, offset), mask, mask, torch.arange(n)[None], torch.zeros_like(mask), False)
    sums, counts = METRICS[metric].function(batch)
    assert (sums / counts).item() == pytest.approx(expected)


def test_uniform_attention_has_entropy_norm_one_and_log_n_entropy():
    n = 6
    mask = torch.ones(1, n, dtype=torch.bool)
    pattern = torch.full((1, 1, n, n), 1 / n, dtype=torch.float64)
    batch = AttentionBatch(pattern, mask, mask, torch.arange(n)[None], torch.zeros_like(mask), False)
    s, c = METRICS["entropy"].function(batch)
    assert (s / c).item() == pytest.approx(math.log(n))
    s, c = METRICS["entropy_norm"].function(batch)
    assert (s / c).item() == pytest.approx(1.0)


def test_induction_on_a_repeated_sequence():
    # tokens a b c a b c: a perfect induction head at q in the second copy attends to q - 2
    tokens = torch.tensor([[5, 6, 7, 5, 6, 7]])
    n = tokens.shape[1]
    pattern = torch.zeros(1, 1, n, n, dtype=torch.float64)
    for q in range(n):
        pattern[0, 0, q, q - 2 if q >= 3 else 0] = 1.0
    mask = torch.ones(1, n, dtype=torch.bool)
    batch = AttentionBatch(pattern, mask, mask, tokens, torch.zeros_like(mask), True)
    sums, counts = METRICS["induction"].function(batch)
    assert counts.item() == 3  # only the second copy has an earlier occurrence
    assert (sums / counts).item() == pytest.approx(1.0)
    sums, counts = METRICS["duplicate_token"].function(batch)
    assert (sums / counts).item() == pytest.approx(0.0)  # it never looks at the earlier copy itself


def test_induction_of_a_perfect_induction_head_on_a_repeated_random_sequence_is_one():
    rng = np.random.default_rng(0)
    half = rng.choice(1000, size=12, replace=False)
    tokens = torch.tensor(np.concatenate([[5000], half, half]))[None]  # BOS, then the sequence twice
    n, first = tokens.shape[1], 1 + len(half)
    pattern = torch.zeros(1, 1, n, n, dtype=torch.float64)
    for q in range(n):
        pattern[0, 0, q, q - len(half) + 1 if q >= first else 0] = 1.0  # the token after the earlier copy
    mask = torch.ones(1, n, dtype=torch.bool)
    batch = AttentionBatch(pattern, mask, mask, tokens, torch.zeros_like(mask), True)
    sums, counts = METRICS["induction"].function(batch)
    assert counts.item() == len(half)
    assert (sums / counts).item() == 1.0


def natural_batch(pattern_offset, causal):
    """A sentence with ", x ," and "the x the" and a doubled word, under a head attending exactly q + offset."""
    words = ["the", "cat", ",", "dog", ",", "and", "the", "bird", "the", "fish", "sat", "sat", "on", "the", "mat"]
    ids = {w: i for i, w in enumerate(dict.fromkeys(words))}
    tokens = torch.tensor([[ids[w] for w in words]])
    mask = torch.ones_like(tokens, dtype=torch.bool)
    return AttentionBatch(one_hot_pattern(len(words), pattern_offset), mask, mask, tokens, torch.zeros_like(mask), causal)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("offset", [-1, 0])
def test_induction_of_a_previous_token_or_self_head_on_natural_text_is_zero(offset, causal):
    batch = natural_batch(offset, causal)
    sums, counts = METRICS["induction"].function(batch)
    assert counts.item() > 0  # the sentence has queries with targets ...
    assert sums.item() == 0.0  # ... and the positional head puts nothing on them
    # counting q-1 (", x ,") and q ("sat sat") as targets would score these heads above 0
    same = batch.other_occurrences[0]
    n = same.shape[-1]
    assert any(same[q, q - 2] for q in range(2, n)) and any(same[q, q - 1] for q in range(1, n))


def test_metrics_never_write_into_the_pattern():
    batch = make_batch([5, 3], causal=True, garbage=7.0)
    before = batch.pattern.clone()
    for metric in PATTERN_METRICS:
        metric.function(batch)
    assert torch.equal(batch.pattern, before)


def test_every_metric_takes_a_batch_of_no_segments():
    """An empty batch (a caller's last slice, say) gives empty sums, not an error from a reduction over nothing."""
    empty = make_batch([3, 3], sep_id=1)
    empty = dataclasses.replace(empty, pattern=empty.pattern[:0], query_mask=empty.query_mask[:0],
                                key_mask=empty.key_mask[:0], tokens=empty.tokens[:0], sep_mask=empty.sep_mask[:0])
    for metric in PATTERN_METRICS:
        sums, counts = metric.function(empty)
        assert sums.shape[0] == counts.shape[0] == 0, metric.name


def test_unknown_metric_suggests_the_closest_name():
    with pytest.raises(MetricError, match=r"Did you mean 'next_token'\?"):
        get_metric("next_tokens")


def test_register_refuses_a_duplicate_name():
    with pytest.raises(MetricError, match="registered twice"):
        register("prev_token")(lambda batch: None)


def test_every_metric_has_a_definition():
    for metric in METRICS.values():
        assert len(metric.definition) > 40, metric.name


def test_a_metric_that_needs_internals_says_so_without_them():
    with pytest.raises(MetricError, match="needs value_norms"):
        METRICS["moved"].function(make_batch([3]))


# --- properties -------------------------------------------------------------------------------------------

lengths_strategy = st.lists(st.integers(1, 9), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_strategy, causal=st.booleans(), seed=st.integers(0, 10_000))
def test_shares_lie_in_unit_interval(lengths, causal, seed):
    batch = make_batch(lengths, causal=causal, seed=seed, sep_id=1)
    for metric in PATTERN_METRICS:
        sums, counts = metric.function(batch)
        assert torch.all(sums >= -1e-9)
        assert torch.all(counts >= 0)
        if metric.bounded:
            assert torch.all(sums <= counts + 1e-9), metric.name


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_strategy, causal=st.booleans(), seed=st.integers(0, 10_000))
def test_offset_profile_of_a_row_sums_to_at_most_one(lengths, causal, seed):
    batch = make_batch(lengths, causal=causal, seed=seed, max_offset=4)
    weights_per_query = []
    for q in range(batch.pattern.shape[-1]):
        # profile of a single query: restrict the queries that count to q
        only_q = batch.query_mask & (torch.arange(batch.pattern.shape[-1]) == q)
        one = AttentionBatch(batch.pattern, only_q, batch.key_mask, batch.tokens, batch.sep_mask, causal, 4)
        sums, _ = METRICS["offsets"].function(one)
        weights_per_query.append(sums.sum(-1))
    assert torch.all(torch.stack(weights_per_query) <= 1 + 1e-9)


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_strategy, causal=st.booleans(), seed=st.integers(0, 10_000))
def test_entropy_between_zero_and_log_visible_keys(lengths, causal, seed):
    batch = make_batch(lengths, n_heads=1, causal=causal, seed=seed)
    for b, length in enumerate(lengths):
        for q in range(length):
            only = torch.zeros_like(batch.query_mask)
            only[b, q] = True
            one = AttentionBatch(batch.pattern, only, batch.key_mask, batch.tokens, batch.sep_mask, causal)
            sums, _ = METRICS["entropy"].function(one)
            visible = q + 1 if causal else length
            assert -1e-9 <= sums.sum().item() <= math.log(visible) + 1e-9


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_strategy, seed=st.integers(0, 10_000))
def test_next_token_is_zero_for_any_causal_pattern(lengths, seed):
    sums, _ = METRICS["next_token"].function(make_batch(lengths, causal=True, seed=seed))
    assert torch.all(sums == 0)


@settings(max_examples=60, deadline=None)
@given(
    lengths=lengths_strategy,
    causal=st.booleans(),
    seed=st.integers(0, 10_000),
    garbage=st.sampled_from([0.0, 1.0, -5.0, 1e6, float("nan"), float("inf")]),
)
def test_scores_ignore_values_in_padded_positions(lengths, causal, seed, garbage):
    clean = make_batch(lengths, causal=causal, seed=seed, sep_id=1)
    dirty = make_batch(lengths, causal=causal, seed=seed, sep_id=1, garbage=garbage)
    for metric in PATTERN_METRICS:
        want, want_counts = metric.function(clean)
        got, got_counts = metric.function(dirty)
        torch.testing.assert_close(got, want, msg=metric.name)
        torch.testing.assert_close(got_counts, want_counts)


def test_the_position_tables_axis_is_the_buckets_below_the_sweeps_max_len():
    from headscan.config import SweepConfig

    for name in ("first_token_by_position", "distance_by_position"):
        assert METRICS[name].axis.values(SweepConfig(max_len=8)) == [(0,), (1,), (2,), (4,)]
        assert METRICS[name].axis.values(SweepConfig(max_len=9)) == [(0,), (1,), (2,), (4,), (8,)]


def test_under_a_sliding_window_an_induction_target_counts_when_seen_even_if_its_occurrence_is_not():
    """Tokens A B C A, causal, window 2: query 3 sees keys 1..3. Key 1 follows A's earlier occurrence at 0, which
    the window hides; a head finds key 1 through what its residual holds of position 0, so key 1 is a target.
    duplicate_token counts only occurrences the query sees: none here."""
    pattern = torch.zeros(1, 1, 4, 4)
    pattern[0, 0, torch.arange(4), torch.tensor([0, 0, 1, 1])] = 1.0  # query 3 puts all its weight on key 1
    real = torch.ones(1, 4, dtype=torch.bool)
    batch = AttentionBatch(pattern, real, real, torch.tensor([[7, 8, 9, 7]]), ~real, True, window=2)
    assert METRICS["induction"].function(batch)[0].item() == 1.0
    assert METRICS["induction"].function(batch)[1].item() == 1.0
    assert METRICS["duplicate_token"].function(batch)[1].item() == 0.0
    assert METRICS["duplicate_token"].function(dataclasses.replace(batch, window=None))[1].item() == 1.0
