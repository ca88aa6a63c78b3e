"""How alike two heads attend: the Jensen-Shannon divergence between their attention, query by query (Clark et al.
2019, section 6, as their code computes it).

For one query ``q`` and two heads ``i``, ``j`` with attention rows ``P = A_i[q, .]`` and ``Q = A_j[q, .]`` over
the keys ``q`` sees:

    JS(P, Q) = 1/2 KL(P || M) + 1/2 KL(Q || M),   M = (P + Q) / 2,   natural log (nats; at most ln 2)

after Clark's smoothing of each row, ``p' = 0.999 p + 0.001 / n`` with ``n`` the number of keys the query sees
(``head_distances.py``; it removes log 0). Clark's maps are square and bidirectional, so his ``n`` is the
sequence length; here it is the keys *visible* to the query: for a causal model the keys up to and including
it, for an encoder every key; padding never, and with ``specials="exclude"`` no special token (the row is then
renormalised over the keys left, as every metric reads it). A sliding window's dropped keys count as seen, with
attention 0. Clark sums over every query and document; headscan keeps the sum *and* the number of queries, so
a table can hold the mean (`headscan.scan.similarity`).

The sum over a segment's queries needs no per-query loop: with ``S_i = sum p' log p'`` over every (query,
visible key) entry of head ``i`` and ``C_ij = sum m log m`` over the same entries (``m = (p'_i + p'_j) / 2``),

    sum_q JS_q(i, j) = (S_i + S_j) / 2 - C_ij.

**Across models** whose tokenizers cut the text differently, queries and keys are *words* (CoNLL-U corpora): each
head's word-level attention as Clark et al.'s ``make_attn_word_level`` makes it (`headscan.metrics.syntax.
word_attention`: attention *to* a word summed over its tokens, *from* a word averaged over them), plus one key
that no tokenizer lacks, the *sink*: the attention a word's tokens give to tokens of no word (``[CLS]``,
``[SEP]``, BOS), so every row still sums to 1 (`with_sink`). A word query sees the sink and the words the
query word's model may see; where either model is causal, only the words up to the query word, each row
renormalised over them (`word_entries`). Words without a token in either model are no query.

This module does not run models, choose segments or keep running totals (see `headscan.scan.similarity`).
"""

from __future__ import annotations

import torch

__all__ = ["SMOOTHING", "BLOCK_BYTES", "visible_keys", "smoothed_entries", "js_sums", "with_sink", "word_entries",
           "js_cross_sums"]

SMOOTHING = 0.001  # Clark et al.'s: p' = (1 - SMOOTHING) p + SMOOTHING / n
BLOCK_BYTES = 2 * 2**20  # js_sums' float64 block of mean rows M; its peak working memory is about three times this


def visible_keys(query_mask: torch.Tensor, key_mask: torch.Tensor, causal: bool, query_start: int = 0) -> torch.Tensor:
    """(batch, q, k) bool: the keys each query that counts may see (none for a query that does not count).

    >>> visible_keys(torch.tensor([[True, True, False]]), torch.tensor([[True, True, False]]), causal=True)[0].int()
    tensor([[1, 0, 0],
            [1, 1, 0],
            [0, 0, 0]], dtype=torch.int32)
    """
    seen = query_mask[:, :, None] & key_mask[:, None, :]  # (batch, q, k)
    if causal:
        q = torch.arange(query_start, query_start + query_mask.shape[1], device=query_mask.device)
        k = torch.arange(key_mask.shape[1], device=key_mask.device)
        seen = seen & (k[None, :] <= q[:, None])[None]
    return seen


def smoothed_entries(pattern: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """One sequence's smoothed attention on its visible (query, key) entries, (head, entry), in row-major order.

    `pattern` (head, q, k) is the sequence's attention, `seen` (q, k) its `visible_keys`. A new tensor.

    >>> smoothed_entries(torch.tensor([[[1.0, 0.0], [0.5, 0.5]]]), torch.tensor([[True, False], [True, True]]))
    tensor([[1.0000, 0.5000, 0.5000]])
    """
    n = seen.sum(-1, keepdim=True).clamp_min(1).to(pattern.dtype)  # (q, 1): keys each query sees
    smoothed = pattern * (1 - SMOOTHING) + SMOOTHING / n  # (head, q, k), new
    return smoothed[:, seen]  # (head, entry)


def _xlogx(x: torch.Tensor) -> torch.Tensor:
    return x * torch.log(x)  # smoothed entries are > 0


def js_sums(entries: torch.Tensor, block_bytes: int = BLOCK_BYTES) -> torch.Tensor:
    """(head, head) float64: for every pair of heads, the sum over the queries of `entries` of their
    Jensen-Shannon divergence, in nats; exactly 0 on the diagonal and symmetric (the pairs i < j are computed
    and mirrored). `entries` (head, entry) are `smoothed_entries`, possibly of several layers stacked.

    Pairs go in blocks of heads and entries whose mean M takes at most `block_bytes` (with log M and M log M, three
    times that at the peak); a sum that rounds below 0
    (two nearly equal heads) is 0, as the divergence cannot be negative.

    >>> p = torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.5, 0.5]], dtype=torch.float64)
    >>> js_sums(p).numpy().round(4)
    array([[0.    , 0.1017, 0.    ],
           [0.1017, 0.    , 0.1017],
           [0.    , 0.1017, 0.    ]])
    """
    x = entries.to(torch.float64)  # (head, entry)
    n_heads, n_entries = x.shape
    own = _xlogx(x).sum(-1)  # (head,): S_i
    out = torch.zeros((n_heads, n_heads), dtype=torch.float64, device=x.device)
    width = max(1, min(n_entries, block_bytes // (8 * n_heads)))  # entries per block: the sums add over entries
    # heads i per block, against every j >= the block's first: at most an eighth of the heads, so that the pairs
    # j < i computed in vain stay a sixteenth of the work
    rows = max(1, min(block_bytes // (8 * n_heads * width), -(-n_heads // 8)))
    for first in range(0, n_entries, width):
        part = x[:, first: first + width]  # (head, entry)
        for start in range(0, n_heads, rows):
            stop = min(n_heads, start + rows)
            m = (part[start:stop, None, :] + part[None, start:, :]) / 2  # (block, head j >= start, entry)
            out[start:stop, start:] -= _xlogx(m).sum(-1)  # C_ij
    out += (own[:, None] + own[None, :]) / 2
    upper = torch.triu(out, diagonal=1).clamp_min(0)
    return upper + upper.T


def with_sink(words: torch.Tensor, has_token: torch.Tensor) -> torch.Tensor:
    """(head, word, word + 1): word-level attention (head, word, word) with a last key, the sink: the rest of each
    query word's attention, on tokens of no word. A word without a token (`has_token` False) keeps a row of 0.

    >>> with_sink(torch.tensor([[[0.5, 0.25], [0.0, 0.0]]]), torch.tensor([True, False]))
    tensor([[[0.5000, 0.2500, 0.2500],
             [0.0000, 0.0000, 0.0000]]])
    """
    rest = has_token.to(words.dtype) - words.sum(-1)  # (head, word)
    return torch.cat([words, rest.clamp_min(0)[..., None]], dim=-1)


def word_entries(attention: torch.Tensor, queries: torch.Tensor, causal: bool) -> torch.Tensor:
    """One segment's smoothed word-level attention on its visible (query word, key) entries, (head, entry).

    `attention` (head, word, word + 1) is `with_sink`'s, `queries` (word,) bool the query words that count. A
    query word sees the sink and every word, or with `causal` the words up to itself; each row is renormalised
    over what it sees, then smoothed as Clark's (`smoothed_entries`).

    >>> a = torch.tensor([[[0.5, 0.25, 0.25], [0.2, 0.6, 0.2]]])
    >>> word_entries(a, torch.tensor([True, True]), causal=True).numpy().round(4)
    array([[0.6665, 0.3335, 0.2001, 0.5997, 0.2001]], dtype=float32)
    """
    n_words = attention.shape[-2]
    seen = queries[:, None].expand(n_words, n_words + 1).clone()  # (word, key): the words, then the sink
    if causal:
        seen[:, :n_words] &= torch.ones(n_words, n_words, dtype=torch.bool, device=attention.device).tril()
    kept = torch.where(seen, attention, torch.zeros((), dtype=attention.dtype, device=attention.device))
    kept = kept / kept.sum(-1, keepdim=True).clamp_min(torch.finfo(kept.dtype).tiny)
    return smoothed_entries(kept, seen)


def js_cross_sums(x: torch.Tensor, y: torch.Tensor, block_bytes: int = BLOCK_BYTES) -> torch.Tensor:
    """(head of x, head of y) float64: `js_sums` between every head of one model, `x` (head, entry), and every head
    of another, `y` (head, entry), over the same entries.

    >>> p = torch.tensor([[0.5, 0.5], [0.9, 0.1]], dtype=torch.float64)
    >>> js_cross_sums(p, p[:1]).numpy().round(4)
    array([[0.    ],
           [0.1017]])
    """
    x, y = x.to(torch.float64), y.to(torch.float64)
    n_entries = x.shape[-1]
    out = ((_xlogx(x).sum(-1)[:, None] + _xlogx(y).sum(-1)[None, :]) / 2)  # (head x, head y)
    width = max(1, min(n_entries, block_bytes // (8 * y.shape[0])))
    rows = max(1, block_bytes // (8 * y.shape[0] * width))
    for first in range(0, n_entries, width):
        for start in range(0, x.shape[0], rows):
            m = (x[start: start + rows, None, first: first + width] + y[None, :, first: first + width]) / 2
            out[start: start + rows] -= _xlogx(m).sum(-1)
    return out.clamp_min(0)
