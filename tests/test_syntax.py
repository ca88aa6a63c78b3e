"""Syntactic heads: exact positional heads equal the offset baseline, a plain loop over Hugging Face attentions
agrees with the vectorised functions, and tokens of a sentence's own text go to its words by their characters,
for WordPiece and byte-level BPE."""

import math

import numpy as np
import pytest
import torch

from headscan.corpus import read_corpus
from headscan.corpus.words import DIRECTIONS, RELATIONS, ROOT, relation_id, word_alignment
from headscan.metrics import METRICS, AttentionBatch
from headscan.metrics.syntax import (
    BASELINE_OFFSETS,
    COLUMNS,
    PLAIN_COLUMNS,
    SCORED,
    VISIBLE,
    attach_baseline,
    best_baseline,
    dependency_accuracy,
    offset_baseline,
    visible_heads,
    word_attention,
)
from headscan.models import pattern_forward
from headscan.tables import TABLES

# Punctuation, clitics, hyphens, an e-mail address, numbers and long words: several tokens a word.
HARD = [
    ["Don't", "e-mail", "me", "at", "jo.smith@example.com", ",", "please", "!"],
    ["The", "unbelievably", "well-known", "café", "'s", "owner", "paid", "$", "3.50", "(", "tax", "incl.", ")", "."],
]


@pytest.fixture(scope="module")
def wordpiece():
    """minilm's WordPiece tokenizer, without loading the model."""
    from transformers import AutoTokenizer

    from headscan.models import ALIASES

    return AutoTokenizer.from_pretrained(ALIASES["minilm"].locate())


@pytest.fixture(scope="module")
def ewt(ewt_dev):
    """The first 120 sentences of EWT dev: segments with words, heads and relations."""
    return read_corpus(ewt_dev, limit=120).segments


def text_word_ids(tokenizer, segment, *, specials, bos=None):
    """The token ids of `segment`'s own text and each token's word (-1: none), by a plain loop: the words are found
    in the text one after the other, and a token goes to the word holding its first non-space character (a token
    of spaces only to the next word). Independent of headscan's `align_tokens`."""
    text = segment.text
    spans, cursor = [], 0
    for word in segment.words:
        start = text.index(word, cursor)
        spans.append((start, start + len(word)))
        cursor = start + len(word)

    def word_of(c):
        return next((w for w, (a, b) in enumerate(spans) if a <= c < b), None)

    encoded = tokenizer(text, add_special_tokens=specials, return_offsets_mapping=True, return_special_tokens_mask=True)
    word_ids = []
    for (start, stop), special in zip(encoded["offset_mapping"], encoded["special_tokens_mask"]):
        if special:
            word_ids.append(-1)
            continue
        held = [word_of(c) for c in range(start, stop) if not text[c].isspace() and word_of(c) is not None]
        word_ids.append(held[0] if held else next((w for w, (a, _) in enumerate(spans) if a >= start), len(spans) - 1))
    ids = list(encoded["input_ids"])
    if bos is not None:
        ids, word_ids = [bos, *ids], [-1, *word_ids]
    return ids, word_ids


def aligned(tokenizer, segments, *, specials, bos=None, max_tokens=None):
    """Right-padded ids, attention mask, `WordAlignment` and segments of `segments` tokenised from their text,
    keeping those whose every word got a token (a tokenless word would make an exact neighbour head differ from
    the baseline)."""
    encoded = [text_word_ids(tokenizer, s, specials=specials, bos=bos) for s in segments]
    keep = [i for i, (ids, words) in enumerate(encoded) if (max_tokens is None or len(ids) <= max_tokens)
            and set(range(len(segments[i].words))) <= set(words)]
    assert len(keep) > 0.8 * len(segments)
    encoded, segments = [encoded[i] for i in keep], [segments[i] for i in keep]
    width = max(len(ids) for ids, _ in encoded)
    ids = torch.zeros(len(encoded), width, dtype=torch.long)
    for row, (tokens, _) in enumerate(encoded):
        ids[row, : len(tokens)] = torch.tensor(tokens)
    mask = torch.tensor([[k < len(tokens) for k in range(width)] for tokens, _ in encoded])
    words = word_alignment([w for _, w in encoded], [s.heads for s in segments], [s.deprels for s in segments], width)
    return ids, mask, words, segments


def exact_offset_pattern(mask, offset):
    """(batch, 1, q, k) every real query puts all its attention on q + offset (itself where that is not real)."""
    b, n = mask.shape
    q = torch.arange(n)
    target = q + offset
    inside = (target >= 0) & (target < n)
    target = torch.where(inside, target, q)  # (q,)
    real_target = mask.gather(1, target.expand(b, n))
    target = torch.where(real_target, target.expand(b, n), q.expand(b, n))  # (batch, q)
    pattern = torch.nn.functional.one_hot(target, n).double() * mask[:, :, None]  # (batch, q, k)
    return pattern[:, None]


def assert_equals_baseline(sums, counts, words, offset, head=0):
    base_sums, base_counts = offset_baseline(words)
    column = BASELINE_OFFSETS.index(offset)
    accuracy = sums[:, head].sum(0) / counts[:, head].sum(0)
    baseline = base_sums[:, column].sum(0) / base_counts[:, column].sum(0)
    torch.testing.assert_close(counts[:, head].sum(0).double(), base_counts[:, column].sum(0), rtol=0, atol=0)
    defined = base_counts[:, column].sum(0) > 0
    assert defined.sum() >= 20  # most relations occur in the sample: the equality is not vacuous
    np.testing.assert_allclose(accuracy[defined].double().numpy(), baseline[defined].numpy(), rtol=0, atol=1e-12)
    return accuracy


# --- a test that cannot pass by accident: exact positional heads equal the offset baseline -------------------


@pytest.mark.parametrize("offset", [-1, 1])
def test_an_exact_neighbour_head_scores_the_baseline_at_its_offset_on_wordpiece(wordpiece, ewt, offset):
    ids, mask, words, _ = aligned(wordpiece, ewt, specials=True)
    assert (words.token_word[:, 0] == -1).all()  # [CLS] is no word
    sums, counts = dependency_accuracy(exact_offset_pattern(mask, offset), words)
    accuracy = assert_equals_baseline(sums, counts, words, offset)
    # and not every offset's baseline: the positional head is told apart from the others
    other = BASELINE_OFFSETS.index(-offset)
    base_sums, base_counts = offset_baseline(words)
    assert not torch.allclose(accuracy.double(), (base_sums[:, other].sum(0) / base_counts[:, other].sum(0)), equal_nan=True)


@pytest.mark.parametrize("offset", [-1, 1])
def test_an_exact_neighbour_head_scores_the_baseline_at_its_offset_on_byte_level_bpe(tiny_models, ewt, offset):
    model = tiny_models["gpt2"]
    ids, mask, words, _ = aligned(model.tokenizer, ewt, specials=False, bos=model.special_token_ids["bos"])
    sums, counts = dependency_accuracy(exact_offset_pattern(mask, offset), words)
    assert_equals_baseline(sums, counts, words, offset)


def test_planted_previous_token_head_scores_exactly_the_offset_minus_one_baseline(tmp_path, ewt):
    """The planted GPT-2's layer-0 previous-token head, run on EWT sentences tokenised from their words."""
    from headscan.models import load_model
    from headscan.testing import build_planted_checkpoint

    path, planted = build_planted_checkpoint(tmp_path / "planted", "gpt2", n_layers=1, max_positions=256)
    model = load_model(str(path), device="cpu")
    bos = model.special_token_ids["bos"] if model.prepend_bos else None
    ids, mask, words, _ = aligned(model.tokenizer, ewt, specials=False, bos=bos, max_tokens=256)
    n_words = (words.token_word.max(-1).values + 1).sum()
    assert len(ids) >= 60 and (words.token_word >= 0).sum() > 1.5 * n_words  # long sentences, many tokens a word
    layer, head = planted["prev_token"]
    captured = {}
    with pattern_forward(model, {layer: lambda pattern, hook: captured.update(pattern=pattern.double())}) as forward:
        forward(ids, mask.long())
    sums, counts = dependency_accuracy(captured["pattern"], words)
    assert_equals_baseline(sums, counts, words, -1, head=head)
    # the random heads of the same layer do not
    random = [h for h in range(model.n_heads) if h not in [h for _, h in planted.values()]]
    base_sums, base_counts = offset_baseline(words)
    baseline = base_sums[:, BASELINE_OFFSETS.index(-1)].sum(0) / base_counts[:, BASELINE_OFFSETS.index(-1)].sum(0)
    for other in random:
        accuracy = sums[:, other].sum(0) / counts[:, other].sum(0)
        assert not torch.allclose(accuracy.double(), baseline, equal_nan=True)


def test_the_sweeps_syntax_table_for_a_planted_previous_token_head_is_the_offset_minus_one_baseline(tmp_path, ewt_dev):
    """Through `headscan.sweep` and its tables: where -1 is the best offset, the planted head's accuracy and
    count are the baseline's; elsewhere it cannot beat the best offset. A random head of the layer is not the baseline."""
    import headscan
    from headscan.testing import build_planted_checkpoint

    path, planted = build_planted_checkpoint(tmp_path / "planted", "gpt2", n_layers=1, max_positions=256)
    tables = headscan.sweep(str(path), ewt_dev, limit=40, max_len=256, device="cpu", bootstrap=0)
    layer, head = planted["prev_token"]
    syntax = tables["syntax"]
    rows = syntax[(syntax["layer"] == layer) & (syntax["head"] == head) & (syntax["count"] > 0)]
    at_minus_one = rows[rows.baseline_offset == -1]
    assert {"all", "det", "amod", "compound"} <= set(at_minus_one.relation)
    # in sample, the offset best on the whole corpus
    np.testing.assert_allclose(at_minus_one["value"], at_minus_one["baseline_in_sample"], rtol=0, atol=1e-12)
    assert (rows["value"] <= rows["baseline_in_sample"] + 1e-12).all()
    # held out, where both halves chose -1 the cross-fitted baseline is the head too
    both = rows[(rows.baseline_offset_even == -1) & (rows.baseline_offset_odd == -1)]
    assert {"all", "det"} <= set(both.relation)
    np.testing.assert_allclose(both["value"], both["baseline"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(both["vs_baseline"], 0.0, rtol=0, atol=1e-12)
    random = [h for h in range(tables["heads"]["head"].max() + 1) if (layer, h) not in planted.values()]
    others = syntax[(syntax["layer"] == layer) & syntax["head"].isin(random) & (syntax.relation == "all")]
    assert len(others) and ((others["value"] - others["baseline_in_sample"]).abs() > 1e-3).all()
    words = syntax[(syntax.relation == "all") & (syntax.direction == "dependent_to_head")]["count"]
    assert words.nunique() == 1 and words.iloc[0] > 500  # every head counts the same dependents


# --- an independent check: a plain loop over Hugging Face attentions --------------------------------------


def loop_accuracy(attentions, word_ids, heads, deprels, relations, *, causal=False):
    """Clark et al.'s procedure written out with loops: {(layer, head, relation, direction): (correct, total)}.

    Every word but the root counts, a word without a token too (as a miss). A `causal` model's ``_visible``
    directions count the dependents (never a root) whose other word of the pair the attending word sees: some
    token of the attending word at or after some token of the attended one. A bidirectional model has none."""
    n_words = len(heads)
    tokens_of = [[t for t, w in enumerate(word_ids) if w == i] for i in range(n_words)]

    def sees(i, j):  # word i can attend to word j
        return bool(tokens_of[i] and tokens_of[j]) and (not causal or min(tokens_of[j]) <= max(tokens_of[i]))

    results = {}
    for layer, layer_attention in enumerate(attentions):
        for head, attention in enumerate(layer_attention[0]):
            attention = attention.double().numpy()
            word = np.zeros((n_words, n_words))
            for i in range(n_words):
                for j in range(n_words):
                    # from word i: mean over its tokens; to word j: sum over its tokens
                    word[i, j] = attention[np.ix_(tokens_of[i], tokens_of[j])].sum() / max(len(tokens_of[i]), 1)
            for direction, matrix in zip(DIRECTIONS, (word, word.T)):
                matrix = matrix.copy()
                np.fill_diagonal(matrix, 0)
                # no weight on any other word (a word without a token): no prediction, a miss
                predicted = [int(np.argmax(row)) if row.max() > 0 else -1 for row in matrix]
                for i in range(n_words):
                    root = heads[i] == 0  # no head word: a miss in "all" (Clark et al.), left out of the rest
                    base = deprels[i].split(":")[0]
                    hit = not root and predicted[i] == heads[i] - 1
                    if root:
                        seen = False
                    elif not causal:
                        seen = True
                    else:
                        seen = sees(i, heads[i] - 1) if direction == "dependent_to_head" else sees(heads[i] - 1, i)
                    for relation in relations:
                        if relation == "all" or (not root and relation in ("all_nonroot", base)):
                            key = (layer, head, relation, direction)
                            correct, total = results.get(key, (0, 0))
                            results[key] = (correct + hit, total + 1)
                            if causal and seen:
                                key = (layer, head, relation, VISIBLE[direction])
                                correct, total = results.get(key, (0, 0))
                                results[key] = (correct + hit, total + 1)
    return results


def test_a_plain_loop_over_hugging_face_attentions_agrees(wordpiece, ewt):
    from transformers import AutoModel

    from headscan.models import ALIASES

    tokenizer = wordpiece
    model = AutoModel.from_pretrained(ALIASES["minilm"].locate(), attn_implementation="eager").eval()
    segments = [s for s in ewt if 6 <= len(s.words) <= 25][:6]
    relations = ["all", "all_nonroot", "nsubj", "det", "obj", "case", "punct"]
    encoded = [text_word_ids(tokenizer, s, specials=True) for s in segments]
    width = max(len(ids) for ids, _ in encoded)
    # the vectorised functions get one padded batch, with NaN in the padding that must not matter
    padded = torch.full((len(segments), model.config.num_hidden_layers, model.config.num_attention_heads, width, width),
                        float("nan"), dtype=torch.float64)
    want = {}
    for row, (segment, (ids, word_ids)) in enumerate(zip(segments, encoded)):
        with torch.no_grad():
            attentions = model(torch.tensor([ids]), output_attentions=True).attentions  # layers x (1, head, n, n)
        n = len(ids)
        for layer, attention in enumerate(attentions):
            padded[row, layer, :, :n, :n] = attention[0].double()
        for key, (correct, total) in loop_accuracy(attentions, word_ids, segment.heads, segment.deprels, relations).items():
            c, t = want.get(key, (0, 0))
            want[key] = (c + correct, t + total)
    missing = [sorted(set(range(len(s.words))) - set(w)) for s, (_, w) in zip(segments, encoded)]
    words = word_alignment([w for _, w in encoded], [s.heads for s in segments], [s.deprels for s in segments], width,
                           missing)
    checked = 0
    for layer in range(model.config.num_hidden_layers):
        sums, counts = dependency_accuracy(padded[:, layer], words)
        assert sums.shape[-1] == counts.shape[-1] == len(PLAIN_COLUMNS)  # bidirectional: no visible columns
        for (relation, direction), column in ((c, i) for i, c in enumerate(PLAIN_COLUMNS)):
            for head in range(model.config.num_attention_heads):
                key = (layer, head, relation, direction)
                if key in want:
                    assert (sums[:, head, column].sum().item(), counts[:, head, column].sum().item()) == want[key], key
                    checked += 1
                elif relation in relations:
                    assert counts[:, head, column].sum().item() == 0
    assert checked == len(want) == 6 * 12 * len(relations) * 2
    assert sum(want[(0, 0, "all", "dependent_to_head")]) > 0


def test_the_sweeps_syntax_table_equals_the_plain_loop(wordpiece, ewt_dev):
    """End to end: the syntax table of a minilm sweep over EWT sentences, against the loop on HF attentions."""
    from transformers import AutoModel

    import headscan
    from headscan.models import ALIASES

    tables = headscan.sweep("minilm", ewt_dev, limit=8, device="cpu", bootstrap=0)
    syntax = tables["syntax"].set_index(["layer", "head", "relation", "direction"])
    model = AutoModel.from_pretrained(ALIASES["minilm"].locate(), attn_implementation="eager").eval()
    relations = ["all", "all_nonroot", "det", "nsubj", "punct"]
    want = corpus_loop_accuracy(model, wordpiece, read_corpus(ewt_dev, limit=8).segments, relations)
    assert len(want) == 6 * 12 * len(relations) * 2
    assert set(syntax.index.get_level_values("direction")) == set(DIRECTIONS)  # a bidirectional model: no _visible
    for key, (correct, total) in want.items():
        assert (syntax.loc[key, "sum"], syntax.loc[key, "count"]) == (correct, total), key


def corpus_loop_accuracy(model, tokenizer, segments, relations) -> dict:
    """`loop_accuracy` added up over `segments`, each run alone through the Hugging Face `model`."""
    want = {}
    for segment in segments:
        ids, word_ids = text_word_ids(tokenizer, segment, specials=True)
        with torch.no_grad():
            attentions = model(torch.tensor([ids]), output_attentions=True).attentions
        for key, (correct, total) in loop_accuracy(attentions, word_ids, segment.heads, segment.deprels, relations).items():
            c, t = want.get(key, (0, 0))
            want[key] = (c + correct, t + total)
    return want


# --- word alignment ------------------------------------------------------------------------------------------


def test_words_without_a_token_or_cut_off_are_not_scored():
    # word 2 has no token (cut off): its dependent (word 1) and itself are not scored, not even as a root
    words = word_alignment([[-1, 0, 1, 1]], [[2, 3, 0]], [["det", "nsubj", "root"]])
    assert words.head.tolist() == [[1, -1, -1]]
    _, counts = offset_baseline(words)
    assert counts[0, 0, SCORED.index("all")] == 1 and counts[0, 0, SCORED.index("det")] == 1


def test_all_counts_root_words_as_misses_as_clark_et_al():
    """`all` is Clark et al.'s: every word with a token, the root a miss; `all_nonroot` leaves the root out.
    By hand: "cats sleep well", cats -nsubj-> sleep (root) <-advmod- well; a perfect dependent-to-head head gets
    2 of 3 in `all`, 2 of 2 in `all_nonroot`; the offset baseline +1 gets 1 of 3."""
    words = word_alignment([[-1, 0, 1, 2]], [[2, 0, 2]], [["nsubj", "root", "advmod"]])
    assert words.head.tolist() == [[1, ROOT, 1]]
    pattern = torch.zeros(1, 1, 4, 4, dtype=torch.float64)
    pattern[0, 0, :, 0] = 0.1  # a little on the BOS, which is no word
    for q, k in [(0, 0), (1, 2), (2, 1), (3, 2)]:  # each word on its head; the root on "cats"
        pattern[0, 0, q, k] += 0.9
    sums, counts = dependency_accuracy(pattern, words)
    column = {relation: COLUMNS.index((relation, "dependent_to_head")) for relation in ("all", "all_nonroot")}
    assert (sums[0, 0, column["all"]], counts[0, 0, column["all"]]) == (2, 3)
    assert (sums[0, 0, column["all_nonroot"]], counts[0, 0, column["all_nonroot"]]) == (2, 2)
    base_sums, base_counts = offset_baseline(words)
    plus_one = BASELINE_OFFSETS.index(1)
    assert (base_sums[0, plus_one, column["all"]], base_counts[0, plus_one, column["all"]]) == (1, 3)
    # the root (ROOT, -2, at word 1) is never hit by the offset that lands on -2 (1 - 3)
    assert base_sums[0, BASELINE_OFFSETS.index(-3), column["all"]] == 0


def test_a_causal_models_baseline_uses_only_offsets_its_queries_can_see():
    sums = np.zeros((len(BASELINE_OFFSETS), 1))
    sums[BASELINE_OFFSETS.index(1)] = 9.0  # +1, which no causal query sees, would win
    sums[BASELINE_OFFSETS.index(-2)] = 3.0
    counts = np.full_like(sums, 10.0)
    assert best_baseline(sums, counts, causal=False) == (pytest.approx([0.9]), [1])
    value, offset = best_baseline(sums, counts, causal=True)
    assert value.tolist() == [0.3] and offset.tolist() == [-2]


def test_relations_fold_subtypes_and_keep_the_ud_inventory():
    assert RELATIONS[0] == "all" and len(RELATIONS) == 37 and "root" not in RELATIONS
    for deprel, base in [("obl:tmod", "obl"), ("nmod:poss", "nmod"), ("compound:prt", "compound"), ("aux:pass", "aux"),
                         ("acl:relcl", "acl"), ("NSUBJ", "nsubj")]:
        assert RELATIONS[relation_id(deprel)] == base
    assert relation_id("dobj") == relation_id("root") == -1  # not UD relations: counted in "all" only


# --- the pure functions ------------------------------------------------------------------------------------


def test_word_attention_sums_to_words_and_averages_from_words():
    torch.manual_seed(0)
    pattern = torch.softmax(torch.randn(1, 2, 6, 6, dtype=torch.float64), -1)
    token_word = torch.tensor([[-1, 0, 0, 1, 2, -1]])
    attention = word_attention(pattern, token_word, 3)
    torch.testing.assert_close(attention[0, :, 0, 1], (pattern[0, :, 1, 3] + pattern[0, :, 2, 3]) / 2)
    torch.testing.assert_close(attention[0, :, 2, 0], pattern[0, :, 4, 1] + pattern[0, :, 4, 2])
    # rows lose the special tokens' share and are not renormalised
    assert (attention.sum(-1) < 1).all()


@pytest.mark.parametrize("causal", [False, True])
def test_baseline_by_loop_and_best_offset(wordpiece, ewt, causal):
    """The offsets' hits and counts per column against a loop: a bidirectional model's plain columns alone, a
    causal one's visible columns too, over the dependents whose pair the attending word sees (some token of it at
    or after some token of the other)."""
    _, _, words, segments = aligned(wordpiece, ewt[:30], specials=True)
    sums, counts = offset_baseline(words, causal=causal)
    own = COLUMNS if causal else PLAIN_COLUMNS
    assert sums.shape[-1] == counts.shape[-1] == len(own)
    for b, segment in enumerate(segments):
        token_word = words.token_word[b].tolist()
        tokens_of = [[t for t, w in enumerate(token_word) if w == i] for i in range(len(segment.words))]
        for column, (relation, direction) in enumerate(own):
            visible = direction.endswith("_visible")
            direction = direction.removesuffix("_visible")
            for o, d in enumerate(BASELINE_OFFSETS):
                hits = total = 0
                for i, (head, deprel) in enumerate(zip(segment.heads, segment.deprels)):
                    if relation != "all" and (head == 0 or relation not in ("all_nonroot", deprel.split(":")[0])):
                        continue
                    if visible:
                        if head == 0:
                            continue
                        looks, seen = (i, head - 1) if direction == "dependent_to_head" else (head - 1, i)
                        if min(tokens_of[seen]) > max(tokens_of[looks]):
                            continue
                    total += 1  # a root counts in "all", never as a hit
                    hits += head != 0 and ((head - 1 == i + d) if direction == "dependent_to_head" else (i == head - 1 + d))
                assert (sums[b, o, column].item(), counts[b, o, column].item()) == (hits, total)
    if causal:
        return
    value, offset = best_baseline(sums.sum(0), counts.sum(0))
    det = COLUMNS.index(("det", "dependent_to_head"))
    assert offset[det] == 1 and value[det] > 0.5  # determiners mostly precede their noun
    assert offset[COLUMNS.index(("det", "head_to_dependent"))] == -1  # the transpose looks back
    assert math.isnan(value[COLUMNS.index(("orphan", "dependent_to_head"))])


def test_scores_ignore_garbage_in_padding(wordpiece, ewt):
    ids, mask, words, _ = aligned(wordpiece, ewt[:12], specials=True)
    torch.manual_seed(1)
    pattern = torch.softmax(torch.randn(len(ids), 3, ids.shape[1], ids.shape[1], dtype=torch.float64), -1)
    padded = ~(mask[:, None, :, None] & mask[:, None, None, :])
    clean = dependency_accuracy(torch.where(padded, 0.0, pattern), words)
    for garbage in (float("nan"), float("inf"), 1e6):
        dirty = dependency_accuracy(torch.where(padded, garbage, pattern), words)
        torch.testing.assert_close(dirty, clean)


def test_syntax_metric_is_registered_with_its_table_and_needs_words():
    metric = METRICS["syntax"]
    assert metric.table == "syntax" and list(TABLES["syntax"].keys) == ["relation", "direction"]
    assert metric.axis.values(None) == list(COLUMNS) and len(COLUMNS) == 4 * (len(RELATIONS) + 1)
    # a model fills the plain directions, and a causal one the visible ones after them
    assert metric.axis.positions(None, True) == list(COLUMNS)
    assert metric.axis.positions(None, False) == list(PLAIN_COLUMNS) == list(COLUMNS[: 2 * (len(RELATIONS) + 1)])
    assert {d for _, d in PLAIN_COLUMNS} == set(DIRECTIONS)
    from headscan.analysis.syntax import VISIBLE as REPORTED  # restated there so that the report imports no torch

    assert REPORTED == VISIBLE
    mask = torch.ones(2, 5, dtype=torch.bool)
    batch = AttentionBatch(torch.full((2, 3, 5, 5), 0.2), mask, mask, torch.zeros(2, 5, dtype=torch.long),
                           torch.zeros_like(mask), False)
    sums, counts = metric.function(batch)  # no word alignment: nothing counts
    assert sums.shape == counts.shape == (2, 3, len(PLAIN_COLUMNS)) and not counts.any()
    assert metric.chance_sums(batch).shape == (2, 1, len(PLAIN_COLUMNS))
    causal = AttentionBatch(torch.full((2, 3, 5, 5), 0.2), mask, mask, torch.zeros(2, 5, dtype=torch.long),
                            torch.zeros_like(mask), True)
    assert metric.function(causal)[0].shape == (2, 3, len(COLUMNS)) and metric.chance_sums(causal).shape == (2, 1, len(COLUMNS))


def test_attach_baseline_adds_the_best_offset_per_relation_and_direction():
    import pandas as pd

    frame = pd.DataFrame({"relation": ["det", "det"], "direction": list(DIRECTIONS), "value": [0.9, 0.4]})
    for causal, own in ((False, PLAIN_COLUMNS), (True, COLUMNS)):  # a bidirectional model's columns, a causal one's
        sums = torch.zeros(len(BASELINE_OFFSETS), len(own))
        counts = torch.full_like(sums, 10.0)
        sums[BASELINE_OFFSETS.index(-1), own.index(("det", "dependent_to_head"))] = 6
        sums[BASELINE_OFFSETS.index(-2), own.index(("det", "head_to_dependent"))] = 6
        out = attach_baseline(frame, sums, counts, causal=causal)
        assert out["baseline"].tolist() == [0.6, 0.6] and out["baseline_offset"].tolist() == [-1, -2]


# --- special tokens left out: the syntax table reads the attention as the model gave it -------------------------


@pytest.mark.parametrize("specials", ["keep", "exclude"])
def test_tiny_bert_syntax_table_equals_the_plain_loop_with_specials(tiny_bert, tmp_path, specials):
    """The syntax table of a tiny BERT over a small treebank against `loop_accuracy` on Hugging Face's own
    attentions: with ``--specials exclude`` too, which renormalises the other metrics' pattern but must leave word
    attention as the model gave it (scoring syntax on the renormalised pattern would pass every other test)."""
    from conftest import treebank_corpus
    from transformers import AutoModel, AutoTokenizer

    import headscan

    path = treebank_corpus(tmp_path, 6)
    tables = headscan.sweep(str(tiny_bert), path, device="cpu", bootstrap=0, specials=specials, attention="eager")
    syntax = tables["syntax"].set_index(["layer", "head", "relation", "direction"])
    model = AutoModel.from_pretrained(tiny_bert, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    relations = ["all", "nsubj", "det", "obj", "amod"]
    want = corpus_loop_accuracy(model, tokenizer, read_corpus(path).segments, relations)
    assert len(want) == 2 * 4 * len(relations) * 2
    assert set(syntax.index.get_level_values("direction")) == set(DIRECTIONS)  # a bidirectional model: no _visible
    for key, (correct, total) in want.items():
        assert (syntax.loc[key, "sum"], syntax.loc[key, "count"]) == (correct, total), key


def test_eager_and_chunked_syntax_agree_with_specials_excluded(tiny_gpt2, tiny_bert, tmp_path):
    """Every table of an eager and a chunked sweep over a treebank with ``--specials exclude``, blocks of 3 queries."""
    from conftest import treebank_corpus

    import headscan

    path = treebank_corpus(tmp_path, 6)
    for model in (tiny_gpt2, tiny_bert):
        settings = dict(device="cpu", bootstrap=0, specials="exclude", max_len=48, batch_size=2)
        eager = headscan.sweep(str(model), path, attention="eager", **settings)
        chunked = headscan.sweep(str(model), path, attention="chunked", query_chunk=3, **settings)
        assert "syntax" in eager.frames
        for name, frame in eager.frames.items():
            np.testing.assert_array_equal(chunked[name]["count"], frame["count"], err_msg=name)
            np.testing.assert_allclose(chunked[name]["value"], frame["value"], rtol=1e-6, atol=1e-6, err_msg=name)


# --- visible heads and the paired comparison with the baseline ----------------------------------------------


def test_visible_head_accuracy_count_and_chance_of_a_causal_pattern_equal_a_plain_loop():
    """A causal model cannot pick a head word to its right: the ``_visible`` rows count only the dependents whose
    head (dependent -> head) or dependent (head -> dependent) the attending word sees. Two sentences with words of
    several tokens and heads on both sides, a hand-made causal pattern, against `loop_accuracy` and chance by hand:
    1/m over the m other words the attending word sees, for the visible dependents."""
    # "the old cat sleeps" (det, amod, nsubj, root) and "dogs bark loudly" (nsubj, root, advmod); BOS first
    word_ids = [[-1, 0, 1, 1, 2, 3, 3, -1], [-1, 0, 0, 1, 2, 2, -1, -1]]
    heads = [[3, 3, 4, 0], [2, 0, 2]]
    deprels = [["det", "amod", "nsubj", "root"], ["nsubj", "root", "advmod"]]
    words = word_alignment(word_ids, heads, deprels, 8)
    torch.manual_seed(3)
    n = 8
    scores = torch.randn(2, 3, n, n, dtype=torch.float64).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -torch.inf)
    pattern = torch.softmax(scores, -1)
    sums, counts = dependency_accuracy(pattern, words, causal=True)
    relations = ["all", "all_nonroot", "det", "amod", "nsubj", "advmod"]
    want = {}
    for row in range(2):
        for key, (correct, total) in loop_accuracy([pattern[row : row + 1]], word_ids[row], heads[row], deprels[row],
                                                   relations, causal=True).items():
            c, t = want.get(key, (0, 0))
            want[key] = (c + correct, t + total)
    for (_, head, relation, direction), expected in want.items():
        column = COLUMNS.index((relation, direction))
        assert (sums[:, head, column].sum().item(), counts[:, head, column].sum().item()) == expected
    # by hand: in "the old cat sleeps" every head is to the right of its dependent; in "dogs bark loudly" only
    # "loudly" sees its head
    assert want[(0, 0, "all", "dependent_to_head_visible")][1] == 1 and want[(0, 0, "all", "dependent_to_head")][1] == 7
    assert (0, 0, "det", "dependent_to_head_visible") not in want and want[(0, 0, "det", "dependent_to_head")][1] == 1
    assert want[(0, 0, "det", "head_to_dependent_visible")][1] == 1  # "cat" sees "the"
    # chance: 1/m, m the other words the attending word can see (a causal word sees those that start at or before
    # its last token)
    metric = METRICS["syntax"]
    mask = torch.tensor(word_ids) >= 0
    batch = AttentionBatch(pattern, mask, mask, torch.zeros(2, n, dtype=torch.long), torch.zeros_like(mask), True,
                           words=words)
    chance = metric.chance_sums(batch)[:, 0]  # (batch, column)
    # dependent -> head: "loudly" sees "dogs" and "bark"
    assert chance[:, COLUMNS.index(("all", "dependent_to_head_visible"))].tolist() == [0.0, 0.5]
    # head -> dependent: "the" is seen by "old", "cat", "sleeps"; "old" by "cat", "sleeps"; "cat" by "sleeps";
    # "dogs" by "bark", "loudly"; "loudly" by no earlier head ("bark" cannot see it: not a visible dependent)
    expected = [1 / 3 + 1 / 2 + 1, 1 / 2]
    np.testing.assert_allclose(chance[:, COLUMNS.index(("all", "head_to_dependent_visible"))].numpy(), expected)


def test_a_bidirectional_model_scores_no_visible_rows_and_its_plain_rows_are_a_causal_flags_plain_rows(wordpiece, ewt):
    """A bidirectional model sees every head (`visible_heads`: every scored dependent, never a root), so its visible
    rows would be its plain rows again (``all``'s its ``all_nonroot``): it has none, and its plain columns are to the
    bit those the causal path scores from the same pattern (which `loop_accuracy` checks)."""
    ids, mask, words, _ = aligned(wordpiece, ewt[:20], specials=True)
    seen = visible_heads(words, causal=False)  # (batch, word, direction)
    assert torch.equal(seen, (words.head >= 0)[..., None].expand_as(seen)) and seen.any()
    torch.manual_seed(2)
    pattern = torch.softmax(torch.randn(len(ids), 2, ids.shape[1], ids.shape[1], dtype=torch.float64), -1)
    plain = len(PLAIN_COLUMNS)
    for bidirectional, causal in ((dependency_accuracy(pattern, words), dependency_accuracy(pattern, words, causal=True)),
                                  (offset_baseline(words), offset_baseline(words, causal=True))):
        for mine, theirs in zip(bidirectional, causal):
            assert mine.shape[-1] == plain and theirs.shape[-1] == len(COLUMNS)
            torch.testing.assert_close(mine, theirs[..., :plain], rtol=0, atol=0)


def test_the_paired_difference_with_the_baseline_equals_a_plain_loop_over_documents(tiny_bert, tmp_path):
    """``vs_baseline_in_sample`` is the head's accuracy minus the offset best on the whole corpus, on the same
    dependents; its interval is the delta method over documents: D +- 1.96 sqrt(n / (n - 1) sum_u (d_u - D c_u)^2)
    / C, clipped to [-1, 1], with d_u the head's hits minus the offset's in document u. By loops over Hugging
    Face's attentions (the cross-fitted ``vs_baseline``: tests/test_syntax_cross_fit.py)."""
    from conftest import treebank_corpus
    from transformers import AutoModel, AutoTokenizer

    import headscan

    path = treebank_corpus(tmp_path, 12, per_document=3)
    tables = headscan.sweep(str(tiny_bert), path, device="cpu", bootstrap=0, attention="eager")
    syntax = tables["syntax"]
    model = AutoModel.from_pretrained(tiny_bert, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    relations = ["all", "nsubj", "det", "obj"]
    segments = read_corpus(path).segments
    head_hits, base_hits = [], []  # per segment: {(layer, head, relation, direction): (hits, total)}, {(offset, ...)}
    for segment in segments:
        head_hits.append(corpus_loop_accuracy(model, tokenizer, [segment], relations))
        base = {}
        for direction in (*DIRECTIONS, *VISIBLE.values()):
            plain = direction.removesuffix("_visible")
            for relation in relations:
                for d in BASELINE_OFFSETS:
                    hits = 0
                    for i, (head, deprel) in enumerate(zip(segment.heads, segment.deprels)):
                        if head == 0 or relation not in ("all", "all_nonroot", deprel.split(":")[0]):
                            continue
                        hits += (head - 1 == i + d) if plain == "dependent_to_head" else (i == head - 1 + d)
                    base[(d, relation, direction)] = hits
        base_hits.append(base)
    documents = [segment.document for segment in segments]
    checked = 0
    for row in syntax[syntax["relation"].isin(relations) & (syntax["count"] > 0)].itertuples():
        key = (row.layer, row.head, row.relation, row.direction)
        per_unit: dict = {}
        for s, document in enumerate(documents):
            hits, total = head_hits[s].get(key, (0, 0))
            d_u, c_u = per_unit.get(document, (0, 0))
            per_unit[document] = (d_u + hits - base_hits[s][(row.baseline_offset, row.relation, row.direction)],
                                  c_u + total)
        d = np.array([v[0] for v in per_unit.values()], dtype=float)
        c = np.array([v[1] for v in per_unit.values()], dtype=float)
        mean = d.sum() / c.sum()
        se = math.sqrt(len(d) / (len(d) - 1) * ((d - mean * c) ** 2).sum()) / c.sum()
        assert row.vs_baseline_in_sample == pytest.approx(mean, abs=1e-12)
        assert row.vs_baseline_in_sample == pytest.approx(row.value - row.baseline_in_sample, abs=1e-12)
        assert row.vs_baseline_in_sample_low == pytest.approx(max(-1.0, mean - 1.959963984540054 * se), abs=1e-9)
        assert row.vs_baseline_in_sample_high == pytest.approx(min(1.0, mean + 1.959963984540054 * se), abs=1e-9)
        checked += 1
    assert checked >= 2 * 4 * 2 * 3 and len(set(documents)) == 4  # layers, heads, a bidirectional model's 2 directions


def test_the_paired_difference_of_one_row_is_that_rows_in_the_whole_table(tiny_bert, tmp_path):
    """paired_difference reads each row alone: one row handed over gets what it gets among all the others."""
    from conftest import treebank_corpus

    import headscan
    from headscan.models import load_model
    from headscan.scan.passes.baseline import paired_difference
    from headscan.scan.plan import plan_sweep
    from headscan.scan.reduce import accumulate

    path = treebank_corpus(tmp_path, 9, per_document=3)
    syntax = headscan.sweep(str(tiny_bert), path, device="cpu", bootstrap=0)["syntax"]
    model, corpus = load_model(str(tiny_bert), device="cpu"), read_corpus(path)
    state = accumulate(model, corpus, plan_sweep(model, corpus, headscan.SweepConfig(device="cpu", bootstrap=0)))
    rows = syntax[(syntax["count"] > 0) & syntax["vs_baseline_in_sample"].notna()]
    for index in rows.index[:3]:
        value, low, high = paired_difference(syntax.loc[[index]], state.passes["baseline"])
        assert (value[0], low[0], high[0]) == pytest.approx(tuple(syntax.loc[index, [
            "vs_baseline_in_sample", "vs_baseline_in_sample_low", "vs_baseline_in_sample_high"]]), abs=1e-12)


@pytest.mark.parametrize(("text", "spans", "words", "want"), [
    ("a ", [(0, 1), (1, 2)], [(0, 1)], [0, 0]),  # spaces at the end go to the last word, even one at character 0
    ("ab  ", [(0, 2), (2, 4)], [(0, 2)], [0, 0]),
    ("  ", [(0, 2)], [], [-1]),  # no word at all: no word to go to
])
def test_a_token_of_trailing_spaces_goes_to_the_last_word_before_it(text, spans, words, want):
    from headscan.corpus.words import align_tokens

    assert align_tokens(text, spans, words)[0] == want
