"""The null head: what a head that spreads its attention evenly over what it can see would score.

Every row of every table carries ``chance``: its metric's value under the row's *null head*, over the same
queries (so with the same counts). The null head of a query attends uniformly over the keys that query can
see: the keys that count (real; not special under ``specials="exclude"``), at or before it in a causal model,
all of them in a bidirectional one. For value-weighted attention (value.parquet) its uniform attention is
value-weighted like the row's: ``A'[q, k]`` proportional to ``||f(x_k)||`` over those keys. For an argmax
metric (``positional_prev``, syntax accuracy) chance is the probability that a key drawn from the null head's
attention is the target: ``1/n`` for n visible keys, a uniformly random choice among the candidates.

`NullHead` computes the null head's per-query quantities in closed form, from sums and cumulative sums over
the keys, and never builds a (batch, head, q, k) pattern (`NullHead.pattern` builds one for a metric that
registers no chance of its own). With uniform weights it works on a (batch, 1, q) grid, the same for every
head and layer; with value norms, on (batch, head, q). All of it in float64 (float32 on Apple's MPS, which
has no float64): cumulative sums of positions over 32k-token contexts would lose digits in float32.

A sliding-window layer (Mistral's, Phi-3's, the local layers of Gemma 2 and 3, GPT-Neo and ModernBERT) shows
its queries only the keys within its window (`AttentionBatch.window`, read by `headscan.models.windows`); its
null head attends uniformly over those, from differences of the same cumulative sums.

This module registers no metric and reads no model; metrics call it through `AttentionBatch.null`.
"""

from __future__ import annotations

from functools import cached_property

import torch

__all__ = ["NullHead", "span_sums"]

_F64 = torch.float64  # the null head's dtype (`NullHead.dtype` falls back to float32 where a device lacks it)


def span_sums(cumulative: torch.Tensor, first: torch.Tensor, last: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sums over the positions ``first[i] .. last[i]`` along `dim`, from `cumulative`, a cumulative sum along it:
    each query's window of keys; `first` and `last` (q,) within the axis, `last` >= `first` - 1.

    >>> span_sums(torch.tensor([1.0, 3.0, 6.0, 10.0]), torch.tensor([0, 1, 2]), torch.tensor([0, 2, 3]))
    tensor([1., 5., 7.])
    """
    cumulative = cumulative.movedim(dim, -1)
    zero = torch.zeros((), dtype=cumulative.dtype, device=cumulative.device)
    before = torch.where(first > 0, cumulative[..., (first - 1).clamp_min(0)], zero)
    return (cumulative[..., last] - before).movedim(-1, dim)


class NullHead:
    """The null head of one layer's batch of queries (an `headscan.metrics.batch.AttentionBatch`): its weight on
    each key, its total over the keys each query sees, and what every metric needs of it, per query.

    The batch's `key_weights` (batch, head, k) weight the keys (value norms, for value-weighted attention);
    None is uniform. Nothing given is written to.
    """

    def __init__(self, batch):
        self.batch = batch
        self.dtype = torch.float32 if batch.key_mask.device.type == "mps" else _F64

    @cached_property
    def weights(self) -> torch.Tensor:
        """(batch, H, k) float64: the null head's unnormalised weight on each key, 0 on keys that do not count;
        H is 1 for uniform weights, the number of heads for value norms."""
        mask = self.batch.key_mask.to(self.dtype)[:, None, :]  # (batch, 1, k)
        given = self.batch.key_weights
        return mask if given is None else given.to(self.dtype) * mask

    @cached_property
    def _positions(self) -> torch.Tensor:
        return self.batch.query_positions  # (q,) absolute

    @cached_property
    def _reach(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q,) each query's first and last key under a sliding window, within the keys there are."""
        window, q = self.batch.window, self._positions
        first = (q - window).clamp_min(0)
        last = q if self.batch.causal else (q + window).clamp_max(self.weights.shape[-1] - 1)
        return first, last

    def _within(self, cumulative: torch.Tensor, *, behind: bool = False) -> torch.Tensor:
        """(batch, H', k) a cumulative sum over the keys -> (batch, H', q) its sum over each query's window (with
        `behind`, over the window's keys up to the query's own)."""
        first, last = self._reach
        return span_sums(cumulative, first, self._positions if behind else last)

    def seen(self, per_key: torch.Tensor) -> torch.Tensor:
        """(batch, H, k) -> (batch, H, q): the sum over the keys each query sees (at or before it when causal,
        within the layer's sliding window where it has one)."""
        if self.batch.window is not None:
            return self._within(per_key.cumsum(-1))
        if self.batch.causal:
            return per_key.cumsum(-1)[..., self._positions]
        return per_key.sum(-1, keepdim=True).expand(*per_key.shape[:-1], self._positions.shape[0])

    @cached_property
    def total(self) -> torch.Tensor:
        """(batch, H, q) the null head's total weight over the keys each query sees (n for uniform weights)."""
        return self.seen(self.weights)

    def _over(self, amount: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        """amount / total, 0 where total is 0 (a query that sees no weight: a head that moves nothing)."""
        zero = torch.zeros((), dtype=self.dtype)
        return torch.where(total > 0, amount / total.clamp_min(torch.finfo(self.dtype).tiny), zero)

    def share(self, amount: torch.Tensor) -> torch.Tensor:
        """`amount` (batch, H, q) over `total`."""
        return self._over(amount, self.total)

    def expect(self, per_key: torch.Tensor) -> torch.Tensor:
        """(batch, H', k) a quantity per key -> (batch, H'', q) its expectation under the null head's attention."""
        return self.share(self.seen(self.weights * per_key.to(self.dtype)))

    def at(self, keys: torch.Tensor, in_range: torch.Tensor) -> torch.Tensor:
        """(batch, H, q, n) the null head's weight on the keys `keys` (q, n) (absolute positions, valid where
        `in_range`): 0 on keys the query cannot see."""
        b, h, n_k = self.weights.shape
        n_q, n = keys.shape
        flat = keys.clamp(0, n_k - 1).reshape(1, 1, -1).expand(b, h, -1)
        weights = self.weights.gather(-1, flat).view(b, h, n_q, n)  # (batch, H, q, n)
        visible = in_range & self.batch.sees(self._positions[:, None] - keys)  # (q, n)
        weights = torch.where(visible, weights, torch.zeros((), dtype=self.dtype))
        return self._over(weights, self.total[..., None])

    @cached_property
    def at_offsets(self) -> torch.Tensor:
        """(batch, H, q, offset) the null head's weight on q + d for every offset d of the profile."""
        keys = self._positions[:, None] + self.batch.offsets[None, :]  # (q, offset)
        return self.at(keys, (keys >= 0) & (keys < self.weights.shape[-1]))

    @cached_property
    def first(self) -> torch.Tensor:
        """(batch, H, q) the null head's weight on the first token."""
        keys = torch.zeros((self._positions.shape[0], 1), dtype=torch.long, device=self._positions.device)
        return self.at(keys, torch.ones_like(keys, dtype=torch.bool))[..., 0]

    @cached_property
    def entropy(self) -> torch.Tensor:
        """(batch, H, q) the null head's entropy, log S - sum_k w_k log w_k / S (log n for uniform weights)."""
        w = self.weights
        plogp = self.seen(torch.special.xlogy(w, w))  # (batch, H, q): sum over seen keys of w log w
        total = self.total
        safe = total.clamp_min(torch.finfo(self.dtype).tiny)
        return torch.where(total > 0, torch.log(safe) - plogp / safe, torch.zeros((), dtype=self.dtype))

    def distance(self, *, skip_first: bool = False) -> torch.Tensor:
        """(batch, H, q) sum_k A'[q, k] |q - k| under the null head; `skip_first` leaves the first token out of
        the sum (not of the normalisation), as `distance_by_position` does."""
        w = self.weights
        if skip_first:
            w = torch.cat([torch.zeros_like(w[..., :1]), w[..., 1:]], -1)  # a new tensor
        k = torch.arange(w.shape[-1], dtype=self.dtype, device=w.device)
        q = self._positions.to(self.dtype)
        if self.batch.window is not None:  # the same sums over each query's window, split at q
            masses, moments = w.cumsum(-1), (w * k).cumsum(-1)  # (batch, H, k)
            behind, behind_moment = self._within(masses, behind=True), self._within(moments, behind=True)
            total = q * behind - behind_moment  # sum over seen k <= q of w_k (q - k)
            if not self.batch.causal:  # plus the sum over seen k > q of w_k (k - q)
                total = total + (self._within(moments) - behind_moment) - q * (self._within(masses) - behind)
            return self.share(total)
        mass, moment = w.cumsum(-1)[..., self._positions], (w * k).cumsum(-1)[..., self._positions]  # (batch, H, q)
        before = q * mass - moment  # sum over k <= q of w_k (q - k)
        if not self.batch.causal:  # plus the sum over k > q of w_k (k - q)
            before = before + (w * k).sum(-1, keepdim=True) - moment - q * (w.sum(-1, keepdim=True) - mass)
        return self.share(before)

    def on(self, targets: torch.Tensor) -> torch.Tensor:
        """(batch, H, q) the null head's share on the keys where `targets` (batch, q, k) is True, or weighted by
        it (targets are keys the query sees: other occurrences, induction targets, a pattern's)."""
        weights = self.weights.to(torch.float32)  # the (batch, q, k) contraction in float32, like the metric's
        targets = targets.to(torch.float32)  # bool targets, or a pattern's weights in [0, 1]
        if self.batch.window is not None:  # only what the window shows
            keys = torch.arange(targets.shape[-1], device=targets.device)
            targets = targets * self.batch.sees(self._positions[:, None] - keys[None, :])
        amount = torch.einsum("bqk,bhk->bhq", targets, weights)
        return self.share(amount.to(self.dtype))

    def pattern(self) -> torch.Tensor:
        """(batch, H, q, k) the null head's attention itself, rows summing to 1 (0 where a query sees nothing),
        for metrics that register no chance of their own."""
        keys = torch.arange(self.weights.shape[-1], device=self.weights.device)
        visible = self.batch.sees(self._positions[:, None] - keys[None, :])  # (q, k)
        w = torch.where(visible, self.weights[:, :, None, :], torch.zeros((), dtype=self.dtype))  # (batch, H, q, k)
        return self._over(w, self.total[..., None])
