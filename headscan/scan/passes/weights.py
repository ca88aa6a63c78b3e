"""The weights pass: scores read off each head's weights alone (the OV copying score), once per model, into the
weights table. No corpus, so nothing is summed: a resumed sweep keeps the scores it read when it started, and
shards of one sweep all read the same weights."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...errors import HeadscanError
from ...models.weights import copying_scores, head_weights
from ...tables import TABLES
from .base import Pass, PassRun, join_axis, sums_array

__all__ = ["WeightsPass", "WEIGHT_METRICS", "WEIGHT_CHANCE", "WeightsState", "weights_frame", "read_weights"]

WEIGHT_METRICS = ("copying",)  # the rows of the weights table, in the order of WeightsState.scores
# Their chance (no corpus, so no null head): copying's is 0, the expected score of OV weights drawn with either
# sign equally likely (negating W_V negates every eigenvalue). The weights table's description says so.
WEIGHT_CHANCE = {"copying": 0.0}


@dataclass
class WeightsState:
    # (weight metric, layer, head); NaN where the architecture's weights could not be read (`note` says why);
    # (0, 0, 0) until read
    scores: np.ndarray
    embedding: str | None = None  # how the unembedding was taken: "tied", "untied"; None: not read
    note: str | None = None  # how the weights were taken, for the model's provenance


def read_weights(model):
    """Each head's weights (`headscan.models.weights.HeadWeights`), or None and why not. An architecture whose
    weights headscan cannot read costs its weights table, value table and dla (NaN, with the reason), not the
    sweep."""
    try:
        return head_weights(model), None
    except (HeadscanError, AttributeError, KeyError, RuntimeError, TypeError, ValueError) as error:
        return None, str(error)


def _weight_scores(model, weights, unread: str | None) -> tuple[np.ndarray, str | None, str]:
    """The weight-only scores of `model`, (weight metric, layer, head), how the embedding was taken ("tied",
    "untied"; None when the weights were not read) and a provenance note on how the weights were taken."""
    if weights is not None and weights.untrained is not None:
        unread = weights.untrained  # copying would read an unembedding the checkpoint never trained
    elif weights is not None:
        try:
            scores = copying_scores(weights).double().cpu().numpy()[None]
            return scores, weights.embedding, f"embedding {weights.embedding}; folded: {weights.folded}"
        except (HeadscanError, RuntimeError, ValueError) as error:  # e.g. an eigensolver that does not converge
            unread = str(error)
    embedding = weights.embedding if weights is not None else None
    return np.full((len(WEIGHT_METRICS), model.n_layers, model.n_heads), np.nan), embedding, f"not scored: {unread}"


def weights_frame(per_head: dict, scores: np.ndarray, embedding: str | None) -> pd.DataFrame:
    """The weights table of one model: `scores` (weight metric, layer, head) in the order of `WEIGHT_METRICS`,
    with nothing summed (sum, count and the interval NaN) and how the embedding was taken ("tied" or "untied")."""
    nan = float("nan")
    parts = [pd.DataFrame(per_head | {"metric": name, "value": scores[i].ravel(), "sum": nan, "count": nan,
                                      "ci_low": nan, "ci_high": nan, "units": nan, "top_unit_share": nan,
                                      "chance": WEIGHT_CHANCE.get(name, nan), "embedding": embedding})
             for i, name in enumerate(WEIGHT_METRICS)]
    return TABLES["weights"].conform(pd.concat(parts, ignore_index=True))


class WeightsPass(Pass):
    name = "weights"
    tables = ("weights",)

    def empty(self, plan, model) -> WeightsState:
        return WeightsState(np.zeros((0, 0, 0)))

    def open(self, run, state: WeightsState) -> PassRun:
        if not state.scores.size:  # a resumed state read the weights when it started
            state.scores, state.embedding, state.note = _weight_scores(run.model, run.head_weights, run.unread)
            state.scores = state.scores[:, list(run.plan.layers)]  # (weight metric, swept layer, head)
        return PassRun()

    def merge(self, states: list[WeightsState], names: list[str]) -> WeightsState:
        first = states[0]  # the same weights in every shard
        return WeightsState(first.scores.copy(), first.embedding, first.note)

    def join(self, states: list[WeightsState], order, names: list[str]) -> WeightsState:
        first = states[0]  # each head's scores are its own weights': the layers' rows join
        return WeightsState(join_axis([s.scores for s in states], 1, order), first.embedding, first.note)

    def save(self, state: WeightsState):
        return {"embedding": state.embedding, "note": state.note}, {"scores": state.scores}

    def load(self, header: dict, arrays: dict) -> WeightsState:
        return WeightsState(sums_array(arrays["scores"], 3), header.get("embedding"), header.get("note"))

    def frames(self, state: WeightsState, per_head: dict) -> dict:
        return {"weights": weights_frame(per_head, state.scores, state.embedding)} if state.scores.size else {}

    def notes(self, state: WeightsState) -> dict:
        return {"weights": state.note}

