"""Syntactic heads on gold treebanks (Clark et al. 2019): is a head's most-attended word the word's syntactic head?

For a CoNLL-U corpus each sentence is tokenised from its own text and each token given to one of its syntactic
words by characters (`headscan.corpus.words.align_tokens`); a `headscan.corpus.words.WordAlignment` carries, for
a batch, each token's word and each word's gold head and relation. Per layer, `dependency_accuracy` turns the token pattern into word attention and scores every head;
`offset_baseline` scores the fixed-offset baseline on the same words. Both return per-segment sums and counts,
so the sweep adds them up and bootstraps them like every metric.

The method, as in Clark et al.'s ``Syntax_Analysis.ipynb`` and ``bpe_utils.py``, and where it departs:

- Word attention: attention *to* a word is the sum over its tokens; attention *from* a word is the mean over
  its tokens (the ``mean`` mode the paper uses; the code's default, ``first``, keeps the first token's row).
  The mean is used because "first" lets a byte-level BPE word's leading space token, or a WordPiece word's
  first piece, speak for the whole word.
- Special tokens ([CLS], [SEP], BOS) and the word itself are removed before the argmax, without
  renormalising; ties go to the earlier word (numpy's argmax, as theirs).
- ``dependent_to_head``: correct when the dependent's most-attended word is its gold head.
  ``head_to_dependent`` is the notebook's transpose: correct when the gold head is the word that gives the
  dependent the most attention (the argmax over the dependent's *column*). Both count each dependent once.
- A word that gives (or, transposed, gets) no attention at all to (from) any other word predicts nothing
  and scores a miss; with softmax attention this happens only in causal models (the first word sees no
  other word, nobody looks at the last one). Clark's argmax would pick the first word.
- Baseline: the best single offset d in -3..2 per relation and direction, on the same words. ``d`` is
  where the attended word sits relative to the attending word, as in the offset profile: for
  ``dependent_to_head`` it predicts head = dependent + d, for ``head_to_dependent`` dependent = head + d.
  So a perfect previous-token head scores exactly the baseline at d = -1 in both directions. An offset
  that falls outside the sentence is a miss (Clark clamps to the root or the last word). Ties go to the
  larger offset, as Clark's ``max((score, offset))``. Only offsets a query of the model can see compete: in
  a causal model the attending word sees only words at or before it, so d <= 0 in both directions (a
  baseline at +1 would be a rule no head of it could follow).
- Relations: UD universal relations, subtypes folded into their base (``obl:tmod`` -> ``obl``,
  ``nmod:poss`` -> ``nmod``; so Clark's special case for ``poss`` has nothing to apply to), plus ``all``
  and ``all_nonroot``. ``all`` counts every word, punctuation included, and root words, which have no head
  word, as misses, as Clark et al. do; ``all_nonroot`` leaves the roots out. Other relations never count a
  root. A label that is not a UD relation counts in ``all`` and ``all_nonroot`` only.
- Visible heads: a causal query cannot see a word to its right, so a causal model's plain accuracy counts
  dependents whose head it could never pick. Beside each row a causal model's table has the same score over the
  dependents whose gold pair the attending word can see, in directions ``dependent_to_head_visible`` (the gold
  head's first token at or before the dependent's last) and ``head_to_dependent_visible`` (the dependent's first
  token at or before the head's last), with their own counts, chance and intervals. The causal mask alone decides
  it (a sliding window is left out, so every layer and the baseline count the same words). A bidirectional
  model's table has no ``_visible`` rows (`columns`): every dependent's head is visible to it, so they would equal
  its plain rows (for ``all``, ``all_nonroot``: a root has no head to see), and scoring them again would test each
  of its findings twice in one Benjamini-Hochberg family. What reads visible rows reads a bidirectional model's
  plain ones (`headscan.analysis.syntax.judged_rows`).
- Words cut off by ``max_len`` are neither scored nor anyone's predicted head. A word of the text that got no
  token (one token covering two words gives it to the first) is scored, and can only be a miss.
- Chance: 1/m for a dependent whose gold head is among the m candidate words, 0 otherwise (a root, a head
  out of sight): in ``dependent_to_head`` the candidates are the other words the dependent can attend to
  (in a causal model, those whose first token is at or before the dependent's last), in
  ``head_to_dependent`` the other words that can attend to the dependent. A uniformly random choice among
  the candidates, not the null head's argmax (uniform attention's argmax is the word with the most tokens).

This module does not run models or read treebanks: `headscan.corpus` reads the words, heads and relations
(`headscan.corpus.words`), and the sweep hands each layer's pattern here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ..corpus.words import DIRECTIONS, RELATIONS, ROOT, WordAlignment
from .batch import AttentionBatch
from .registry import Axis, register

__all__ = ["BASELINE_OFFSETS", "SCORED", "VISIBLE", "SCORED_DIRECTIONS", "COLUMNS", "PLAIN_COLUMNS", "columns",
           "scored_directions", "visible_heads", "word_attention", "word_rows", "add_word_rows",
           "most_attended", "dependency_accuracy", "accuracy_of", "offset_baseline", "visible_offsets", "best_baseline", "attach_baseline", "syntax_metric", "candidate_words",
           "syntax_chance"]

BASELINE_OFFSETS: tuple[int, ...] = tuple(range(-3, 3))  # Clark et al.'s range(-3, 3)
# The relations of the syntax table: ``all`` (roots counted as misses, as Clark et al.), ``all_nonroot`` (every
# word but the root) and UD's relations, in `RELATIONS` order.
SCORED: tuple[str, ...] = ("all", "all_nonroot", *RELATIONS[1:])
# Each direction's rows over the dependents whose gold pair the attending word can see (`visible_heads`).
VISIBLE: dict[str, str] = {direction: f"{direction}_visible" for direction in DIRECTIONS}
SCORED_DIRECTIONS: tuple[str, ...] = (*DIRECTIONS, *VISIBLE.values())
# The last axis of `dependency_accuracy` and `offset_baseline` for a causal model: every relation in one direction,
# then the other, then the same over the visible dependents (appended, so the plain columns keep their places).
COLUMNS: tuple[tuple[str, str], ...] = tuple((relation, direction) for direction in SCORED_DIRECTIONS
                                             for relation in SCORED)
# ... and for a bidirectional one, whose visible rows would be its plain rows again: the plain directions alone,
# the first columns of `COLUMNS`
PLAIN_COLUMNS: tuple[tuple[str, str], ...] = COLUMNS[: len(DIRECTIONS) * len(SCORED)]


def scored_directions(causal: bool) -> tuple[str, ...]:
    """The directions a model's syntax table scores: the plain ones, and for a `causal` model the visible ones too.

    >>> scored_directions(False)
    ('dependent_to_head', 'head_to_dependent')
    """
    return SCORED_DIRECTIONS if causal else DIRECTIONS


def columns(causal: bool) -> tuple[tuple[str, str], ...]:
    """The (relation, direction) columns of a model's syntax scores, in order: `COLUMNS` for a `causal` model,
    `PLAIN_COLUMNS` for a bidirectional one (every head visible: its visible rows would equal its plain ones).

    >>> len(columns(True)) == 2 * len(columns(False)), columns(False)[-1]
    (True, ('xcomp', 'head_to_dependent'))
    """
    return COLUMNS if causal else PLAIN_COLUMNS


# --- word attention and accuracy ---------------------------------------------------------------------------


def word_attention(pattern: torch.Tensor, token_word: torch.Tensor, n_words: int, query_start: int = 0) -> torch.Tensor:
    """(batch, head, word, word) attention from word i to word j: the mean over i's tokens of the sum over j's.

    Tokens of no word (special tokens, padding) are dropped as queries and as keys, without renormalising.
    `pattern` may hold only the rows of queries ``query_start ..`` (a block of chunked attention): the result
    is then those rows' share, and the shares of consecutive blocks add up to the whole. Summed in float32 (or
    the pattern's own precision where it is finer), whatever the pattern's dtype.

    >>> pattern = torch.tensor([[[[1.0, 0, 0, 0],   # BOS
    ...                           [0.5, 0.5, 0, 0],  # "cat": word 0
    ...                           [0.1, 0.6, 0.3, 0],  # "sle": word 1 ...
    ...                           [0.1, 0.2, 0.3, 0.4]]]])  # "pt": ... of two tokens
    >>> word_attention(pattern, torch.tensor([[-1, 0, 1, 1]]), 2)  # word 1 to word 0: (0.6 + 0.2) / 2
    tensor([[[[0.5000, 0.0000],
              [0.4000, 0.5000]]]])
    >>> blocks = word_attention(pattern[:, :, :3], torch.tensor([[-1, 0, 1, 1]]), 2) + \\
    ...     word_attention(pattern[:, :, 3:], torch.tensor([[-1, 0, 1, 1]]), 2, query_start=3)
    >>> torch.equal(blocks, word_attention(pattern, torch.tensor([[-1, 0, 1, 1]]), 2))
    True
    """
    rows, first = word_rows(pattern, token_word, n_words, query_start)
    words = rows.new_zeros((*rows.shape[:2], n_words, n_words))
    words[:, :, first: first + rows.shape[2]] = rows  # a new tensor of ours: the block's words, in place
    return words


def word_rows(pattern: torch.Tensor, token_word: torch.Tensor, n_words: int,
              query_start: int = 0) -> tuple[torch.Tensor, int]:
    """`word_attention`'s rows of the words whose tokens this block of query rows holds: (batch, head, rows,
    word) and the first row's word. Chunked attention adds each block's rows into one (word, word) sum, so a
    block costs its own rows, not the whole square.

    Both sums run over the tokens of each word as scatter-adds into one spare bucket for tokens of no word,
    dropped at the end: a cost linear in the pattern's size (a one-hot product costs a factor of the number
    of words more, which at 2,048 tokens is most of a long-context sweep), and padding that holds NaN or inf
    lands in the spare bucket, never in a word's sum.

    >>> pattern = torch.tensor([[[[0.1, 0.6, 0.3, 0], [0.1, 0.2, 0.3, 0.4]]]])  # the queries of word 1's tokens
    >>> rows, first = word_rows(pattern, torch.tensor([[-1, 0, 1, 1]]), 2, query_start=2)
    >>> first, rows  # word 1 only: to word 0 (0.6 + 0.2) / 2, to itself (0.3 + 0.7) / 2
    (1, tensor([[[[0.4000, 0.5000]]]]))
    """
    b, h, n_q, n_k = pattern.shape
    dtype = torch.promote_types(pattern.dtype, torch.float32)
    query_word = token_word[:, query_start: query_start + n_q]  # (batch, block)
    present = query_word[query_word >= 0]
    if present.numel() == 0:  # a block of special tokens and padding: no word's row
        return torch.zeros((b, h, 0, n_words), dtype=dtype, device=pattern.device), 0
    first = int(present.min())
    n_rows = int(present.max()) - first + 1
    bucket = torch.where(token_word >= 0, token_word, n_words)  # (batch, seq): tokens of no word in bucket n_words
    ones = torch.ones(bucket.shape, dtype=dtype, device=pattern.device)
    n_tokens = torch.zeros((b, n_words + 1), dtype=dtype, device=pattern.device).scatter_add_(1, bucket, ones)
    per_token = (1 / n_tokens.clamp_min(1)).gather(1, bucket[:, query_start: query_start + n_q])  # (batch, block)
    key_index = bucket[:, None, None, :n_k].expand(b, h, n_q, n_k)
    to_word = torch.zeros((b, h, n_q, n_words + 1), dtype=dtype, device=pattern.device)
    to_word.scatter_add_(-1, key_index, pattern.to(dtype))  # (batch, head, block, word + spare): summed over keys
    row = torch.where(query_word >= 0, query_word - first, n_rows)  # (batch, block); no word: the spare row
    row_index = row[:, None, :, None].expand(b, h, n_q, n_words + 1)
    rows = torch.zeros((b, h, n_rows + 1, n_words + 1), dtype=dtype, device=pattern.device)
    rows.scatter_add_(2, row_index, to_word * per_token[:, None, :, None])  # the mean over each word's tokens
    return rows[:, :, :n_rows, :n_words], first


def add_word_rows(total: torch.Tensor | None, pattern: torch.Tensor, token_word: torch.Tensor, n_words: int,
                  query_start: int = 0) -> torch.Tensor:
    """A running (batch, head, word, word) `word_attention` over blocks of query rows: `total` (None at the first
    block; a sum the caller owns) with this block's `word_rows` added into their rows only.

    >>> pattern = torch.tensor([[[[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0.1, 0.6, 0.3, 0], [0.1, 0.2, 0.3, 0.4]]]])
    >>> words = torch.tensor([[-1, 0, 1, 1]])
    >>> total = add_word_rows(None, pattern[:, :, :3], words, 2)
    >>> torch.equal(add_word_rows(total, pattern[:, :, 3:], words, 2, 3), word_attention(pattern, words, 2))
    True
    """
    rows, first = word_rows(pattern, token_word, n_words, query_start)  # (batch, head, rows, word)
    if total is None:
        total = rows.new_zeros((*rows.shape[:2], n_words, n_words))
    total[:, :, first: first + rows.shape[2]] += rows
    return total


def most_attended(attention: torch.Tensor) -> torch.Tensor:
    """(batch, head, word) the other word with the largest weight in each row of `attention` (batch, head, word,
    word); -1 where the row has no weight on any other word. Ties go to the earlier word.

    >>> most_attended(torch.tensor([[[[0.9, 0.1, 0.0], [0.0, 1.0, 0.0], [0.3, 0.3, 0.4]]]]))
    tensor([[[ 1, -1,  0]]])
    """
    # A new tensor with contiguous rows (the head -> dependent direction comes in as a transposed view), its
    # diagonal zeroed in place: weights are >= 0, so 0 removes the word. A broadcast eye mask costs several copies.
    others = attention.clone(memory_format=torch.contiguous_format)
    others.diagonal(dim1=-2, dim2=-1).fill_(0.0)
    largest, top = others.max(-1)  # the first maximal value, as numpy's argmax (a NaN row: its NaN, so -1 below)
    return torch.where(largest > 0, top, -1)


def _relation_members(words: WordAlignment, dtype: torch.dtype) -> torch.Tensor:
    """(batch, word, relation of `SCORED`) 1 where the word counts for the relation: "all", every scored word and
    every root word; "all_nonroot", every scored word; a UD relation, the scored words that have it."""
    scored = words.head >= 0  # (batch, word)
    ids = torch.arange(1, len(RELATIONS), device=words.head.device)  # RELATIONS[0] is "all", never a word's own
    own = (words.relation[..., None] == ids) & scored[..., None]  # (batch, word, UD relation)
    every = (scored | (words.head == ROOT))[..., None]
    return torch.cat([every, scored[..., None], own], -1).to(dtype)


def visible_heads(words: WordAlignment, causal: bool) -> torch.Tensor:
    """(batch, word, direction of `DIRECTIONS`) bool: the attending word can see the other word of the gold pair.

    ``dependent_to_head``: the gold head's first token is at or before the dependent's last; ``head_to_dependent``:
    the dependent's first token is at or before the head's last. Every scored dependent in a bidirectional model;
    never a root (no head word) or an unscored word. The causal mask alone decides (no sliding window).

    >>> words = WordAlignment(torch.tensor([[-1, 0, 1, 2]]), torch.tensor([[1, -2, 1]]), torch.tensor([[0, 0, 0]]))
    >>> visible_heads(words, causal=True)[0].int().tolist()  # word 0's head is to its right; word 2's to its left
    [[0, 1], [0, 0], [1, 0]]
    """
    scored = words.head >= 0  # (batch, word)
    if not causal:
        return scored[..., None].expand(*scored.shape, len(DIRECTIONS))
    positions = torch.arange(words.token_word.shape[-1], device=words.token_word.device)  # (seq,)
    members = words.token_word[..., None] == torch.arange(words.n_words, device=positions.device)  # (batch, seq, word)
    first = torch.where(members, positions[:, None], positions.shape[0]).amin(1)  # (batch, word); no token: seq
    last = torch.where(members, positions[:, None], -1).amax(1)  # no token: -1, so it sees and is seen by nothing
    gold = words.head.clamp_min(0)  # (batch, word); roots and unscored words are masked by `scored`
    head_first, head_last = first.gather(1, gold), last.gather(1, gold)
    return torch.stack([(head_first <= last) & (last >= 0), (first <= head_last) & (head_last >= 0)], -1) & \
        scored[..., None]


def _scored_members(words: WordAlignment, dtype: torch.dtype, causal: bool) -> torch.Tensor:
    """(batch, word, direction of `scored_directions`, relation of `SCORED`): `_relation_members` for the plain
    directions, then, for a `causal` model, the same restricted to the dependents of `visible_heads`."""
    members = _relation_members(words, dtype)  # (batch, word, relation)
    plain = members[:, :, None, :].expand(-1, -1, len(DIRECTIONS), -1)
    if not causal:  # every head visible: no visible directions (`columns`)
        return plain
    seen = visible_heads(words, causal).to(dtype)  # (batch, word, direction)
    return torch.cat([plain, members[:, :, None, :] * seen[..., None]], 2)


def dependency_accuracy(pattern: torch.Tensor, words: WordAlignment, *,
                        causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-segment sums and counts of correct predictions, (batch, head, len(columns(causal))) each.

    `pattern` (batch, head, q, k) is one layer's attention as the model computed it (not renormalised).
    Column ``(relation, direction)`` of `columns` (`causal`: the model's queries see no later key): sums count the
    dependents of that relation whose gold head the head predicts (see the module docstring for both directions),
    counts the dependents; a causal model's ``_visible`` directions count only the dependents of `visible_heads`.
    """
    return accuracy_of(word_attention(pattern, words.token_word, words.n_words), words, causal=causal)


def accuracy_of(attention: torch.Tensor, words: WordAlignment, *,
                causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """`dependency_accuracy` from the word attention (batch, head, word, word), summed over blocks if chunked."""
    members = _scored_members(words, attention.dtype, causal)  # (batch, word, direction, relation)
    gold = words.head[:, None, :]  # (batch, 1, word)
    sums = []
    for predicted in (most_attended(attention), most_attended(attention.transpose(-1, -2))):  # the two directions
        sums.append(((predicted == gold) & (gold >= 0)).to(attention.dtype))  # (batch, head, word) correct
    # (batch, head, direction, word): a causal model's visible directions read the same hits as its plain ones
    correct = torch.stack(sums * (len(scored_directions(causal)) // len(DIRECTIONS)), 2)
    # (batch, direction, head, word) @ (batch, direction, word, relation), one batched product for every direction
    sums = (correct.transpose(1, 2) @ members.permute(0, 2, 1, 3)).transpose(1, 2).flatten(2)  # (batch, head, column)
    counts = members.sum(1).flatten(1)[:, None, :].expand_as(sums)  # (batch, head, column)
    return sums, counts


def offset_baseline(words: WordAlignment, dtype: torch.dtype = torch.float64, *,
                    causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-segment sums and counts of the fixed-offset baseline, (batch, len(BASELINE_OFFSETS),
    len(columns(causal))).

    Offset d predicts, for ``dependent_to_head``, head = dependent + d, and for ``head_to_dependent``,
    dependent = head + d (the attending word looks d words away). Counts equal `dependency_accuracy`'s with the
    same `causal`.
    """
    members = _scored_members(words, dtype, causal)  # (batch, word, direction, relation)
    position = torch.arange(words.n_words, device=words.head.device)  # (word,)
    offsets = torch.tensor(BASELINE_OFFSETS, device=words.head.device)[:, None]  # (offset, 1)
    gold = words.head[:, None, :]  # (batch, 1, word)
    real = gold >= 0  # a root (ROOT) or an unscored word (-1) is never a hit, whatever the offset
    hits = [((gold == position + offsets) & real).to(dtype),  # (batch, offset, word): head = dependent + d
            ((gold == position - offsets) & real).to(dtype)]  # dependent = head + d
    repeats = len(scored_directions(causal)) // len(DIRECTIONS)  # a causal model's visible directions: the same hits
    sums = torch.cat([hit @ members[:, :, k] for k, hit in enumerate(hits * repeats)], -1)  # (batch, offset, column)
    counts = members.sum(1).flatten(1)[:, None, :].expand_as(sums)
    return sums, counts


def visible_offsets(causal: bool) -> tuple[int, ...]:
    """The baseline offsets a query of the model can see: d <= 0 for a causal model (in both directions the
    attending word looks d words away), all of `BASELINE_OFFSETS` for a bidirectional one.

    >>> visible_offsets(True), visible_offsets(False)
    ((-3, -2, -1, 0), (-3, -2, -1, 0, 1, 2))
    """
    return tuple(d for d in BASELINE_OFFSETS if d <= 0 or not causal)


def best_baseline(sums: torch.Tensor | np.ndarray, counts: torch.Tensor | np.ndarray, *,
                  causal: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The best offset's accuracy and the offset, per column, from corpus totals (offset, column), among the
    offsets a query of the model can see (`visible_offsets`).

    NaN and offset 0 where a column has no dependent. Ties go to the larger offset (Clark's ``max``).

    >>> sums = np.array([[1.0, 0], [3, 0], [3, 0], [0, 0], [0, 0], [0, 0]])
    >>> best_baseline(sums, np.full((6, 2), 4.0))
    (array([0.75, 0.  ]), array([-1,  2]))
    >>> best_baseline(sums + np.array([[0.0], [0], [0], [0], [4], [0]]), np.full((6, 2), 4.0), causal=True)
    (array([0.75, 0.  ]), array([-1,  0]))
    """
    sums, counts = np.asarray(sums, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    seen = np.isin(np.asarray(BASELINE_OFFSETS), visible_offsets(causal))[:, None]  # (offset, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = np.where((counts > 0) & seen, sums / counts, -np.inf)  # (offset, column)
    last = accuracy.shape[0] - 1 - np.argmax(accuracy[::-1], axis=0)  # the largest offset among the best
    best = np.take_along_axis(accuracy, last[None], 0)[0]
    defined = np.isfinite(best)
    offsets = np.where(defined, np.asarray(BASELINE_OFFSETS)[last], 0)
    return np.where(defined, best, np.nan), offsets


def attach_baseline(frame: pd.DataFrame, sums, counts, *, causal: bool = False) -> pd.DataFrame:
    """`frame` (rows keyed by relation and direction) with ``baseline`` and ``baseline_offset`` columns.

    `sums` and `counts` are `offset_baseline`'s totals over the corpus, (offset, column) in `columns(causal)`
    order; `causal` keeps the offsets a causal model's queries can see (`visible_offsets`).
    """
    value, offset = best_baseline(sums, counts, causal=causal)
    own = columns(causal)
    baseline = pd.DataFrame({"relation": [r for r, _ in own], "direction": [d for _, d in own],
                             "baseline": value, "baseline_offset": offset})
    return frame.drop(columns=["baseline", "baseline_offset"], errors="ignore").merge(
        baseline, on=["relation", "direction"], how="left", validate="many_to_one")


# --- registration ------------------------------------------------------------------------------------------


def syntax_metric(batch: AttentionBatch):
    """Share of dependents whose gold head is the head's most-attended word (Clark et al. 2019), per relation.

    Word attention: to a word, the sum over its tokens; from a word, the mean over its tokens; special tokens
    and the word itself are removed before the argmax, without renormalising. ``dependent_to_head``: the
    dependent's most-attended word is its head; ``head_to_dependent``: the head is the word that attends most
    to the dependent. Relations are UD's, subtypes folded into their base, plus ``all`` (every word, root words
    counted as misses, as Clark et al.) and ``all_nonroot`` (every word but the root). ``dependent_to_head_visible``
    and ``head_to_dependent_visible``, a causal model's only: the same over the dependents whose gold pair the
    attending word can see (the attended word's first token at or before the attending word's last), the accuracy
    to judge a causal model by; a bidirectional model sees every head, so it has no such rows (they would be its
    plain rows again, and ``all``'s its ``all_nonroot``). Swept over CoNLL-U corpora only, with the corpus's own
    words.
    """
    if batch.words is None:
        b, h = batch.pattern.shape[:2]
        zeros = torch.zeros((b, h, len(columns(batch.causal))), dtype=batch.pattern.dtype, device=batch.pattern.device)
        return zeros, zeros
    raw = batch.raw_pattern  # before specials="exclude" renormalised it: Clark removes specials without renormalising
    return dependency_accuracy(batch.pattern if raw is None else raw, batch.words.to(batch.pattern.device),
                               causal=batch.causal)


def candidate_words(words: WordAlignment, causal: bool, window: int | None = None) -> torch.Tensor:
    """(batch, word i, word j) bool: word j is a candidate for word i's most-attended word, i.e. i can attend to j.

    Both have a token and j is not i; in a causal model j's first token is at or before i's last (some token of
    i sees some token of j, so the word attention from i to j can be above 0); under a sliding `window` (the
    largest |q - k| a query sees) some token of i is also within it of some token of j.

    >>> words = WordAlignment(torch.tensor([[-1, 0, 1, 1, 2]]), torch.tensor([[1, -2, 1]]), torch.tensor([[0, 0, 0]]))
    >>> candidate_words(words, causal=True)[0].int().tolist()
    [[0, 0, 0], [1, 0, 0], [1, 1, 0]]
    """
    positions = torch.arange(words.token_word.shape[-1], device=words.token_word.device)  # (seq,)
    members = words.token_word[..., None] == torch.arange(words.n_words, device=positions.device)  # (batch, seq, word)
    present = members.any(1)  # (batch, word)
    first = torch.where(members, positions[:, None], positions.shape[0]).amin(1)  # (batch, word)
    last = torch.where(members, positions[:, None], -1).amax(1)
    other = ~torch.eye(words.n_words, dtype=torch.bool, device=positions.device)
    seen = present[:, :, None] & present[:, None, :] & other  # (batch, i, j)
    if window is not None:  # the gaps between a token of i and one of j run from first_i - last_j to last_i - first_j
        seen = seen & (first[:, :, None] - last[:, None, :] <= window)
        if not causal:
            seen = seen & (last[:, :, None] - first[:, None, :] >= -window)
    return seen & (first[:, None, :] <= last[:, :, None]) if causal else seen


def syntax_chance(batch: AttentionBatch):
    """1/m for a dependent whose gold head is among the m candidate words, 0 otherwise (a root; a head it
    cannot see): dependent to head, the candidates are the other words the dependent can attend to; head to
    dependent, the other words that can attend to the dependent. A uniformly random choice among the
    candidates."""
    if batch.words is None:
        return torch.zeros((batch.pattern.shape[0], 1, len(columns(batch.causal))), dtype=torch.float64,
                           device=batch.pattern.device)
    words = batch.words.to(batch.pattern.device)
    seen = candidate_words(words, batch.causal, batch.window).to(torch.float64)  # (batch, i, j)
    gold = words.head.clamp_min(0)  # (batch, word); roots and unscored words are masked below
    real = (words.head >= 0).to(torch.float64)
    zero = torch.zeros((), dtype=torch.float64)

    def chance(candidates: torch.Tensor) -> torch.Tensor:  # (batch, dependent, word): the dependent's candidates
        hit = candidates.gather(-1, gold[..., None])[..., 0] * real  # the gold head is a candidate
        n = candidates.sum(-1)
        return torch.where(n > 0, hit / n.clamp_min(1), zero)  # (batch, dependent)

    members = _scored_members(words, torch.float64, batch.causal)  # (batch, word, direction, relation)
    repeats = len(scored_directions(batch.causal)) // len(DIRECTIONS)  # plain, then (causal) visible
    by_direction = [chance(seen), chance(seen.transpose(1, 2))] * repeats  # (batch, dependent) each
    return torch.cat([p[:, None, :] @ members[:, :, k] for k, p in enumerate(by_direction)], -1)  # (batch, 1, column)


# Registered on import (`headscan.metrics` imports this module); swept over CoNLL-U corpora only.
register("syntax", unit="share of dependents", table="syntax",
         axis=Axis(("relation", "direction"), lambda config: list(COLUMNS),
                   for_model=lambda config, causal: list(columns(causal))),
         chance=syntax_chance, null="controls",
         null_why="an argmax accuracy: an untrained head's argmax lands where its random preferences put it, so the "
                  "range of random-init controls' heads is the null; a head must also beat the best fixed offset on "
                  "the same words (``vs_baseline``, Clark et al. 2019), tested with it or, without controls, alone",
         shuffled="content")(syntax_metric)
