"""Head importance in the sweep: each window's segments through the whole model, clean and with heads removed,
scored into per-segment sums of the target's change (`headscan.metrics.importance` defines targets and methods).

Importance is measured on the *sample*: every segment, or with ``importance_sample`` a seeded draw of that many
from the whole corpus (the same draw in every shard, so shards merge exactly; the pattern tables still cover
the whole corpus). Before the first window a *mean pass* over the sample keeps each head's mean output over the
positions it replaces (real tokens, each segment's first one left out unless ``ablate_first``), for mean ablation
and AtP; with ``ablate_top`` the same pass also takes one backward pass per
batch and ranks the heads by |AtP| of mean ablation over the sample: the top N are ablated exactly. The means
and the choice are kept in the partial state (saved as soon as the pass ends), so a resumed sweep uses the same
ones; a sweep stopped during the pass does it again.

Then, per batch of each window's segments in the sample: one clean pass (with a backward pass for AtP: the
gradient of the batch's target sum at every head's output, all heads at once), then one pass per exactly
ablated head and kind, each run from the ablated layer on where that was checked exact
(`headscan.models.ablation.Surgery.check`). Resample ablation takes a head's output from the segment's *donor*: a
fixed, seeded derangement of the sample (one cycle through a seeded permutation), whose sequences run one clean
pass per batch; at a position the donor does not reach the head's mean stands in.

This module does not keep running totals or write tables (see `headscan.scan.passes.importance`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..config import SweepConfig
from ..corpus import Corpus, EncodedCorpus, batches, encode
from ..errors import SweepInterrupted
from ..metrics.importance import MASK_SPLIT, mask_tokens, methods, target_sums
from ..models import HookedModel
from ..models.ablation import Surgery, head_cut, target_of
from ..models.atp_star import attribution

if TYPE_CHECKING:
    from .plan import Column

__all__ = ["ImportanceRun", "ImportanceState", "SAMPLE_SALT", "MASK_SALT", "DONOR_SALT", "donors", "replaced"]

# Mixed into the seeds of the mean pass's sample, of the masking and of resample ablation's donors, so their draws
# never coincide with the bootstrap weights' (seeded by [seed, unit]).
SAMPLE_SALT, MASK_SALT, DONOR_SALT = 2101, 2102, 2103


def donors(sample: list[int], seed: int) -> dict[int, int]:
    """Each segment of `sample` and the segment resample ablation takes its heads' outputs from: one cycle
    through a seeded permutation, so no segment is its own donor (none for a sample of one).

    >>> d = donors([3, 5, 8, 9], seed=0)
    >>> sorted(d) == sorted(d.values()) == [3, 5, 8, 9] and all(d[s] != s for s in d)
    True
    """
    if len(sample) < 2:
        return {}
    order = np.random.default_rng([seed, DONOR_SALT]).permutation(np.asarray(sample)).tolist()
    return {segment: order[(i + 1) % len(order)] for i, segment in enumerate(order)}


def replaced(real: torch.Tensor, first: bool) -> torch.Tensor:
    """(batch, seq) the positions an ablation replaces: the real tokens, less each sequence's first (BOS, [CLS];
    sequences are right-padded) unless `first`."""
    if first:
        return real
    kept = real.clone()
    kept[:, 0] = False
    return kept


@dataclass
class ImportanceState:
    """What the importance pass keeps in a partial state (`headscan.scan.passes.importance`)."""

    # each head's mean output over the mean pass's sample, (layer, head, d_head); (0, 0, 0) before that pass
    head_means: np.ndarray
    notes: dict = field(default_factory=dict)  # what the mean pass decided: target, sample, heads ablated exactly
    ablation_passes: str | None = None  # how the ablated passes were run (the model's provenance)


class ImportanceRun:
    """One model's importance columns: the mean pass, and each window's sums (use as a context manager)."""

    def __init__(self, model: HookedModel, corpus: Corpus, config: SweepConfig, columns: list[Column]):
        self.model, self.corpus, self.config = model, corpus, config
        self.cut = head_cut(model)  # refuses an architecture whose output projection is not found
        self.target, self.why = target_of(model)
        self.methods = methods(config)
        # this model's importance columns, among the importance block at the end of `columns`
        block = [key for _, key, table in columns if table == "importance"]
        self.n_columns = len(block)
        self.index = {method: block.index((method, self.target)) for method in self.methods}
        self.atp = self.target != "hidden_change"  # the first-order change of hidden_change is 0
        self.surgery = Surgery(model, self.cut, self.target)
        self.sample = self._sample()  # corpus indices of the segments importance is measured on
        self.sampled = set(self.sample)
        self.means: torch.Tensor | None = None  # (layer, head, d_head)
        self.chosen: list[tuple[int, int]] = []
        self.donor = donors(self.sample, config.seed) if "resample_ablation" in self.methods else {}

    def __enter__(self) -> ImportanceRun:
        self.surgery.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.surgery.__exit__(*exc)

    # --- before the first window ---------------------------------------------------------------------------

    def prepare(self, state: ImportanceState, should_stop: Callable[[], bool], save: Callable[[], None]) -> None:
        """The means and the heads to ablate: read from `state` (the importance pass's), or from a mean pass kept
        in it and saved at once (`save()` saves the sweep's whole state)."""
        with torch.no_grad():
            self.surgery.check()
        if not state.head_means.size:
            ranking = self.config.ablate_top is not None and self.atp
            means, n_tokens, scores, sample = self._mean_pass(ranking, should_stop)
            state.head_means = means
            state.notes = self._notes(sample, n_tokens, scores)
            save()
        # float64 as stored: each use casts to the head outputs' own precision
        self.means = torch.from_numpy(state.head_means).to(self.model.device)
        self.chosen = [tuple(pair) for pair in state.notes["ablated"]]
        state.ablation_passes = self.surgery.reuse_note

    def _sample(self) -> list[int]:
        n = len(self.corpus.segments)
        if self.config.importance_sample is None or self.config.importance_sample >= n:
            return list(range(n))
        rng = np.random.default_rng([self.config.seed, SAMPLE_SALT])
        return sorted(rng.choice(n, size=self.config.importance_sample, replace=False).tolist())

    def _mean_pass(self, ranking: bool, should_stop):
        """Each head's mean output over the positions ablations replace in the sample, (layer, head, d_head) float64,
        the number of those positions, and with `ranking` the sample's AtP of mean ablation per head, (layer, head)."""
        model, cut = self.model, self.cut
        sample = self.sample
        encoded = encode(self.corpus, model, self.config.max_len, indices=sample, long=self.config.long)
        width = model.n_heads * cut.d_head
        sums = torch.zeros((model.n_layers, width), dtype=torch.float64)
        grads = torch.zeros_like(sums)  # sum of dT/dz over real positions
        products = torch.zeros((model.n_layers, model.n_heads), dtype=torch.float64)  # sum of z . dT/dz
        n_tokens = 0
        for _, inputs, labels, mask in self._batches(encoded, sample):
            if should_stop():
                raise SweepInterrupted(f"{model.name}: stopped during the importance mean pass")
            real = mask.bool()
            counted = replaced(real, self.config.ablate_first)  # the positions an ablation replaces
            run = self.surgery.run(inputs, mask, capture=True, grad=ranking)
            heads = [h.detach() for h in run.heads]
            for layer, z in enumerate(heads):
                sums[layer] += z[counted].double().sum(0).cpu()
            n_tokens += int(counted.sum())
            if ranking:
                total, _ = target_sums(self.target, run.output, tokens=inputs, real=real, labels=labels)
                gradients = torch.autograd.grad(total.sum(), run.heads, allow_unused=True)
                for layer, (z, g) in enumerate(zip(heads, gradients)):
                    g = torch.zeros_like(z) if g is None else g.detach()
                    grads[layer] += g[counted].double().sum(0).cpu()
                    products[layer] += (z * g)[counted].double().view(-1, model.n_heads, cut.d_head).sum((0, 2)).cpu()
            del run
        means = (sums / max(n_tokens, 1)).view(model.n_layers, model.n_heads, cut.d_head)
        scores = None
        if ranking:  # sum over the sample of (mean - z) . g = mean . sum(g) - sum(z . g)
            scores = (means * grads.view_as(means)).sum(-1) - products
        return means.numpy(), n_tokens, scores, sample

    def _notes(self, sample: list[int], n_tokens: int, scores: torch.Tensor | None) -> dict:
        """What the state keeps and the provenance records: target, means, masking, which heads are ablated."""
        model, config = self.model, self.config
        heads = [(layer, head) for layer in range(model.n_layers) for head in range(model.n_heads)]
        if config.importance != "ablate":
            ablated, rule = [], "none (importance='atp')"
        elif config.ablate_top is None:
            ablated, rule = heads, "every head"
        elif scores is None:
            ablated, rule = heads, (f"every head: ablate_top={config.ablate_top} ranks heads by |AtP|, which "
                                    f"{self.target} does not have")
        else:
            order = np.argsort(-np.abs(scores.numpy()).ravel(), kind="stable")[: config.ablate_top]
            ablated = sorted(heads[i] for i in order.tolist())
            rule = f"the {len(ablated)} heads of largest |atp_mean| over the sample (mean pass)"
        notes = {
            "target": self.target, "why": self.why, "methods": self.methods,
            "cut": self.cut.where,
            "sample": (f"all {len(sample):,} segments" if len(sample) == len(self.corpus.segments) else
                       f"{len(sample):,} of {len(self.corpus.segments):,} segments, drawn with seed {config.seed} "
                       f"(salt {SAMPLE_SALT})"),
            "means": f"each head's mean output over the {n_tokens:,} positions of the sample an ablation replaces",
            "sample_segments": len(sample), "sample_tokens": n_tokens,
            "ablated_heads": rule, "ablated": [list(pair) for pair in ablated],
            "ablate_first": config.ablate_first,
            "positions": ("the head's output is replaced at every real position, the first (BOS, [CLS]) included"
                          if config.ablate_first else
                          "the head's output is replaced at every real position but each segment's first (BOS, "
                          "[CLS]), which keeps its own; the target counts every real token"),
        }
        if "resample_ablation" in self.methods:
            notes["resample"] = (
                f"each segment's heads take the outputs of its donor at the same positions: one cycle through a "
                f"permutation of the sample drawn with seed {config.seed} (salt {DONOR_SALT}), so no segment is its "
                f"own donor; the head's mean stands in where the donor is shorter" if self.donor else
                "none: a sample of one segment has no other segment to take outputs from")
        if self.target == "masked_loss":
            notes["masking"] = {"rate": config.mask_rate, "mask_random_keep": list(MASK_SPLIT), "seed": config.seed,
                                "salt": MASK_SALT, "keyed_by": "segment index and window within it",
                                "maskable": "real tokens that are not special tokens"}
        if not self.atp:
            notes["atp"] = "none: the first-order change of hidden_change is 0 (the clean pass is its minimum)"
        return notes

    # --- batches ---------------------------------------------------------------------------------------------

    def _batches(self, encoded: EncodedCorpus, segments: list[int]):
        """(batch, input ids, labels or None, attention mask) on the model's device; masked-LM inputs are masked
        per sequence, keyed by its segment's index in the corpus (`segments[position]`) and its window in it."""
        model = self.model
        pad = model.special_token_ids["pad"]
        pad = pad if pad is not None else 0
        first: dict[int, int] = {}
        for sequence in range(len(encoded.token_ids)):
            first.setdefault(encoded.segment_of(sequence), sequence)
        for batch in batches(encoded, self.config.batch_size, pad):
            ids, mask, labels = batch.input_ids, batch.attention_mask, None
            if self.target == "masked_loss":  # drawn on each sequence's own tokens: padding changes nothing
                ids, labels = ids.clone(), torch.full_like(ids, -100)
                for row, sequence in enumerate(batch.index.tolist()):
                    tokens = list(encoded.token_ids[sequence])
                    owner = encoded.segment_of(sequence)
                    inputs, labelled = self._masked(tokens, segments[owner], sequence - first[owner])
                    ids[row, :len(tokens)] = torch.tensor(inputs)
                    labels[row, :len(tokens)] = torch.tensor(labelled)
                labels = labels.to(model.device)
            yield batch, ids.to(model.device), labels, mask.to(model.device)

    def _masked(self, tokens: list[int], segment: int, window: int) -> tuple[list[int], list[int]]:
        """A masked-LM sequence's inputs and labels, keyed by its segment's corpus index and its window in it."""
        model = self.model
        special = {i for i in model.special_token_ids.values() if i is not None}
        special |= set(getattr(model.tokenizer, "all_special_ids", []) or [])
        return mask_tokens(tokens, [t not in special for t in tokens], key=(self.config.seed, MASK_SALT, segment, window),
                           rate=self.config.mask_rate, mask_id=getattr(model.tokenizer, "mask_token_id", None),
                           vocab_size=model.vocab_size)

    def _donor_heads(self, recipients: list[tuple[int, int]], width: int) -> tuple[list, torch.Tensor] | None:
        """Every layer's head outputs on the donors of `recipients` ((segment, window) per batch row), as the sweep
        feeds them, on `width` positions: (batch, width, head * d_head) per layer, and (batch, width) where the
        donor has a real token. A donor with fewer windows gives its last; None without donors."""
        if not self.donor:
            return None
        model = self.model
        wanted = sorted({self.donor[segment] for segment, _ in recipients})
        encoded = encode(self.corpus, model, self.config.max_len, indices=wanted, long=self.config.long)
        windows: dict[int, list[int]] = {}
        for sequence in range(len(encoded.token_ids)):
            windows.setdefault(wanted[encoded.segment_of(sequence)], []).append(sequence)
        rows = []
        for segment, window in recipients:
            donor = self.donor[segment]
            index = min(window, len(windows[donor]) - 1)
            tokens = list(encoded.token_ids[windows[donor][index]])
            if self.target == "masked_loss":  # the donor as its own rows are fed: masked by its own key
                tokens = self._masked(tokens, donor, index)[0]
            rows.append(tokens)
        # each donor whole (an encoder's outputs depend on every token), then cut to the recipients' width
        pad = model.special_token_ids["pad"]
        ids = torch.full((len(rows), max(width, *map(len, rows))), pad if pad is not None else 0, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, tokens in enumerate(rows):
            ids[row, :len(tokens)] = torch.tensor(tokens)
            mask[row, :len(tokens)] = 1
        run = self.surgery.run(ids.to(model.device), mask.to(model.device), capture=True)
        return [h.detach()[:, :width] for h in run.heads], mask[:, :width].bool().to(model.device)

    def window(self, window: list[int], row_of: Callable[[int], int], n_units: int, device,
               should_stop: Callable[[], bool], advance: Callable[[int], object] | None = None):
        """The importance sums and counts of a window's segments in the sample, (layer, unit, head, importance
        column) float64 on `device`: `window` holds their corpus indices, `row_of(index)` each one's unit row.
        `advance(n)` after each batch of n sequences (a progress bar)."""
        model = self.model
        shape = (model.n_layers, n_units, model.n_heads, self.n_columns)
        sums = torch.zeros(shape, dtype=torch.float64, device=device)
        counts = torch.zeros_like(sums)
        segments = [index for index in window if index in self.sampled]
        if not segments:
            return sums, counts
        encoded = encode(self.corpus, model, self.config.max_len, indices=segments, long=self.config.long)
        first: dict[int, int] = {}  # each segment's first sequence (its windows follow it)
        for sequence in range(len(encoded.token_ids)):
            first.setdefault(encoded.segment_of(sequence), sequence)
        for batch, inputs, labels, mask in self._batches(encoded, segments):
            if should_stop():
                raise SweepInterrupted(f"{model.name}: stopped")
            owners = [encoded.segment_of(int(i)) for i in batch.index]
            recipients = [(segments[owner], int(i) - first[owner]) for owner, i in zip(owners, batch.index)]
            batch_sums, batch_counts = self._batch(inputs, labels, mask, recipients)  # (layer, batch, head, column)
            where = torch.tensor([row_of(segments[encoded.segment_of(int(i))]) for i in batch.index],
                                 dtype=torch.long, device=device)
            sums.index_add_(1, where, batch_sums.to(device))
            counts.index_add_(1, where, batch_counts.to(device))
            if advance is not None:
                advance(len(batch.index))
        return sums, counts

    def _batch(self, inputs: torch.Tensor, labels: torch.Tensor | None, mask: torch.Tensor,
               recipients: list[tuple[int, int]]):
        """One batch's importance sums and counts, (layer, batch, head, column) float64; `recipients` holds each
        row's (segment, window), for resample ablation's donors."""
        model, means = self.model, self.means
        real = mask.bool()
        counted = replaced(real, self.config.ablate_first)  # where ablations replace the head's output
        # None: every position, as `counted` is then the real tokens and padding is never read
        positions = None if self.config.ablate_first else counted
        b = inputs.shape[0]
        sums = torch.zeros((model.n_layers, b, model.n_heads, self.n_columns), dtype=torch.float64)
        counts = torch.zeros_like(sums)
        clean = self.surgery.run(inputs, mask, capture=True, grad=self.atp)
        base, count = target_sums(self.target, clean.output, tokens=inputs, real=real, labels=labels)  # (batch,) each
        if self.atp:
            gradients = torch.autograd.grad(base.sum(), clean.heads, allow_unused=True)
            zeros = torch.zeros_like(means[0])
            for layer, (z, g) in enumerate(zip(clean.heads, gradients)):
                z = z.detach()
                g = torch.zeros_like(z) if g is None else g.detach()
                for method, replacement in (("atp_mean", means[layer]), ("atp_zero", zeros)):
                    column = self.index[method]
                    sums[layer, :, :, column] = attribution(z, g, replacement, counted).double().cpu()
                    counts[layer, :, :, column] = count.detach().double().cpu()[:, None]
        output, residuals = clean.output.detach(), clean.residuals
        del clean  # the autograd graph goes; the residuals stay for the ablations
        with torch.no_grad():
            # the clean pass's own value, computed as an ablated one is: 0 for hidden_change, up to rounding
            base = target_sums(self.target, output, tokens=inputs, real=real, labels=labels, clean=output)[0]
            donated = self._donor_heads(recipients, inputs.shape[1]) if "resample_ablation" in self.index else None
            d = self.cut.d_head
            for layer, head in self.chosen:
                kinds = [("mean_ablation", means[layer, head]), ("zero_ablation", None)]
                if donated is not None:  # the donor's output where it has a token, else the head's mean
                    heads, reached = donated
                    own = heads[layer][..., head * d:(head + 1) * d]  # (batch, seq, d_head)
                    kinds.append(("resample_ablation", torch.where(reached[..., None], own,
                                                                   means[layer, head].to(own.device, own.dtype))))
                for method, value in kinds:
                    run = self.surgery.run(inputs, mask, replace=(layer, head, value), positions=positions,
                                           residuals=residuals)
                    ablated, _ = target_sums(self.target, run.output, tokens=inputs, real=real, labels=labels,
                                             clean=output)
                    column = self.index[method]
                    sums[layer, :, head, column] = (ablated - base).double().cpu()
                    counts[layer, :, head, column] = count.double().cpu()
        return sums, counts
