"""One model's hooks: what each layer hands over in a forward pass, scored into per-segment sums as it comes.

`LayerHooks` is what a sweep attaches with `headscan.models.pattern_forward`: its `pattern` method gets each
layer's attention (or each block of its query rows, in chunked mode) and scores every column on it, its
`values`, `head_outputs` and `final_residual` methods keep what value weighting and direct logit attribution
need. What one batch gathers lives in a `Gathered`, begun by `LayerHooks.start` and handed over, as
(layer, batch, head, column) sums, counts and chance sums, by `LayerHooks.finish`.

Eager mode scores layers together: each layer's pattern waits in `Gathered.waiting` until the waiting patterns
reach `STACK_BYTES` (or the last layer, or a layer on another device, comes), and the waiting layers are then
scored as one batch, stacked along the batch axis. So does chunked mode where a layer's queries fit in one block
(ordinary lengths: `headscan.models.chunked.block_rows`); scored one layer at a time, minilm's chunked sweep
took 1.3 times eager's. Every metric is a function of each segment's rows alone, so stacking changes no score
beyond float32 rounding; it runs each metric's few dozen tensor operations, and their fixed cost, once per group
of layers (a minilm batch's pattern is about 1 MB, so that cost is a large part of each operation's).

Chance (`headscan.metrics.chance`): each column's null-head sums come with its sums, from the same batch and
queries. The null head of plain attention depends on the masks alone, not on the layer or the head, so its
sums are computed on the first layer of a batch (or each block of it) and reused for the others with the same
sliding window (a layer whose window hides keys is scored in a group of its own window); the value-weighted null
head and the null head of dla depend on each layer's values. This module does not read corpora or keep running
totals (see `headscan.scan.reduce`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

import torch

from ..config import SweepConfig
from ..metrics import METRICS, AttentionBatch, Metric, attended_logit, output_norm, syntax, values
from ..models import HookedModel
from ..models.chunked import BLOCK_BYTES, block_rows
from ..models.hooks import QueryBlock
from ..models.weights import logit_directions
from .batches import BatchMasks, attention_batch, batch_masks, output_batch, value_batch
from .budget import EAGER_LAYER_BYTES
from .plan import Column

__all__ = ["Gathered", "Capture", "LayerHooks", "STACK_BYTES", "capture_for"]

# Eager mode: layers' patterns wait, and are scored together, until they take this many bytes (as float32). The
# metrics' temporaries are a few times this, so it bounds the memory stacking adds; past a few MiB, larger
# groups save little time (each operation's fixed cost is already spread over enough work). The size of a
# chunked block, for the same reason: larger ones are page-faulted in anew on every operation (see BLOCK_BYTES).
STACK_BYTES = BLOCK_BYTES


@dataclass
class Gathered:
    """What one batch's forward pass gathers, layer by layer, until `LayerHooks.finish` hands it over."""

    masks: BatchMasks
    # (layer, ...) -> {(metric, table): (sums, counts, chance)}, each (layers * batch, head[, axis]): the layers
    # scored together (eager mode: a group of layers; chunked mode: one layer, its blocks added up)
    scored: dict = field(default_factory=dict)
    # (query_start, window) -> {(metric, table): the plain null head's sums}, shared by the layers of one window
    chance: dict = field(default_factory=dict)
    word_attention: dict = field(default_factory=dict)  # layer -> word attention summed over blocks (chunked syntax)
    norms: dict = field(default_factory=dict)  # layer -> (batch, head, k) value norms, before the layer's pattern
    contributions: dict = field(default_factory=dict)  # layer -> (2, batch, head, q) logit contributions, head's and null's
    output_norms: dict = field(default_factory=dict)  # layer -> (batch, head, q) ||z_q^h W_O^h||
    attended: dict = field(default_factory=dict)  # layer -> (batch, head, q) attended-token logit contributions
    # layer -> [(batch, q, head, d_head) attended directions of each block of query rows], until the layer's output
    attended_directions: dict = field(default_factory=dict)
    uniform: dict = field(default_factory=dict)  # layer -> (batch, q, head, d_head) the null head's output before W_O
    scale: torch.Tensor | None = None  # (batch, q) the final norm's scale, once the last layer has run
    waiting: list = field(default_factory=list)  # eager mode: (layer, pattern) not scored yet, scored together
    repeats: dict = field(default_factory=dict)  # times -> the masks repeated for that many stacked layers

    def masks_for(self, times: int) -> BatchMasks:
        """The batch's masks for `times` layers stacked along the batch axis, built once per batch and size."""
        if times not in self.repeats:
            self.repeats[times] = self.masks.repeated(times)
        return self.repeats[times]


@dataclass(frozen=True)
class Capture:
    """What weighting attention by values and attributing logits need, per layer, read once from the weights."""

    factors: list  # per layer, (head, d_head, d_head): `headscan.metrics.values.output_norm_factor` of W_O
    W_O: list  # per layer, (head, d_head, d_model)
    directions: torch.Tensor | None = None  # (d_model, vocab) logit directions; None: no dla
    final_norm: str | None = None  # "layer" or "rms"
    final_eps: float = 0.0


# AttentionBatch fields known only once a layer's output (or the last layer's residual) has come
_OUTPUT_FIELDS = {"logit_contributions", "output_norms", "attended_contributions"}


def _group_of(metric: Metric, table: str) -> str:
    """Which AttentionBatch a column is scored on: "attention", "value" (value-weighted) or "outputs" (the heads'
    outputs: dla, output_norm, attended_logit)."""
    if _OUTPUT_FIELDS & set(metric.needs):
        return "outputs"
    return "value" if table == "value" and metric.table != "value" else "attention"


def _score(batches: dict[str, AttentionBatch | None], columns: list[Column], given: dict | None = None,
           shared: dict | None = None, stacked: int = 1) -> dict:
    """The metrics of `columns` whose batch is in `batches` and carries what they need, on one layer (or one block
    of its queries): {(metric, table): (sums, counts, chance)}, each (batch, head[, axis]); chance is the null
    head's sums, (batch, 1[, axis]) where it is the same for every head, None where it cannot be computed.

    `given` maps a metric to sums, counts and chance computed elsewhere (the syntax metric in chunked mode);
    `shared` holds the plain null head's sums of this batch (or block), computed on the first layer that needs
    them and read by the others. With `stacked` layers in the batch (eager mode), the plain null head's sums are
    computed on the first layer's rows and repeated.
    """
    scored = {}
    for metric, table in dict.fromkeys((m, t) for m, _, t in columns):
        group = _group_of(metric, table)
        batch = batches.get(group)
        if given and metric in given:
            scored[metric, table] = given[metric]
        elif batch is not None and all(getattr(batch, name) is not None for name in metric.needs):
            sums, counts = metric.function(batch)
            plain = shared is not None and group == "attention" and not metric.needs  # the same for every layer
            if not plain:
                chance = metric.chance_sums(batch)
            else:
                if (metric, table) not in shared:
                    shared[metric, table] = metric.chance_sums(_first_layer(batch, stacked))
                chance = shared[metric, table]
                if chance is not None and stacked > 1:
                    chance = chance.repeat(stacked, *[1] * (chance.dim() - 1))
            scored[metric, table] = (sums, counts, chance)
    return scored


def _first_layer(batch: AttentionBatch, stacked: int) -> AttentionBatch:
    """The first of `stacked` layers stacked along the batch axis: its rows of every per-segment tensor (the
    plain null head reads the masks and tokens alone)."""
    if stacked == 1:
        return batch
    rows = batch.pattern.shape[0] // stacked
    words = None if batch.words is None else batch.words.map(lambda tensor: tensor[:rows])
    return dataclasses.replace(batch, pattern=batch.pattern[:rows], query_mask=batch.query_mask[:rows],
                               key_mask=batch.key_mask[:rows], tokens=batch.tokens[:rows],
                               sep_mask=batch.sep_mask[:rows], words=words, raw_pattern=None, value_norms=None,
                               key_weights=None)


def _add_scores(into: dict, scored: dict) -> dict:
    """Blocks of one layer's queries add up (chunked mode); a chance that cannot be computed stays None."""
    for key, (s, c, n) in scored.items():
        if key in into:
            s0, c0, n0 = into[key]
            into[key] = (s0 + s, c0 + c, None if n0 is None or n is None else n0 + n)
        else:
            into[key] = (s, c, n)
    return into


def _columns_tensor(scored: dict, columns: list[Column], batch: int, heads: int,
                    device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scores as (batch, head, column) sums, counts and chance sums (`batch`: rows, layers stacked); a column not
    scored (its internals were not captured) gets 0 and 0, so its value is NaN, and a chance that cannot be
    computed NaN."""
    sums, counts, chances = [], [], []
    for metric, table in dict.fromkeys((m, t) for m, _, t in columns):
        width = len([1 for m, _, t in columns if m is metric and t == table])
        shape = (batch, heads, width)
        if (metric, table) in scored:
            s, c, n = scored[metric, table]  # (batch, head[, axis]); n (batch, 1 or head[, axis]) or None
            sums.append(s if s.dim() == 3 else s[..., None])
            counts.append(c if c.dim() == 3 else c[..., None])
            n = torch.full(shape, torch.nan, device=device) if n is None else (n if n.dim() == 3 else n[..., None])
            chances.append(n.expand(shape))
        else:
            zeros = torch.zeros(shape, dtype=torch.float32, device=device)
            sums.append(zeros)
            counts.append(zeros)
            chances.append(torch.full(shape, torch.nan, device=device))
    # one concatenation (promoting float32 to float64: exact), then one move
    return tuple(torch.cat([part.to(device) for part in parts], -1).to(torch.float64) for parts in (sums, counts, chances))


class LayerHooks:
    """The hooks of one model's sweep, as methods, and what the batch in progress has gathered (`gathered`)."""

    def __init__(self, model: HookedModel, config: SweepConfig, columns: list[Column], capture: Capture | None,
                 words: bool, layers: tuple[int, ...] | None = None):
        self.model, self.config, self.columns, self.capture = model, config, columns, capture
        # the layers hooked and scored (`SweepPlan.layers`): `finish` hands over their sums, in this order
        self.layers = tuple(range(model.n_layers)) if layers is None else tuple(layers)
        self.weighted = any(table == "value" for _, _, table in columns)  # value-weighted columns wanted
        # the attended-token logit effect wanted, and its directions captured
        self.attended = (capture is not None and capture.directions is not None
                         and any("attended_contributions" in metric.needs for metric, _, _ in columns))
        self.syntax = METRICS["syntax"] if words else None  # scored over blocks of word attention in chunked mode
        self.gathered: Gathered | None = None
        self.similarity = None  # a `headscan.scan.similarity.SimilarityRun` when the sweep samples head similarity

    def patterns(self) -> dict:
        """The pattern hook of every layer, for `headscan.models.pattern_forward`."""
        return {layer: functools.partial(self.pattern, layer) for layer in self.layers}

    def internals(self) -> dict:
        """The hooks on other tensors of the pass (values, head outputs, the last residual), where captured."""
        found = {}
        if self.capture is not None:
            found["v"] = {layer: self.values for layer in self.layers}
            found["z"] = {layer: self.head_outputs for layer in self.layers}  # output norms at least
            if self.capture.directions is not None:
                # dla reads the final norm's scale: the pass runs to the last layer, swept or not
                found["out"] = {self.model.n_layers - 1: self.final_residual}
        return found

    def start(self, input_ids: torch.Tensor, real: torch.Tensor, words=None) -> None:
        """Begin a batch: (batch, seq) ids and real-token mask on the model's device, and its words (CoNLL-U)."""
        self.gathered = Gathered(batch_masks(input_ids, real, self.model, self.config, words))

    def _batches(self, pattern, layers: list[int], query_start: int = 0) -> dict:
        """The AttentionBatch of `layers` (their patterns stacked along the batch axis), with their value norms
        where captured, and its value-weighted twin."""
        norms = [self.gathered.norms.get(layer) for layer in layers]  # (batch, head, k) each, from the
        # layer's values: handed over before the pattern
        norms = None if any(n is None for n in norms) else norms[0] if len(norms) == 1 else torch.cat(norms)
        masks = self.gathered.masks_for(len(layers))
        batch = attention_batch(pattern, masks, self.model, self.config, query_start, norms,
                                 self._window(layers[0], pattern.shape[-1]))
        return {"attention": batch, "value": value_batch(batch) if self.weighted and norms is not None else None}

    def _window(self, layer: int, n_keys: int) -> int | None:
        """The layer's sliding window where it hides some of these `n_keys` keys from some query, else None (a
        window as long as the segment changes nothing, and every number stays that of full attention)."""
        window = self.model.window(layer)
        return window if window is not None and window < n_keys - 1 else None

    def _score_waiting(self) -> None:
        """Eager mode: score the layers whose patterns wait, together (see the module docstring)."""
        gathered = self.gathered
        waiting, gathered.waiting = gathered.waiting, []
        if not waiting:
            return
        layers = [layer for layer, _ in waiting]
        pattern = waiting[0][1] if len(waiting) == 1 else torch.cat([p for _, p in waiting])  # (layers * batch, ...)
        del waiting  # the layers' own patterns can go before scoring: the stacked copy holds them
        batches = self._batches(pattern, layers)
        shared = gathered.chance.setdefault((0, batches["attention"].window), {})
        scored = _score(batches, self.columns, shared=shared, stacked=len(layers))
        gathered.scored[tuple(layers)] = scored

    def pattern(self, layer: int, pattern, hook):  # `hook`: TransformerLens passes it by that name; a QueryBlock in chunked mode
        """Score every column on one layer's pattern, or on one block of its query rows (chunked mode)."""
        gathered, where = self.gathered, hook
        if not isinstance(where, QueryBlock) and pattern.numel() * 4 > EAGER_LAYER_BYTES:
            # eager, one layer past EAGER_LAYER_BYTES: scored as chunked mode scores it, over views of its query
            # rows, so that the metrics' temporaries (a masked copy, the value-weighted pattern, the syntax
            # products) are a block's and not several whole patterns' (smollm2 at 4k tokens: 6.0 GB, not 2.9)
            n_queries = pattern.shape[-2]
            rows = block_rows(self.config.query_chunk, *pattern.shape[:2], pattern.shape[-1], n_queries)
            for block_start in range(0, n_queries, rows):
                block_stop = min(block_start + rows, n_queries)
                self.pattern(layer, pattern[:, :, block_start:block_stop],
                             QueryBlock(layer, block_start, block_stop, n_queries))
            return None
        start = where.start if isinstance(where, QueryBlock) else 0
        if self.attended:  # u_q^h of these query rows, while the pattern is here; z comes after the pattern
            gathered.attended_directions.setdefault(layer, []).append(attended_logit.attended_directions(
                pattern, gathered.masks.counts, gathered.masks.ids, self.capture.W_O[layer], self._directions(pattern)))
        if self.similarity is not None:  # the pattern as handed over, in its own precision
            counts = gathered.masks.counts
            self.similarity.take(layer, pattern, counts[:, start: start + pattern.shape[-2]], counts, start)
        whole = not isinstance(where, QueryBlock) or (where.start == 0 and where.stop == where.n_queries)
        if whole:  # eager, or chunked with the layer in one block: the whole pattern, scored with the layers waiting
            waiting, size = gathered.waiting, pattern.numel() * 4  # bytes, as float32
            held = sum(p.numel() for _, p in waiting) * 4
            # a device map puts this layer elsewhere, it has another sliding window, or it would take the group
            # past STACK_BYTES: the group waiting is scored first (a group is never larger than STACK_BYTES or
            # one layer's pattern)
            n_keys = pattern.shape[-1]
            if waiting and (waiting[0][1].device != pattern.device or held + size > STACK_BYTES
                            or self._window(waiting[0][0], n_keys) != self._window(layer, n_keys)):
                self._score_waiting()
                held = 0
            gathered.waiting.append((layer, pattern))
            if layer == self.layers[-1] or held + size >= STACK_BYTES:
                self._score_waiting()
            return None  # the pattern goes on unchanged (it is only read, never written)
        # a layer waiting is scored before one that comes in blocks, so that every group holds consecutive layers
        # and `finish` can order the groups by their first layer
        self._score_waiting()
        # chunked, a layer in several blocks of query rows. Per-token metrics add up over blocks; the syntax metric
        # needs whole rows and columns of word attention, so its word attention is added up and scored at the last
        # block.
        scoring = self._batches(pattern, [layer], where.start)
        batch = scoring["attention"]
        given = {}
        if self.syntax is not None:
            words = gathered.masks.words
            raw = batch.pattern if batch.raw_pattern is None else batch.raw_pattern
            gathered.word_attention[layer] = syntax.add_word_rows(  # (batch, head, word, word), summed over blocks
                gathered.word_attention.get(layer), raw, words.token_word, words.n_words, where.start)
            if where.stop == where.n_queries:
                # from the words (and the window) alone: once per batch and window
                words_chance = gathered.chance.setdefault(("words", batch.window), {})
                if self.syntax not in words_chance:
                    words_chance[self.syntax] = self.syntax.chance_sums(batch)
                attention = gathered.word_attention.pop(layer)
                given[self.syntax] = (*syntax.accuracy_of(attention, words, causal=batch.causal),
                                      words_chance[self.syntax])
            else:
                zeros = torch.zeros((*pattern.shape[:2], len(syntax.columns(batch.causal))), dtype=torch.float32,
                                    device=pattern.device)
                given[self.syntax] = (zeros, zeros, zeros[:, :1])
        shared = gathered.chance.setdefault((where.start, batch.window), {})
        scored = _score(scoring, self.columns, given, shared=shared)
        gathered.scored[layer,] = _add_scores(gathered.scored[layer,], scored) if where.start else scored
        return None

    def values(self, v, layer: int) -> None:
        """(batch, k, kv_head, d_head) values, value bias included: handed over before the layer's pattern."""
        self.gathered.norms[layer] = values.value_norms(v, factor=self.capture.factors[layer])  # (batch, head, k)
        if self.capture.directions is not None:  # the null head's output, for dla's chance
            self.gathered.uniform[layer] = values.uniform_values(v, self.gathered.masks.counts.to(v.device),
                                                                 causal=self.model.causal, n_heads=self.model.n_heads,
                                                                 window=self._window(layer, v.shape[1]))

    def _directions(self, like: torch.Tensor) -> torch.Tensor:
        """The logit directions (d_model, vocab) on `like`'s device (a device map may put a layer elsewhere)."""
        directions = self.capture.directions
        return directions if directions.device == like.device else directions.to(like.device)

    def head_outputs(self, z, layer: int) -> None:
        """(batch, q, head, d_head): each head's output before W_O."""
        gathered = self.gathered
        gathered.output_norms[layer] = output_norm.head_output_norms(z, self.capture.factors[layer])  # (batch, head, q)
        if self.attended:
            blocks = gathered.attended_directions.pop(layer)  # the blocks of query rows, in order
            found = blocks[0] if len(blocks) == 1 else torch.cat(blocks, 1)  # (batch, q, head, d_head)
            gathered.attended[layer] = attended_logit.attended_contributions(z, found)  # (batch, head, q)
        if self.capture.directions is None:
            return
        both = torch.stack([z.to(gathered.uniform[layer].dtype), gathered.uniform.pop(layer)])
        gathered.contributions[layer] = values.logit_contributions(
            both, self.capture.W_O[layer], self._directions(z), gathered.masks.next_tokens.to(z.device))  # (2, batch, head, q)

    def final_residual(self, residual, layer: int) -> None:
        """(batch, q, d_model): the residual stream the final norm reads."""
        self.gathered.scale = values.final_norm_scale(residual, kind=self.capture.final_norm, eps=self.capture.final_eps)

    def finish(self, n: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """After the batch's pass: dla's columns scored (they need the final scale), then every swept layer's sums,
        counts and chance sums, (swept layer, batch, head, column) float64 on `device`, for the `n` sequences of the
        batch."""
        self._score_waiting()
        gathered = self.gathered
        for layers, scored in gathered.scored.items():  # the outputs' columns, for each group of layers at once
            if not all(layer in gathered.output_norms for layer in layers):
                continue
            norms = torch.cat([gathered.output_norms.pop(layer) for layer in layers])  # (L * batch, head, q)
            contributions = attended = scale = None
            if all(layer in gathered.contributions for layer in layers):
                contributions = torch.cat([gathered.contributions.pop(layer) for layer in layers], 1)  # (2, L * batch, head, q)
                scale = gathered.scale.to(norms.device).repeat(len(layers), 1)
            if all(layer in gathered.attended for layer in layers):
                attended = torch.cat([gathered.attended.pop(layer) for layer in layers])  # (L * batch, head, q)
            batch = output_batch(norms, contributions, attended, scale, gathered.masks_for(len(layers)), self.model,
                                  self.config)
            scored.update(_score({"outputs": batch}, self.columns))
        gathered.contributions, gathered.output_norms, gathered.attended = {}, {}, {}  # (batch, head, q) each: dropped
        # (layers * batch, head, column) per group; groups may sit on several devices under a device map
        groups = sorted(gathered.scored.items())
        per_group = [_columns_tensor(scored, self.columns, n * len(layers), self.model.n_heads, device)
                     for layers, scored in groups]
        return tuple(torch.cat([part[index].unflatten(0, (len(layers), n)) for (layers, _), part in zip(groups, per_group)])
                     for index in range(3))


def capture_for(model: HookedModel, config: SweepConfig, weights, unread: str | None) -> tuple[Capture | None, dict]:
    """What the sweep needs to weight attention by values and attribute logits, and provenance notes saying
    whether it was captured and how: (a `Capture` or None, {"values": ..., "dla": ...}). A model it cannot capture
    keeps its sweep: its value table and dla are NaN."""
    if not config.values:
        return None, {"values": "off (values=False)", "dla": "off (values=False)"}
    if model.path != "transformer_lens":
        why = ("not captured: this model is read through Hugging Face forward hooks (path hf_hooks), which hand over "
               "attention patterns but not values or head outputs; its value table and dla are NaN")
        return None, {"values": why, "dla": why}
    if weights is None:
        why = f"not captured: weights not read ({unread}); its value table and dla are NaN"
        return None, {"values": why, "dla": why}
    with torch.no_grad():
        W_O = weights.W_O.detach()  # (layer, head, d_head, d_model), the bridge's own (no norm folds into W_O)
        factors = [values.output_norm_factor(W_O[layer]).to(W_O.device) for layer in range(model.n_layers)]
        capture = Capture(factors, [W_O[layer] for layer in range(model.n_layers)])
        notes = {"values": "captured: value norms ||(x W_V + b_V) W_O^h|| of each layer's values as attention reads "
                           "them (blocks.{L}.attn.hook_v; value bias in, output bias out), W_O from the bridge; "
                           "head output norms ||z_q W_O^h|| from blocks.{L}.attn.hook_z (output_norm)"}
        if not model.causal:
            notes["dla"] = "not captured: a bidirectional model has no next-token logit"
        elif weights.untrained is not None:
            notes["dla"] = f"not captured: {weights.untrained}"
        elif weights.final_norm is None:
            notes["dla"] = f"not captured: no final norm before the unembedding that headscan represents ({weights.family})"
        else:
            directions = logit_directions(weights)  # (d_model, vocab)
            capture = dataclasses.replace(capture, directions=directions.T.contiguous().T,  # a token's direction: one row
                                          final_norm=weights.final_norm, final_eps=weights.final_eps)
            notes["dla"] = (f"captured: head outputs from blocks.{{L}}.attn.hook_z; W_U {weights.embedding} "
                            f"({weights.folded}); final {weights.final_norm} norm scale from "
                            f"blocks.{model.n_layers - 1}.hook_out, frozen; directions centred over the vocabulary")
    return capture, notes
