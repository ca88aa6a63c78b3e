"""The syntax baseline pass: on a corpus with gold words (CoNLL-U), the fixed-offset baseline's sums and counts
over the same words the heads are scored on (`headscan.metrics.syntax.offset_baseline`), shown beside each
head in the syntax table. Not bootstrapped: the baseline is a fixed rule, reported beside each head's interval."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...metrics import syntax
from .base import Pass, PassRun, sums_array

__all__ = ["BaselinePass", "BaselineState"]


@dataclass
class BaselineState:
    sums: np.ndarray  # (2, offset, syntax column): the baseline's sums and counts


class _BaselineRun(PassRun):
    def __init__(self, run, state: BaselineState):
        self.state, self.device = state, run.device
        self.totals = torch.from_numpy(state.sums).to(run.device)

    def begin_window(self) -> None:
        self.window = torch.zeros_like(self.totals)

    def after_batch(self, step) -> None:
        words = step.batch.words
        if words is not None:  # the fixed-offset baseline on the same words: one rule for the batch
            sums, counts = syntax.offset_baseline(words.to(self.device))  # (batch, offset, column)
            self.window += torch.stack([sums.sum(0), counts.sum(0)])

    def end_window(self) -> None:
        self.totals += self.window

    def store(self, last: bool = False) -> None:
        array = self.totals.cpu().numpy()
        self.state.sums = array if last else array.copy()


class BaselinePass(Pass):
    name = "baseline"
    tables = ("syntax",)

    def wanted(self, plan) -> bool:
        return plan.words

    def empty(self, plan, model) -> BaselineState:
        return BaselineState(np.zeros((2, len(syntax.BASELINE_OFFSETS), len(syntax.COLUMNS))))

    def open(self, run, state: BaselineState) -> PassRun:
        return _BaselineRun(run, state)

    def merge(self, states: list[BaselineState], names: list[str]) -> BaselineState:
        total = states[0].sums.copy()
        for state in states[1:]:
            total = total + state.sums  # same fingerprint, so the same shape
        return BaselineState(total)

    def save(self, state: BaselineState):
        return {}, {"sums": state.sums}

    def load(self, header: dict, arrays: dict) -> BaselineState:
        sums = sums_array(arrays["sums"], 3)
        if sums.shape[0] != 2:
            raise ValueError("its arrays do not fit together")
        return BaselineState(sums)

    def shape_frame(self, state: BaselineState, table: str, frame, family):
        if table != "syntax":
            return frame
        # the baseline among the offsets the model's queries can see
        return syntax.attach_baseline(frame, state.sums[0], state.sums[1], causal=family == "causal")

