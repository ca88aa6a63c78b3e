"""Head similarity in the sweep: the attention of a seeded sample of segments, kept until each batch's forward pass
ends, reduced into every pair of heads' summed Jensen-Shannon divergence (`headscan.metrics.similarity`).

With ``similarity_sample=N`` a seeded draw of N segments of the whole corpus (the same draw in every shard, so
shards add up to the unsharded sums) is the sample. While a batch holding sampled segments goes through the
model, each layer hands its pattern over as usual; `SimilarityRun.take` keeps the sampled segments' smoothed
attention on their visible (query, key) entries, (head, entry) per layer, in the pattern's own precision (at
least float32). In chunked mode the blocks of query rows are kept in turn, which gives the same entries in the
same order. When the pass ends, `SimilarityRun.end` stacks the layers, (layer * head, entry), and adds every pair's
divergence over the segment's queries (float64, in blocks of about 6 MiB at the peak, small enough for the cache:
`headscan.metrics.similarity.BLOCK_BYTES`).

Memory: a sampled segment of n tokens holds layers x heads x n(n+1)/2 (causal) or n^2 (encoder) entries of 4
bytes until its batch ends (minilm at 128 tokens: 4.5 MiB; smollm2: 8.5 MiB); `check_memory` refuses, before the
first pass, a sweep whose batch of sampled segments would pass the attention budget.

On a corpus with words (CoNLL-U) and ``long="truncate"`` each sampled segment also keeps every head's word-level
attention with its sink, (layer * head, word, word + 1) in the pattern's precision, at least float32
(`headscan.metrics.similarity.with_sink`), for the similarity of heads across models (`across_sums`): for
smollm2, 270 x 20 x 21 x 4 bytes = 0.4 MiB for a sentence of 20 words, kept in the partial state.

This module does not keep running totals across windows or write tables (see `headscan.scan.reduce` and
`headscan.scan.finish`).
"""

from __future__ import annotations

import numpy as np
import torch

from ..config import SweepConfig
from ..errors import ConfigError
from ..metrics.similarity import (
    SMOOTHING,
    js_cross_sums,
    js_sums,
    smoothed_entries,
    visible_keys,
    with_sink,
    word_entries,
)
from ..metrics.syntax import add_word_rows

__all__ = ["SIMILARITY_SALT", "sample_of", "check_memory", "SimilarityRun", "notes", "across_sums"]

# Mixed into the sample's seed, so that its draw never coincides with the bootstrap weights' or importance's.
SIMILARITY_SALT = 2401


def sample_of(n_segments: int, size: int | None, seed: int) -> list[int]:
    """The corpus indices of the sampled segments: a seeded draw of `size` of `n_segments` (all when `size`
    reaches it), sorted.

    >>> sample_of(5, 10, 0)
    [0, 1, 2, 3, 4]
    >>> sample_of(100, 3, 0) == sample_of(100, 3, 0)
    True
    """
    if size is None or size >= n_segments:
        return list(range(n_segments))
    rng = np.random.default_rng([seed, SIMILARITY_SALT])
    return sorted(rng.choice(n_segments, size=size, replace=False).tolist())


def _entries_per_segment(n: int, causal: bool) -> int:
    return n * (n + 1) // 2 if causal else n * n


def check_memory(name: str, n_layers: int, n_heads: int, causal: bool, config: SweepConfig, budget_mib: int) -> int:
    """The bytes one batch's sampled segments keep at most (every layer's entries, 4 bytes each); refuses, in one
    line, a sweep where that passes `budget_mib`."""
    per_segment = n_layers * n_heads * _entries_per_segment(config.max_len, causal) * 4
    held = per_segment * min(config.batch_size, config.similarity_sample)
    if held > budget_mib * 2**20:
        raise ConfigError(f"{name}: --similarity-sample keeps every layer's attention of the sampled segments of a "
                          f"batch until its pass ends, {held / 2**20:,.0f} MiB at --max-len {config.max_len} and "
                          f"--batch-size {config.batch_size}, past the attention budget of {budget_mib:,} MiB; "
                          f"lower --max-len or --batch-size, or raise --attention-budget", setting="similarity_sample")
    return held


class SimilarityRun:
    """One model's similarity sums over the sample: `begin` a batch, `take` each layer (or block), `end` it."""

    def __init__(self, n_segments: int, config: SweepConfig, n_layers: int, n_heads: int, causal: bool):
        self.config, self.n_layers, self.n_heads, self.causal = config, n_layers, n_heads, causal
        self.sample = sample_of(n_segments, config.similarity_sample, config.seed)
        self.sampled = set(self.sample)
        self.rows: list[int] = []  # rows of the batch in progress that belong to sampled segments
        self.kept: dict = {}  # (row, layer) -> [(head, entry) blocks]
        self.queries: dict = {}  # row -> its queries that count (and see a key)

    def begin(self, rows: list[int], segments: list[int] | None = None, words=None) -> None:
        """A batch starts; `rows` are its sequences from sampled segments, `segments` their corpus indices, `words`
        the batch's `headscan.corpus.words.WordAlignment` (None: no word-level attention kept)."""
        self.rows, self.kept, self.queries = list(rows), {}, {}
        self.segments = list(segments) if segments is not None else None
        keep_words = words is not None and segments is not None and self.config.long == "truncate"
        self.words = words if keep_words and self.rows else None
        self.word_parts: dict = {}  # layer -> (sampled, head, word, word), added up over blocks

    def take(self, layer: int, pattern: torch.Tensor, query_mask: torch.Tensor, key_mask: torch.Tensor,
             query_start: int = 0) -> None:
        """Keep the sampled rows' smoothed entries of one layer's `pattern` (batch, head, q, k) as handed over (or
        of one block of its query rows); `query_mask` (batch, q) and `key_mask` (batch, k) are the queries and
        keys that count. With ``specials="exclude"`` each row is renormalised over the keys that count."""
        if not self.rows:
            return
        rows = torch.tensor(self.rows, device=pattern.device)
        dtype = torch.promote_types(pattern.dtype, torch.float32)
        chosen = pattern.index_select(0, rows).to(dtype)  # (sampled, head, q, k), new
        keys = key_mask.index_select(0, rows.to(key_mask.device)).to(pattern.device)
        if self.config.specials == "exclude":
            chosen = chosen * keys[:, None, None, :].to(dtype)
            chosen = chosen / chosen.sum(-1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
        seen = visible_keys(query_mask.index_select(0, rows.to(query_mask.device)).to(pattern.device), keys,
                            self.causal, query_start)  # (sampled, q, k)
        if self.words is not None:  # the sampled rows' word-level attention (blocks add up)
            token_word = self.words.token_word.index_select(0, rows.to(self.words.token_word.device)).to(pattern.device)
            self.word_parts[layer] = add_word_rows(self.word_parts.get(layer), pattern.index_select(0, rows).to(dtype),
                                                   token_word, self.words.n_words, query_start)
        for n, row in enumerate(self.rows):  # a loop over sampled segments (each has its own entries), not heads
            self.kept.setdefault((row, layer), []).append(smoothed_entries(chosen[n], seen[n]))
            if layer == 0:  # every layer has the same queries
                self.queries[row] = self.queries.get(row, 0) + int(seen[n].any(-1).sum())

    def end(self, device) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The batch's sums, (layer * head, layer * head) float64 each on `device`: the summed divergence of
        every pair of heads and the number of queries it is summed over; None without sampled rows. The word-level
        attention of the sampled segments is then in `words_kept`."""
        self.words_kept = {}
        if not self.rows:
            return None
        if self.words is not None:
            stacked = torch.stack([self.word_parts.pop(layer) for layer in range(self.n_layers)], 1)  # (s, l, h, w, w)
            token_word = self.words.token_word.cpu()
            for n, (row, segment) in enumerate(zip(self.rows, self.segments)):
                n_words = int(token_word[row].max()) + 1
                has_token = torch.isin(torch.arange(n_words), token_word[row])
                words = stacked[n].flatten(0, 1)[:, :n_words, :n_words].cpu()  # (layer * head, word, word)
                self.words_kept[segment] = with_sink(words, has_token).numpy()  # the pattern's precision, >= float32
        size = self.n_layers * self.n_heads
        sums = torch.zeros((size, size), dtype=torch.float64, device=device)
        queries = 0
        for row in self.rows:
            entries = torch.cat([torch.cat(self.kept.pop((row, layer)), dim=-1)
                                 for layer in range(self.n_layers)])  # (layer * head, entry)
            sums += js_sums(entries).to(device)
            queries += self.queries.pop(row)
        self.rows = []
        return sums, torch.full_like(sums, float(queries))


def notes(config: SweepConfig, sample: list[int]) -> dict:
    """What the model's provenance records about the similarity table: the rule and the sample."""
    return {"sample_n": len(sample), "sample_seed": config.seed, "sample_salt": SIMILARITY_SALT,
            "segments": sample, "smoothing": f"p' = {1 - SMOOTHING:g} p + {SMOOTHING:g} / n_visible_keys(q)",
            "log_base": "e", "specials": config.specials,
            "divergence": "Jensen-Shannon, summed over the sample's queries that count; js_mean = sum / queries"}


def across_sums(first: dict, second: dict, causal: bool) -> tuple[np.ndarray, int, int]:
    """The summed divergence between every head of one model and every head of another over the word queries of
    the sampled segments both kept (`first` and `second`: segment -> (head, word, word + 1) word-level attention
    with its sink), (head of first, head of second) float64, the number of word queries and of segments.
    Words beyond the shorter of the two (a truncated segment) and words without a token in either are no query;
    with `causal` (either model causal) a query word sees the sink and the words up to itself."""
    shared = sorted(set(first) & set(second))
    sums, queries = None, 0
    for segment in shared:
        a, b = torch.from_numpy(first[segment]), torch.from_numpy(second[segment])
        n = min(a.shape[1], b.shape[1])
        a = torch.cat([a[:, :n, :n], a[:, :n, -1:]], -1)  # (head, word, word + 1): the common words, then the sink
        b = torch.cat([b[:, :n, :n], b[:, :n, -1:]], -1)
        asked = (a[0].sum(-1) > 0) & (b[0].sum(-1) > 0)  # (word,): a token in both (0 rows: none)
        part = js_cross_sums(word_entries(a, asked, causal), word_entries(b, asked, causal))
        sums = part if sums is None else sums + part
        queries += int(asked.sum())
    if sums is None:
        sums = torch.zeros((next(iter(first.values())).shape[0], next(iter(second.values())).shape[0]),
                           dtype=torch.float64)
    return sums.numpy(), queries, len(shared)
