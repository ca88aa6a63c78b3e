"""Chance levels against plain Python loops over the null head, independent of headscan's closed forms.

The null head of a query attends uniformly over the keys that count and that the query can see (value-weighted
by ||f(x_k)|| for value.parquet). For every metric the loops below enumerate those keys one by one, on random
masks: causal and bidirectional, padding, special tokens kept and left out, blocks of queries (chunked mode)
and value weights.
"""

import dataclasses
import math

import numpy as np
import pytest
import torch

from headscan.corpus.words import ROOT, WordAlignment
from headscan.metrics import METRICS, AttentionBatch, buckets
from headscan.metrics.syntax import COLUMNS, PLAIN_COLUMNS, syntax_chance

# metrics of one attention pattern (importance scores a model with a head removed; syntax reads words)
PER_TOKEN = sorted(name for name, m in METRICS.items() if m.table not in ("syntax", "importance") and not m.needs)


def random_batch(lengths, *, causal, specials, n_heads=3, seed=0, weighted=False, max_offset=3, max_len=16,
                 window=None):
    """Random right-padded attention, token ids with repeats, a [SEP] id, and with `specials="exclude"` the
    first and last real token of each segment left out of the keys and queries that count; with a sliding
    `window`, no weight on keys farther than it from the query."""
    rng = np.random.default_rng(seed)
    n = max(lengths)
    real = np.array([[k < length for k in range(n)] for length in lengths])
    counts = real.copy()
    if specials == "exclude":
        for b, length in enumerate(lengths):
            counts[b, 0] = False
            counts[b, length - 1] = False
    logits = rng.normal(size=(len(lengths), n_heads, n, n))
    allowed = real[:, None, None, :] & (np.tril(np.ones((n, n), bool)) if causal else True)
    if window is not None:
        allowed = allowed & (np.abs(np.arange(n)[:, None] - np.arange(n)[None, :]) <= window)
    pattern = np.where(allowed, np.exp(logits), 0.0)
    pattern = pattern / np.maximum(pattern.sum(-1, keepdims=True), 1e-300)
    tokens = torch.as_tensor(rng.integers(0, 4, size=(len(lengths), n)))
    mask = torch.as_tensor(counts)
    norms = None
    if weighted:
        norms = torch.as_tensor(rng.uniform(0.0, 2.0, size=(len(lengths), n_heads, n)))
        norms[0, 0] = 0.0  # a head that moves nothing from one segment: its null head has no weight at all
    return AttentionBatch(torch.tensor(pattern), mask, mask, tokens, tokens == 2, causal, max_offset, max_len=max_len,
                          value_norms=norms, key_weights=norms if weighted else None, window=window)


def blocks(batch: AttentionBatch, chunk: int):
    """The batch's query rows in blocks of `chunk`, as chunked attention hands them to the metrics."""
    n = batch.pattern.shape[-2]
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        yield dataclasses.replace(batch, pattern=batch.pattern[:, :, start:stop], query_mask=batch.query_mask[:, start:stop],
                                  query_start=start)


def bucket_of(q: int, n_buckets: int) -> int:
    return min(0 if q == 0 else q.bit_length(), n_buckets - 1)


def loop_chance(name, batch, heads):
    """Per-segment sums of the null head's score and the counts, by loops over segments, heads, queries and keys."""
    key = batch.key_mask.numpy()
    tokens = batch.tokens.numpy()
    sep = batch.sep_mask.numpy()
    B, N = key.shape
    weights = None if batch.key_weights is None else batch.key_weights.numpy()
    norms = None if batch.value_norms is None else batch.value_norms.numpy()
    offsets = list(range(-batch.max_offset, batch.max_offset + 1))
    n_buckets = len(buckets(batch.max_len))
    width = {"offsets": len(offsets), "first_token_by_position": n_buckets, "distance_by_position": n_buckets}.get(name)
    shape = (B, heads) if width is None else (B, heads, width)
    sums, counts = np.zeros(shape), np.zeros(shape)
    for b in range(B):
        keys = [k for k in range(N) if key[b, k]]
        for h in range(heads):
            for q in keys:  # a query counts where its token counts
                seen = [k for k in keys if (not batch.causal or k <= q) and (batch.window is None or abs(q - k) <= batch.window)]
                w = {k: 1.0 if weights is None else float(weights[b, h, k]) for k in seen}
                total = sum(w.values())
                p = {k: (w[k] / total if total > 0 else 0.0) for k in seen}

                def add(score, index=None):
                    where = (b, h) if index is None else (b, h, index)
                    sums[where] += score
                    counts[where] += 1

                if name in ("prev_token", "positional_prev") and q >= 1 and key[b, q - 1]:
                    add(p.get(q - 1, 0.0))
                elif name in ("next_token", "positional_next") and q + 1 < N and key[b, q + 1]:
                    add(p.get(q + 1, 0.0))
                elif name == "self":
                    add(p.get(q, 0.0))
                elif name == "first_token" and q >= 1 and key[b, 0]:
                    add(p.get(0, 0.0))
                elif name == "sink_ratio" and q >= 1 and key[b, 0]:  # uniform attention's first-token weight over 0.3
                    add(float(p.get(0, 0.0) > 0.3))
                elif name == "sep" and any(sep[b, k] for k in keys):
                    add(sum(p.get(k, 0.0) for k in keys if sep[b, k]))
                elif name == "entropy":
                    add(-sum(x * math.log(x) for x in p.values() if x > 0))
                elif name == "entropy_norm" and len(seen) >= 2:
                    add(-sum(x * math.log(x) for x in p.values() if x > 0) / math.log(len(seen)))
                elif name == "distance":
                    add(sum(x * abs(q - k) for k, x in p.items()))
                elif name in ("duplicate_token", "induction"):
                    # under a sliding window an occurrence j must be seen, an induction target j + 1 too (not j)
                    occurrences = [j for j in keys if j != q and tokens[b, j] == tokens[b, q] and (not batch.causal or j < q)]
                    targets = [j for j in occurrences if j in seen] if name == "duplicate_token" else [
                        j + 1 for j in occurrences if j + 1 < N and key[b, j + 1] and j + 1 not in (q - 1, q)
                        and j + 1 in seen]
                    if targets:
                        add(sum(p.get(k, 0.0) for k in targets))
                elif name == "offsets":
                    for i, d in enumerate(offsets):
                        if 0 <= q + d < N and key[b, q + d]:
                            add(p.get(q + d, 0.0), i)
                elif name == "first_token_by_position" and q >= 1 and key[b, 0]:
                    add(p.get(0, 0.0), bucket_of(q, n_buckets))
                elif name == "distance_by_position":
                    add(sum(x * abs(q - k) for k, x in p.items() if k >= 1), bucket_of(q, n_buckets))
                elif name == "streaming" and batch.causal and q >= batch.sink + batch.recent:
                    add(sum(p.get(k, 0.0) for k in keys if batch.sink <= k <= q - batch.recent))
                elif name == "moved" and len(seen) >= 2:
                    mean = np.mean([norms[b, h, k] for k in keys])
                    uniform = sum(norms[b, h, k] for k in seen) / len(seen)  # moved's null head: plain attention
                    add(uniform / mean if mean > 0 else 0.0)
    return sums, counts


def chance_over_blocks(metric, batch, chunk):
    """The metric's chance sums and its own counts, added up over blocks of queries."""
    sums = counts = 0
    for block in blocks(batch, chunk):
        sums = sums + metric.chance_sums(block)
        counts = counts + metric.function(block)[1]
    return sums, counts


@pytest.mark.parametrize("name", PER_TOKEN)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("specials, window", [("keep", None), ("exclude", None), ("keep", 2), ("exclude", 3)])
def test_chance_matches_a_plain_loop(name, causal, specials, window):
    batch = random_batch([9, 5, 2, 7], causal=causal, specials=specials, seed=len(name), window=window)
    metric = METRICS[name]
    sums, counts = metric.chance_sums(batch), metric.function(batch)[1]
    assert sums.shape[1] == 1  # the plain null head: one value for every head
    want_sums, want_counts = loop_chance(name, batch, heads=1)
    np.testing.assert_allclose(sums.numpy(), want_sums, atol=1e-12)
    np.testing.assert_allclose(counts[:, :1].numpy(), want_counts)  # chance's queries are the metric's


@pytest.mark.parametrize("name", [*(n for n, m in METRICS.items() if m.table == "heads" and not m.needs), "moved"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, 2])
def test_value_weighted_chance_matches_a_plain_loop(name, causal, window):
    batch = random_batch([8, 6, 3], causal=causal, specials="exclude", seed=7, weighted=True, window=window)
    if name == "moved":  # moved reads attention weights, so its null head is plain attention, with the norms
        batch = dataclasses.replace(batch, key_weights=None)
    metric = METRICS[name]
    sums = metric.chance_sums(batch)
    want_sums, want_counts = loop_chance(name, batch, heads=3)
    np.testing.assert_allclose(sums.expand(want_sums.shape).numpy(), want_sums, atol=1e-12)
    np.testing.assert_allclose(metric.function(batch)[1].numpy(), want_counts)


@pytest.mark.parametrize("chunk", [1, 3, 5])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, 3])
def test_chance_over_blocks_of_queries_matches_the_loop(chunk, causal, window):
    batch = random_batch([11, 4, 9], causal=causal, specials="exclude", seed=chunk, weighted=True, window=window)
    for name in PER_TOKEN:
        sums, counts = chance_over_blocks(METRICS[name], batch, chunk)
        want_sums, want_counts = loop_chance(name, batch, heads=3)
        np.testing.assert_allclose(sums.expand(want_sums.shape).numpy(), want_sums, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(counts.numpy(), want_counts, err_msg=name)


@pytest.mark.parametrize("sink, recent, window", [(1, 2, None), (0, 3, None), (2, 1, None), (1, 2, 4), (0, 2, 3),
                                                  (2, 1, 7)])
@pytest.mark.parametrize("weighted", [False, True])
def test_streaming_chance_matches_the_loop_where_queries_count(sink, recent, window, weighted):
    """With a sink and window short enough that queries of 9- and 11-token segments count (the defaults, 64 and
    256, leave none at these lengths), whole and over blocks of queries; 0 for a bidirectional model."""
    batch = dataclasses.replace(random_batch([11, 4, 9], causal=True, specials="exclude", seed=3, weighted=weighted,
                                             window=window), sink=sink, recent=recent)
    heads = 3 if weighted else 1
    want_sums, want_counts = loop_chance("streaming", batch, heads=heads)
    assert want_counts.sum() > 0
    metric = METRICS["streaming"]
    np.testing.assert_allclose(metric.chance_sums(batch).expand(want_sums.shape).numpy(), want_sums, atol=1e-12)
    sums, counts = chance_over_blocks(metric, batch, 4)
    np.testing.assert_allclose(sums.expand(want_sums.shape).numpy(), want_sums, atol=1e-12)
    np.testing.assert_allclose(counts[:, :heads].numpy(), want_counts)
    encoder = dataclasses.replace(batch, causal=False)
    assert not metric.chance_sums(encoder).any() and not metric.function(encoder)[1].any()


def test_uniform_attention_scores_its_own_chance():
    """A head that is the null head scores exactly chance on every metric that averages attention weights."""
    batch = random_batch([7, 4], causal=True, specials="keep", seed=1)
    uniform = batch.null_batch()
    for name in ("prev_token", "self", "first_token", "entropy", "entropy_norm", "distance", "duplicate_token",
                 "induction", "offsets", "first_token_by_position", "distance_by_position"):
        sums, _ = METRICS[name].function(uniform)
        np.testing.assert_allclose(sums.numpy(), METRICS[name].chance_sums(batch).numpy(), atol=1e-6, err_msg=name)


def test_default_chance_is_the_metric_on_the_null_head():
    """A metric registered without a chance function gets the metric applied to the null head's attention."""
    batch = random_batch([8, 5], causal=False, specials="exclude", seed=2, weighted=True)
    for name in ("prev_token", "entropy", "distance", "sep"):
        default = dataclasses.replace(METRICS[name], chance=None)
        want, _ = loop_chance(name, batch, heads=3)
        np.testing.assert_allclose(default.chance_sums(batch).numpy(), want, atol=1e-6, err_msg=name)


def test_every_metric_says_how_its_chance_is_defined():
    for metric in METRICS.values():
        assert metric.chance_definition, metric.name


def test_first_token_chance_of_a_causal_model_is_one_over_q_plus_one():
    batch = random_batch([6], causal=True, specials="keep")
    sums, counts = METRICS["first_token"].chance_sums(batch), METRICS["first_token"].function(batch)[1]
    assert float(sums[0, 0]) == pytest.approx(sum(1 / (q + 1) for q in range(1, 6)))
    assert float(counts[0, 0]) == 5


# --- syntax -------------------------------------------------------------------------------------------------


def loop_syntax_chance(token_word, head, relation_columns, causal, window=None):
    """Per column (a causal model's `COLUMNS`, a bidirectional one's `PLAIN_COLUMNS`: no visible directions): the
    sum over dependents of 1/m when the gold head is among the m candidates, by loops over tokens; roots (ROOT)
    count as misses in "all"."""
    own = COLUMNS if causal else PLAIN_COLUMNS
    sums = np.zeros(len(own))
    n_words = len(head)
    tokens = {i: [t for t, w in enumerate(token_word) if w == i] for i in range(n_words)}

    def can_attend(i, j):  # some token of i sees some token of j
        return i != j and tokens[i] and tokens[j] and any((not causal or tj <= ti) and (window is None or abs(ti - tj) <= window)
                                                          for ti in tokens[i] for tj in tokens[j])

    for index, (relation, direction) in enumerate(own):
        for i in range(n_words):
            if relation_columns[i] is None or relation not in relation_columns[i]:
                continue
            if head[i] < 0:
                continue  # a root: no candidate is its head
            base = direction.removesuffix("_visible")
            if base != direction:  # only dependents whose gold pair the attending word can see
                attending, attended = (i, head[i]) if base == "dependent_to_head" else (head[i], i)
                if not (tokens[attending] and tokens[attended] and min(tokens[attended]) <= max(tokens[attending])):
                    continue
            if base == "dependent_to_head":
                candidates = [j for j in range(n_words) if can_attend(i, j)]
            else:
                candidates = [j for j in range(n_words) if can_attend(j, i)]
            if head[i] in candidates:
                sums[index] += 1 / len(candidates)
    return sums


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [None, 1, 2])
@pytest.mark.parametrize("head, relation", [
    ([1, 2, ROOT, 2, 3], [27, 16, -1, 4, -1]),  # word 2 the root; nsubj, det, (root), amod, not a UD relation
    ([ROOT, 0, 0, 0, 3], [-1, 27, 16, 4, 16]),  # word 0 the root and the head of three: head index 0 counts
])
def test_syntax_chance_matches_a_plain_loop(causal, window, head, relation):
    # BOS, then words 0..4 of 2, 1, 1, 3 and 1 tokens, then padding
    token_word = [-1, 0, 0, 1, 2, 3, 3, 3, 4, -1]
    words = WordAlignment(torch.tensor([token_word]), torch.tensor([head]), torch.tensor([relation]))
    mask = torch.tensor([[w >= -1 for w in token_word]])
    batch = AttentionBatch(torch.zeros(1, 1, 10, 10), mask, mask, torch.zeros(1, 10, dtype=torch.long),
                           torch.zeros(1, 10, dtype=torch.bool), causal, words=words, window=window)
    names = {27: "nsubj", 16: "det", 4: "amod"}
    columns = [None if h == -1 else {"all", *(("all_nonroot", names.get(r)) if h >= 0 else ())}
               for h, r in zip(head, relation)]
    want = loop_syntax_chance(token_word, head, columns, causal, window)
    got = syntax_chance(batch)[0, 0].numpy()
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert want[COLUMNS.index(("all", "dependent_to_head"))] > 0
    counts = METRICS["syntax"].function(batch)[1][0, 0].numpy()
    assert counts[COLUMNS.index(("all", "dependent_to_head"))] == 5  # the root counts in "all" ...
    assert counts[COLUMNS.index(("all_nonroot", "dependent_to_head"))] == 4  # ... and nowhere else


def test_syntax_chance_of_a_batch_without_trees_is_zero_per_column():
    batch = random_batch([5, 3], causal=False, specials="keep")  # plain text: no words, no gold heads
    found = syntax_chance(batch)
    assert found.shape == (2, 1, len(PLAIN_COLUMNS)) and found.dtype == torch.float64 and not found.any()
