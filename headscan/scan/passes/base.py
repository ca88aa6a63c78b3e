"""The pass interface: optional work a sweep does beside the pattern metrics, declared once and registered.

A *pass* (the weights table, the syntax baseline, head importance, head similarity, or one of your own) says

- whether a sweep runs it (`Pass.wanted`, from the `headscan.scan.plan.SweepPlan`) and its state when it starts
  (`Pass.empty`): a dataclass of its own, kept in ``PartialState.passes[name]``;
- what it does while the model runs (`Pass.open` returns a `PassRun`, which sees each batch before and after its
  forward pass and each window's end);
- how two shards' states add up (`Pass.merge`), how states of disjoint layers of one model join (`Pass.join`, for
  sweeps with ``layers``), and how a state is saved and read back (`Pass.save`, `Pass.load`:
  a JSON-able header and numpy arrays, stored in the partial state's ``.npz`` under the pass's name);
- the tables it writes (`Pass.frames`: one model's; `Pass.across`: over every model of the run), and what the
  model's provenance records about it (`Pass.notes`).

`register_pass` adds a pass to `PASSES`, in the order passes run and write; a name registered twice is refused.
The pattern metrics are registered the same way (`headscan.metrics.registry`). This module runs no model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from ...errors import ConfigError

if TYPE_CHECKING:
    from ...corpus import Corpus, EncodedCorpus
    from ...models import HookedModel
    from ..layers import LayerHooks
    from ..plan import SweepPlan
    from ..state import PartialState

__all__ = ["Pass", "PassRun", "SweepRun", "BatchStep", "PASSES", "register_pass", "sums_array", "join_axis"]


@dataclass
class SweepRun:
    """What a pass sees of one model's sweep in progress (`headscan.scan.reduce.accumulate` fills it)."""

    model: HookedModel
    corpus: Corpus
    plan: SweepPlan
    layers: LayerHooks  # the pattern hooks; a pass may read what they gathered for the batch
    device: torch.device  # where the running float64 sums live
    head_weights: Any  # `headscan.models.weights.HeadWeights`, or None where they could not be read
    unread: str | None  # why the weights were not read (None: they were)
    state: PartialState  # the whole state: for `save`, and the core counts
    should_stop: Callable[[], bool]
    save: Callable[[], None]  # saves the whole state now (nothing where the sweep keeps no partial state)
    bar: Any = None  # the progress bar (tqdm) or None


@dataclass
class BatchStep:
    """One batch of a window: `batch` (`headscan.corpus.Batch`) of `encoded`, whose segments are the corpus
    indices `segments` (the window's)."""

    batch: Any
    encoded: EncodedCorpus
    segments: list[int]


class PassRun:
    """A pass at work on one model: every hook does nothing unless overridden. Used as a context manager around
    the window loop; `store` hands running totals back to the pass's state (copies, unless `last`)."""

    moves_bar = False  # True: this pass moves the progress bar itself (the slow part of its sweep)

    def __enter__(self) -> PassRun:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def prepare(self) -> None:
        """Before the first window, inside the loop's stop handling (a long pass of its own may be stopped)."""

    def begin_window(self) -> None:
        """A window starts: its own sums start at zero."""

    def before_batch(self, step: BatchStep) -> None:
        """Before the batch's forward pass (the pattern hooks have started it)."""

    def after_batch(self, step: BatchStep) -> None:
        """After the batch's forward pass."""

    def fill(self, window, segments: list[int], units: list[int]) -> None:
        """After the window's pattern pass: add into `window` (`headscan.scan.reduce.Window`) what the pattern hooks
        do not fill; `segments` are its corpus indices, `units` each one's bootstrap unit."""

    def end_window(self) -> None:
        """The window finished: add its sums into the running totals."""

    def store(self, last: bool = False) -> None:
        """Write the running totals into the pass's state."""


class Pass:
    """A registered pass; see the module docstring. Subclasses set `name` and `tables` and override the rest."""

    name: str = ""
    tables: tuple[str, ...] = ()  # the tables `frames` writes or completes

    def wanted(self, plan: SweepPlan) -> bool:
        return True

    def empty(self, plan: SweepPlan, model: HookedModel):
        raise NotImplementedError

    def open(self, run: SweepRun, state) -> PassRun:
        return PassRun()

    def merge(self, states: list, names: list[str]):
        """The state of the whole corpus from the shards' states (same fingerprint), in shard order."""
        raise NotImplementedError

    def join(self, states: list, order: np.ndarray, names: list[str]):
        """The state of the model's layers from states of disjoint layers (same fingerprint but for ``layers``):
        each array's layer axes concatenated in the states' order, then taken in `order` (the layers sorted).
        A pass whose state relates heads across layers cannot be joined: it raises `TablesError` saying so."""
        from ...errors import TablesError

        raise TablesError(f"the {self.name} pass relates heads across layers, so runs of parts of the layers "
                          f"({', '.join(names)}) cannot be joined; sweep the whole model")

    def save(self, state) -> tuple[dict, dict[str, np.ndarray]]:
        raise NotImplementedError

    def load(self, header: dict, arrays: dict[str, np.ndarray]):
        """The state `save` wrote; raises ValueError (why, in a few words) for one that does not fit."""
        raise NotImplementedError

    def shape_frame(self, state, table: str, frame: pd.DataFrame, family: str | None) -> pd.DataFrame:
        """A score table of the model's, before it is conformed to its schema: completed or filtered."""
        return frame

    def frames(self, state, per_head: dict) -> dict[str, pd.DataFrame]:
        """Tables of one model made from the pass's state alone; `per_head` are the head columns."""
        return {}

    def across(self, states: list[PartialState]) -> dict[str, pd.DataFrame]:
        """Tables over every model of the run."""
        return {}

    def notes(self, state) -> dict:
        """What the model's provenance records about the pass."""
        return {}


PASSES: dict[str, Pass] = {}


def register_pass(one: Pass) -> Pass:
    """Add `one` to `PASSES` (after those there); refuses a name given twice or a pass without a name."""
    if not one.name or not one.name.replace("_", "").isalnum():
        raise ConfigError(f"a pass needs a name of letters, digits and _, got {one.name!r}")
    if one.name in PASSES:
        raise ConfigError(f"pass {one.name!r} is registered twice; pick another name (registered: "
                          f"{', '.join(PASSES)})")
    PASSES[one.name] = one
    return one


def join_axis(arrays: list[np.ndarray], axis: int, order: np.ndarray) -> np.ndarray:
    """`arrays` of disjoint layers concatenated along their layer `axis`, then taken in `order` (`Pass.join`).

    >>> join_axis([np.array([[0], [5]]), np.array([[2]])], 0, np.array([0, 2, 1])).ravel().tolist()
    [0, 2, 5]
    """
    return np.take(np.concatenate(arrays, axis), order, axis)


def sums_array(array: np.ndarray, ndim: int) -> np.ndarray:
    """A saved array of sums as the sweep adds into it: C-ordered float64 of `ndim` dimensions (ValueError else)."""
    if array.dtype.kind not in "fiub":
        raise ValueError(f"{array.dtype} not numbers")
    if array.ndim != ndim:
        raise ValueError("its arrays do not fit together")
    return np.asarray(array, dtype=np.float64, order="C")
