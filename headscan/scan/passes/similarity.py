"""The similarity pass: every pair of heads' Jensen-Shannon divergence over a seeded sample of segments (the
similarity table), and on a corpus with words each sampled segment's word-level attention, from which the heads of
two models of a run are compared (similarity_across). The sums themselves: `headscan.scan.similarity`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ...tables import TABLES, ModelProvenance, head_columns
from .. import budget
from ..similarity import SimilarityRun, across_sums, check_memory
from ..similarity import notes as sample_notes
from .base import Pass, PassRun, sums_array

__all__ = ["SimilarityPass", "SimilarityState", "similarity_frame", "across_frame"]


@dataclass
class SimilarityState:
    # (2, layer * head, layer * head): every pair's summed divergence over the sample's queries, and their number
    sums: np.ndarray
    # on a corpus with words, each sampled segment's word-level attention with its sink, segment -> (layer * head,
    # word, word + 1), float32 or float64
    word_attention: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)  # the rule and the sample, for the model's provenance


class _SimilarityRun(PassRun):
    def __init__(self, run, state: SimilarityState):
        model, config = run.model, run.plan.config
        check_memory(model.name, model.n_layers, model.n_heads, model.causal, config,
                     config.attention_budget or budget.default_budget_mib(str(model.device)))
        self.sample = SimilarityRun(len(run.corpus.segments), config, model.n_layers, model.n_heads, model.causal)
        run.layers.similarity = self.sample  # the pattern hooks hand it every layer of a batch (`take`)
        self.run, self.state = run, state
        self.totals = torch.from_numpy(state.sums).to(run.device)
        state.notes = sample_notes(config, self.sample.sample)

    def begin_window(self) -> None:
        self.window, self.words = torch.zeros_like(self.totals), {}

    def before_batch(self, step) -> None:  # the batch's rows from sampled segments, and those segments
        owners = [step.segments[step.encoded.segment_of(int(i))] for i in step.batch.index]
        rows = [row for row, owner in enumerate(owners) if owner in self.sample.sampled]
        self.sample.begin(rows, [owners[row] for row in rows], self.run.layers.gathered.masks.words)

    def after_batch(self, step) -> None:
        if (pair := self.sample.end(self.run.device)) is not None:
            self.window += torch.stack(pair)
            self.words.update(self.sample.words_kept)

    def end_window(self) -> None:
        self.totals += self.window
        self.state.word_attention.update(self.words)

    def store(self, last: bool = False) -> None:
        array = self.totals.cpu().numpy()
        self.state.sums = array if last else array.copy()


def similarity_frame(per_head: dict, similarity: np.ndarray, n_sampled: int) -> pd.DataFrame:
    """The similarity table of one model from its sums (2, layer * head, layer * head): every ordered pair of heads,
    the diagonal included, head i's columns first, head j's as ``other_*``; value = summed divergence / queries."""
    size = similarity.shape[-1]
    i, j = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")  # (head i, head j), flat over layer * head
    i, j = i.ravel(), j.ravel()
    head = {name: column if column is None or isinstance(column, str) else np.asarray(column)[i]
            for name, column in per_head.items()}
    sums, counts = similarity[0].ravel(), similarity[1].ravel()
    nan = float("nan")
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.where(counts > 0, sums / counts, nan)
    frame = pd.DataFrame(head | {
        "other_layer": np.asarray(per_head["layer"])[j], "other_head": np.asarray(per_head["head"])[j],
        "other_label": np.asarray(per_head["label"])[j], "value": value, "sum": sums, "count": counts,
        "ci_low": nan, "ci_high": nan, "units": float(n_sampled), "top_unit_share": nan, "n_eff": nan,
        "variance_df": nan, "thin": pd.NA, "chance": nan})
    return TABLES["similarity"].conform(frame)


def across_frame(states) -> pd.DataFrame | None:
    """similarity_across: every head of each model against every head of each later model of the sweep, over the
    word queries of the similarity sample both kept (`headscan.scan.similarity.across_sums`); None where fewer
    than two models kept word-level attention of the same texts (a shuffled-words control reads other texts)."""
    kept = [state for state in states if "similarity" in state.passes and state.passes["similarity"].word_attention
            and state.fingerprint["model"].get("control") != "shuffled-words"]
    frames = []
    for n, first in enumerate(kept):
        for second in kept[n + 1:]:
            a, b = ModelProvenance.from_json(first.model), ModelProvenance.from_json(second.model)
            sums, queries, segments = across_sums(first.passes["similarity"].word_attention,
                                                  second.passes["similarity"].word_attention,
                                                  causal="causal" in (a.family, b.family))
            frames.append(_across_rows(first, a, second, b, sums, queries, segments))
    if not frames:
        return None
    return TABLES["similarity_across"].conform(pd.concat(frames, ignore_index=True))


def _across_rows(first, a: ModelProvenance, second, b: ModelProvenance, sums: np.ndarray, queries: int,
                 segments: int) -> pd.DataFrame:
    (la, ha, _), (lb, hb, _) = first.sums.shape, second.sums.shape
    i, j = np.meshgrid(np.arange(la * ha), np.arange(lb * hb), indexing="ij")
    i, j = i.ravel(), j.ravel()
    group = ha // (a.n_kv_heads or ha)
    nan = float("nan")
    head = head_columns(a.name, a.family, i // ha, i % ha, (i % ha) // group)
    return pd.DataFrame(head | {
        "other_model": b.name, "other_layer": j // hb, "other_head": j % hb,
        "other_label": [f"L{layer}H{h}" for layer, h in zip(j // hb, j % hb)],
        "value": sums.ravel() / queries if queries else nan, "sum": sums.ravel(), "count": float(queries),
        "ci_low": nan, "ci_high": nan, "units": float(segments), "top_unit_share": nan, "n_eff": nan,
        "variance_df": nan, "thin": pd.NA, "chance": nan})


def _packed(word_attention: dict) -> dict:
    """Word-level attention per segment as two arrays for the .npz: (segment, heads, words, offset) rows and the
    flat values; nothing when there is none."""
    if not word_attention:
        return {}
    segments = sorted(word_attention)
    offsets = np.cumsum([0] + [word_attention[s].size for s in segments])
    index = np.array([[s, *word_attention[s].shape[:2], o] for s, o in zip(segments, offsets)], dtype=np.int64)
    return {"word_index": index.reshape(-1, 4),
            "word_values": np.concatenate([word_attention[s].ravel() for s in segments])}


def _unpacked(arrays: dict) -> dict:
    """`_packed`'s arrays back as segment -> (heads, words, words + 1); {} for a state without them."""
    if "word_index" not in arrays:
        return {}
    values = arrays["word_values"]
    return {int(segment): values[offset: offset + heads * words * (words + 1)].reshape(heads, words, words + 1)
            for segment, heads, words, offset in arrays["word_index"].tolist()}


class SimilarityPass(Pass):
    name = "similarity"
    tables = ("similarity", "similarity_across")

    def wanted(self, plan) -> bool:
        return plan.config.similarity_sample is not None

    def empty(self, plan, model) -> SimilarityState:
        size = model.n_layers * model.n_heads
        return SimilarityState(np.zeros((2, size, size)))

    def open(self, run, state: SimilarityState) -> PassRun:
        return _SimilarityRun(run, state)

    def merge(self, states: list[SimilarityState], names: list[str]) -> SimilarityState:
        first = states[0]
        total = SimilarityState(first.sums.copy(), dict(first.word_attention), dict(first.notes))
        for state in states[1:]:
            total.sums = total.sums + state.sums  # the same sample in every shard: its sums add up
            total.word_attention = total.word_attention | state.word_attention  # disjoint segments
        return total

    def save(self, state: SimilarityState):
        return {"notes": state.notes}, {"sums": state.sums, **_packed(state.word_attention)}

    def load(self, header: dict, arrays: dict) -> SimilarityState:
        sums = sums_array(arrays["sums"], 3)
        if sums.shape[0] != 2 or sums.shape[1] != sums.shape[2]:
            raise ValueError("its arrays do not fit together")
        return SimilarityState(sums, _unpacked(arrays), dict(header.get("notes") or {}))

    def frames(self, state: SimilarityState, per_head: dict) -> dict:
        return {"similarity": similarity_frame(per_head, state.sums, len(state.notes["segments"]))}

    def across(self, states) -> dict:
        across = across_frame(states)
        return {} if across is None else {"similarity_across": across}

    def notes(self, state: SimilarityState) -> dict:
        return {"similarity": state.notes}

